"""Every command answers ``--help`` (and its usage errors) without importing Prefect or pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Each command's --help, in a child forked per command (a fresh `sys.modules` each, without
# paying an interpreter start per command). Exit 3: Prefect was imported; 4: --help raised.
_HELP_PROBE = """
import os, runpy, sys
import flows.cli, projects.registry  # light, shared by every command: imported once here
assert not {"prefect", "pandas", "pyarrow"} & set(sys.modules)
heavy = []
for command in sys.argv[1:]:
    name, *words = command.split()
    pid = os.fork()
    if pid == 0:
        sink = os.open(os.devnull, os.O_WRONLY)
        os.dup2(sink, 1)
        os.dup2(sink, 2)
        sys.argv = [name, *words, "--help"]
        try:
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        except SystemExit:
            pass
        except BaseException:
            os._exit(4)
        os._exit(3 if "prefect" in sys.modules else
                 5 if {"pandas", "pyarrow"} & set(sys.modules) else 0)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code:
        why = {3: "imports Prefect", 5: "imports pandas"}.get(code, "failed")
        heavy.append(f"{command} ({why})")
print("; ".join(heavy))
"""


def _commands() -> list[str]:
    """The documented ``python -m`` commands (`deployments.reference.CLI_COMMANDS`, with
    their subcommands) and every runnable module of ``flows/``."""
    from deployments.reference import CLI_COMMANDS

    root = Path(__file__).resolve().parents[2]
    found = {" ".join(argv[2:-1]) for _, argv in CLI_COMMANDS if argv[1:2] == ["-m"]}
    for path in (root / "flows").rglob("*.py"):
        if 'if __name__ == "__main__":' in path.read_text():
            parts = path.relative_to(root).with_suffix("").parts
            found.add(".".join(parts[:-1] if parts[-1] == "__main__" else parts))
    return sorted(found)


def test_every_commands_help_answers_without_importing_prefect_or_pandas() -> None:
    """``--help`` (and so every usage error, found while parsing) must not wait 2-4 s for
    Prefect, or ~1 s for pandas and pyarrow: a command keeps its flows in a module of its
    own and imports it once its arguments are usable (`flows.cli.lazy_exports`), and
    ``python -m analysis`` imports its pipeline after parsing. cleanup, replot and compare
    took 7 s; ``python -m analysis --help`` 1.25 s (0.39 s now)."""
    commands = _commands()
    assert {"flows.cleanup", "flows.replot", "flows.compare", "flows.fine_tuning",
            "analysis compare", "deployments.rbac"} <= set(commands), commands
    proc = subprocess.run([sys.executable, "-c", _HELP_PROBE, *commands], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "", proc.stdout
