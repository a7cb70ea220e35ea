"""Which warm Python may serve a workload: its key, the interpreter, the installed stamps.

`core.warm_python` serves only requests whose key is its own; the key is computed by the
run that asks (before it starts one) from what a forked workload would share with a fresh
process: the interpreter (the path a workload names: a venv's ``bin/python``, never the
base Python every venv links to), the modules imported ahead and where they are installed,
the working directory, the warm Python's own source and the environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from core.safeio import read_bounded

__all__ = ["installed_stamps", "interpreter", "warm_key", "workload_module"]

# The warm Python's code: a child forked from an older one is not what this code would run.
_SOURCES = (Path(__file__).resolve(), Path(__file__).resolve().with_name("warm_python.py"))
# Variables no import reads: who runs it and where its records go (a test's, a run's own).
_NOT_KEYED_PREFIXES = ("TELLTALE_", "PREFECT_", "PYTEST_", "COV_CORE_")
_NOT_KEYED = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES", "PYTHONUNBUFFERED"})


def warm_key(python: str, modules: Sequence[str], cwd: str | Path,
             env: Mapping[str, str]) -> str:
    """What a warm Python must share with a request to serve it (a short digest).

    The interpreter, the modules imported ahead and where they are installed (their
    stamps: `installed_stamps`), the working directory (``python -m``'s ``sys.path[0]``),
    the warm Python's source, and the environment but for the variables no import reads
    (Telltale's and Prefect's own, the shell's bookkeeping).
    """
    keyed = sorted((k, v) for k, v in env.items()
                   if k not in _NOT_KEYED and not k.startswith(_NOT_KEYED_PREFIXES))
    source = hashlib.sha256(b"".join(read_bounded(path, 1 << 20, what=path.name)
                                     for path in _SOURCES)).hexdigest()
    text = json.dumps([interpreter(python), sorted(modules), str(Path(cwd).resolve()),
                       keyed, source, installed_stamps(modules, python)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def interpreter(python: str | os.PathLike[str]) -> str:
    """An interpreter's identity: its path as started, not its target.

    Every venv's ``bin/python`` links to the same base interpreter; what it imports is its
    venv's (``sys.prefix`` comes from the path it was started by), so two venvs are two
    interpreters.
    """
    return os.path.abspath(python)


def installed_stamps(modules: Sequence[str], python: str | None = None
                     ) -> list[tuple[str, str | None, int | None]]:
    """Where each preloaded top-level package is installed, and when its files were written.

    A warm Python keeps the torch it imported: after ``pip install`` of another torch, a
    child forked from it would train with the old one while the run records the new
    version. The stamp of each package's ``__init__`` (rewritten by every install) is part
    of the key, so an upgrade starts a new warm Python. Found without importing them: in
    this interpreter by `importlib.util.find_spec` of a top-level name (it reads the import
    path only); for another venv's ``python`` (the serving venv's), in that venv's
    ``lib/python*/site-packages`` (not found there: no stamp).
    """
    import importlib.util

    other = python is not None and interpreter(python) != interpreter(sys.executable)
    sites = sorted((Path(interpreter(python)).parent.parent / "lib").glob(
        "python*/site-packages")) if other and python is not None else []
    out: list[tuple[str, str | None, int | None]] = []
    for top in sorted({m.split(".", 1)[0] for m in modules}):
        origin: str | None = None
        if other:
            origin = next((str(f) for site in sites
                           for f in (site / top / "__init__.py", site / f"{top}.py")
                           if f.is_file()), None)
        else:
            try:
                spec = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                spec = None
            origin = spec.origin if spec is not None else None
        try:
            stamp = os.stat(origin).st_mtime_ns if origin else None
        except OSError:
            stamp = None
        out.append((top, origin, stamp))
    return out


def workload_module(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """``(module, args)`` of a ``PYTHON -m MODULE ARGS...`` command line, else None."""
    if len(argv) >= 3 and argv[1] == "-m" and Path(argv[0]).name.startswith("python"):
        return str(argv[2]), [str(a) for a in argv[3:]]
    return None
