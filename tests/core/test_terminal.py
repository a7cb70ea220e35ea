"""Text from input printed on a terminal: control and bidi characters escaped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.terminal import UNSAFE_CHARACTERS, printable


@given(text=st.text())
def test_printable_leaves_no_unsafe_character(text: str) -> None:
    shown = printable(text)
    assert not any(c in UNSAFE_CHARACTERS for c in shown)
    assert "\n" not in shown


@given(text=st.text(alphabet=st.characters(blacklist_characters=list(UNSAFE_CHARACTERS))))
def test_safe_text_is_unchanged(text: str) -> None:
    assert printable(text) == text


def test_escapes_are_visible() -> None:
    assert printable("a\x1b[2Jb\u202ec\x9b") == "a\\x1b[2Jb\\u202ec\\x9b"
    assert printable("one\ntwo\tx\x07", keep_newlines=True) == "one\ntwo\tx\\x07"


def test_registered_secrets_are_masked_as_whole_tokens_only() -> None:
    from core.redact import redact_bytes, redact_text, register_secret

    register_secret("s3cr3t-Token-42")
    register_secret("short")  # under the minimum length: never garbles other words
    assert redact_text("key=s3cr3t-Token-42;") == "key=***;"
    assert redact_text("xs3cr3t-Token-42") == "xs3cr3t-Token-42"  # part of another token
    assert redact_text("a short word") == "a short word"
    assert redact_bytes(b'"s3cr3t-Token-42"') == b'"***"'
