"""Text from input made safe to print on a terminal.

A PR comment, a results tree or a service answer can carry terminal escape sequences (ESC
``[2J`` clears the screen, OSC 8 makes links, OSC 52 writes the clipboard) and Unicode
bidirectional overrides (U+202E shows ``exe.txt`` for ``txt.exe``). Every line Telltale
prints from such input goes through `printable`, which shows those characters as visible
escapes (a backslash, ``x1b``; ``u202e``) instead of letting the terminal act on them.

`say` is the one printer of every command-line entry point: secrets masked
(`core.redact.redact_text`), then controls escaped. ``tests/test_terminal_audit.py``
fails on any other ``print``/``sys.stdout.write`` in the package (workload programs, whose
output is a log we parse, are listed there with their reason).
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, NoReturn

__all__ = ["ArgumentParser", "UNSAFE_CHARACTERS", "printable", "say"]

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


def say(text: object = "", *, error: bool = False, keep_newlines: bool = False) -> None:
    """Print text that may carry input (a PR value, a results tree, a service's answer).

    Registered secrets and credentials by shape are masked, and control and bidirectional
    characters are shown as escapes, so nothing a user typed can drive the terminal.

    Args:
        text: What to print (converted with ``str``); one line unless ``keep_newlines``.
        error: Print to standard error instead of standard output.
        keep_newlines: A block (a YAML document, a plan, a log tail): keep its newlines
            and tabs, still escaping every other control character.
    """
    from core.redact import redact_text  # the terminal module stays import-light

    print(printable(redact_text(str(text)), keep_newlines=keep_newlines),
          file=sys.stderr if error else sys.stdout, flush=error)


class ArgumentParser(argparse.ArgumentParser):
    """The argument parser of every command: one-line usage errors (exit 2), escaped output.

    Everything it prints (usage, help, errors that quote an argument) is escaped like `say`:
    argparse echoes a bad argument in its error message (``unrecognized arguments: …``), so
    a parser of its own would print input raw.
    """

    def error(self, message: str) -> NoReturn:
        """Say what is wrong in one line and exit 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _print_message(self, message: str, file: IO[str] | None = None) -> None:
        if message:
            from core.redact import redact_text

            (file or sys.stderr).write(printable(redact_text(message), keep_newlines=True))
