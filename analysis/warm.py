"""What a warm Python imports ahead for ``python -m analysis`` (`core.warm_command`).

A warm Python imports this module once, then forks a child per command line: Arrow's
allocator is chosen first, before pyarrow is imported (`analysis.arrow_memory`, as the
command itself does), then the modules the post-processing and every subcommand import,
then each registered project's hooks (`analysis.project.load_project`: their modules and
the project's defaults, read from its code). Importing it anywhere else is never needed.
"""

from __future__ import annotations

import contextlib
import importlib

from analysis.arrow_memory import use_system_allocator

__all__ = ["MODULES", "preload"]

MODULES = ("analysis.cli", "analysis.pipeline", "analysis.report_index", "analysis.compare",
           "analysis.listing", "analysis.lts", "analysis.memo", "analysis.run_analysis",
           "analysis.discovery", "analysis.parsing", "analysis.settings")


def preload() -> None:
    """Import what a command line imports, in the order it does."""
    use_system_allocator()
    for name in MODULES:
        importlib.import_module(name)
    from analysis.discovery import available_projects
    from analysis.project import load_project
    from core.errors import ResultsError

    for name in available_projects():
        with contextlib.suppress(ResultsError, ImportError):  # the command says why
            load_project(name)


preload()
