"""The one classifier of secrets: key names in every style, credentials by shape in values.

Property-tested: a generated credential under a generated secret-looking key (snake, kebab,
camel, upper, dotted) or inside a URL (user info, a secret-named query or fragment
parameter) or an authorization header never survives `redact`/`redact_text`; generated
benign names (``max_tokens``, ``tokenizer``, ``secret_name``) are left alone.
"""

from __future__ import annotations

import base64
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from core.redact import REDACTED, is_secret_key, redact, redact_text, url_secrets

SECRET_WORDS = [["password"], ["passwd"], ["token"], ["secret"], ["api", "key"], ["apikey"],
                ["access", "key"], ["secret", "access", "key"], ["private", "key"],
                ["credentials"], ["auth", "token"], ["access", "token"], ["id", "token"],
                ["refresh", "token"], ["client", "secret"], ["bearer"], ["authorization"],
                ["signature"], ["cookie"], ["session", "key"]]
BENIGN = [["max", "tokens"], ["tokenizer"], ["secret", "name"], ["token", "count"],
          ["train", "tokens", "per", "second"], ["num", "input", "tokens", "seen"],
          ["secret", "ref"], ["api", "version"], ["key", "path"], ["author"],
          ["passes"], ["keys"], ["cookies", "enabled"], ["signature", "version"]]
PREFIXES = [[], ["hf"], ["x"], ["aws"], ["github"], ["my", "service"], ["opensearch"]]


def _style(words: list[str], style: str) -> str:
    if style == "snake":
        return "_".join(words)
    if style == "kebab":
        return "-".join(w.capitalize() for w in words)
    if style == "camel":
        return words[0] + "".join(w.capitalize() for w in words[1:])
    if style == "pascal":
        return "".join(w.capitalize() for w in words)
    return "_".join(words).upper()


STYLES = st.sampled_from(["snake", "kebab", "camel", "pascal", "upper"])
CREDENTIAL = st.text(string.ascii_letters + string.digits + "-_.~", min_size=12, max_size=40)


@given(prefix=st.sampled_from(PREFIXES), words=st.sampled_from(SECRET_WORDS), style=STYLES,
       dotted=st.booleans())
def test_a_secret_named_key_is_one_in_every_style(prefix: list[str], words: list[str],
                                                  style: str, dotted: bool) -> None:
    key = _style(prefix + words, style)
    assert is_secret_key(f"a.b.{key}" if dotted else key), key


@given(prefix=st.sampled_from(PREFIXES), words=st.sampled_from(BENIGN), style=STYLES)
def test_a_benign_name_is_not_a_secret(prefix: list[str], words: list[str], style: str) -> None:
    key = _style(prefix + words, style)
    assert not is_secret_key(key), key


@settings(max_examples=200)
@given(prefix=st.sampled_from(PREFIXES), words=st.sampled_from(SECRET_WORDS), style=STYLES,
       secret=CREDENTIAL, depth=st.integers(0, 3))
def test_a_value_under_a_secret_key_never_survives_a_sink(
        prefix: list[str], words: list[str], style: str, secret: str, depth: int) -> None:
    doc: dict = {_style(prefix + words, style): secret}
    for level in range(depth):
        doc = {f"level{level}": doc, "items": [doc]}
    out = repr(redact(doc))
    assert secret not in out and REDACTED in out


@settings(max_examples=200)
@given(secret=CREDENTIAL, words=st.sampled_from(SECRET_WORDS), style=STYLES,
       where=st.sampled_from(["query", "fragment", "userinfo", "user", "bearer", "basic"]),
       before=st.sampled_from(["", "see ", "url: ", '{"u": "']))
def test_a_credential_inside_a_url_or_header_never_survives(
        secret: str, words: list[str], style: str, where: str, before: str) -> None:
    name = _style(words, style)
    text = {
        "query": f"https://h.example/p?a=1&{name}={secret}&b=2",
        "fragment": f"https://h.example/cb#{name}={secret}",
        "userinfo": f"https://someone:{secret}@h.example/x",
        "user": f"https://{secret}@github.com/org/repo.git",
        "bearer": f"Authorization: Bearer {secret}",
        "basic": "authorization: basic " + base64.b64encode(f"u:{secret}".encode()).decode(),
    }[where]
    if where == "basic":
        secret = text.rsplit(" ", 1)[-1]
    elif where == "bearer" and secret.isalpha():
        secret += "1"  # a token has a digit or a symbol; 'Bearer authentication' is prose
        text += "1"
    masked = redact_text(before + text + " trailing")
    assert secret not in masked, masked
    assert secret in url_secrets(text)


@given(name=st.sampled_from(BENIGN), style=STYLES,
       value=st.text(string.ascii_letters + string.digits, min_size=1, max_size=20))
def test_a_benign_query_parameter_is_kept(name: list[str], style: str, value: str) -> None:
    text = f"https://h.example/p?{_style(name, style)}={value}"
    assert redact_text(text) == text


def test_saved_config_and_lts_payload_hold_no_token_by_other_names(tmp_path) -> None:
    """The sinks a config goes to: config.yaml (dump_yaml) and a document (redact)."""
    from core.yamlio import dump_yaml

    doc = {"endpoint_url": "https://s3.example/b?access_token=tok-aaaaaaaaaaaa",
           "headers": {"X-Api-Key": "key-bbbbbbbbbbbb", "hf-token": "hf-cccccccccccc",
                       "accessToken": "acc-dddddddddddd"},
           "callback": "https://h.example/cb#id_token=idt-eeeeeeeeeeee",
           "git": "https://ghp-ffffffffffff@github.com/org/repo"}
    text = dump_yaml(doc)
    document = repr(redact(doc))
    for secret in ("tok-aaaaaaaaaaaa", "key-bbbbbbbbbbbb", "hf-cccccccccccc",
                   "acc-dddddddddddd", "idt-eeeeeeeeeeee", "ghp-ffffffffffff"):
        assert secret not in text and secret not in document, secret


def test_prose_about_authentication_is_left_alone() -> None:
    for text in ("basic authentication is off", "Bearer authentication needs a token",
                 "a basic configuration", "see the Basic Auth docs"):
        assert redact_text(text) == text


def test_restore_forgets_the_secrets_registered_since() -> None:
    from core.redact import known_secrets, redact_text, register_secret, restore_secrets

    before = known_secrets()
    register_secret("Kept-apart-1234")
    assert redact_text("x Kept-apart-1234 y") == "x *** y"
    restore_secrets(before)
    assert redact_text("x Kept-apart-1234 y") == "x Kept-apart-1234 y"
    assert known_secrets() == before
