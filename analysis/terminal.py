"""Text from input made safe to print on a terminal.

A PR comment, a results tree or a service answer can carry terminal escape sequences (ESC
``[2J`` clears the screen, OSC 8 makes links, OSC 52 writes the clipboard) and Unicode
bidirectional overrides (U+202E shows ``exe.txt`` for ``txt.exe``). Every line Telltale
prints from such input goes through `printable`, which shows those characters as visible
escapes (a backslash, ``x1b``; ``u202e``) instead of letting the terminal act on them.
"""

from __future__ import annotations

__all__ = ["UNSAFE_CHARACTERS", "printable"]

_BIDI = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
UNSAFE_CHARACTERS: frozenset[str] = frozenset(
    chr(c) for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029, *_BIDI))
"""C0 and C1 controls (ESC, CSI, OSC among them), DEL, line separators, bidi controls."""

_KEEP_NEWLINES = UNSAFE_CHARACTERS - {"\n", "\t"}
_ESCAPES = {c: (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
            for c in UNSAFE_CHARACTERS}


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """Return ``str(text)`` with every unsafe character shown as a visible escape.

    Args:
        text: Anything; it is converted with ``str``.
        keep_newlines: Keep newlines and tabs (a log tail); otherwise they are escaped
            too, so one value stays on one line.

    Example:
        >>> printable(chr(27) + "[2J") == chr(92) + "x1b[2J"
        True
    """
    value = str(text)
    unsafe = _KEEP_NEWLINES if keep_newlines else UNSAFE_CHARACTERS
    if not any(c in unsafe for c in value):
        return value
    return "".join(_ESCAPES[c] if c in unsafe else c for c in value)
