"""Text from input printed on a terminal: control and bidi characters escaped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from analysis.terminal import UNSAFE_CHARACTERS, printable


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
