"""``python -m analysis``: the command line (`analysis.cli`), served warm when it can be.

A warm Python left by an earlier command line with the same key (`core.warm_command`: the
code's and the packages' stamps, the working directory, the environment) runs it in a
forked child, its imports already done; otherwise this process runs it and leaves one for
the next. Nothing is imported here before that choice but the standard library and
`core.warm_command`. ``TELLTALE_WARM_COMMAND_MINUTES=0``: always a fresh interpreter.
"""

from __future__ import annotations

import os
import sys

from core.exit import exit_now
from core.warm_command import IN_WARM_CHILD, command_key, plain_command, served_warm

PRELOAD = ("analysis.warm",)
"""What a command line's warm Python imports ahead (`analysis.warm`)."""

if __name__ == "__main__":
    key = None  # in a warm Python's child, or with interpreter options: here, none left
    if not IN_WARM_CHILD and plain_command("analysis"):
        key = command_key(PRELOAD)
        code = served_warm(key, "analysis", sys.argv[1:])
        if code is not None:
            exit_now(code)
    from analysis.cli import run_here

    run_here(key, PRELOAD, dict(os.environ), os.getcwd())
