"""The command line every generated file under deployments/ shares: print it, or check it.

python -m deployments.<module> > deployments/<file>   # regenerate
python -m deployments.<module> --check                # exit 1 when stale
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from core.terminal import ArgumentParser, say

__all__ = ["generated_main"]


def generated_main(module: str, target: Path, render: Callable[[], str], what: str,
                   argv: Sequence[str] | None = None) -> int:
    """Print ``render()``, or with ``--check`` compare it with ``target`` (exit 1 if stale)."""
    parser = ArgumentParser(prog=f"python -m {module}", description=f"Generate {what}.")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 when {target.name} differs from the generated text")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = target.read_text(encoding="utf-8") if target.is_file() else ""
        if current != text:
            say(f"{target} is stale: run python -m {module} > deployments/{target.name}",
                  error=True)
            return 1
        return 0
    say(text.rstrip("\n"), keep_newlines=True)
    return 0
