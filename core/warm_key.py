"""Which warm Python may serve a workload: its key, the interpreter, the installed stamps.

`core.warm_python` serves only requests whose key is its own; the key is computed by the
run that asks (before it starts one) from what a forked workload would share with a fresh
process: the interpreter (the path a workload names: a venv's ``bin/python``, never the
base Python every venv links to), the modules imported ahead and where they are installed,
the working directory, the warm Python's own source and the environment. A command line's
warm Python (`core.warm_command`), which keeps Telltale's own modules too, is also keyed by
the stamps of that code (`code_stamps`) and by every variable.

Standard library only: a command line computes a key before it imports anything heavy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import site
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

__all__ = ["SHELL_BOOKKEEPING", "WARM_DIR", "CodeRoot", "code_locations", "code_stamps",
           "installed_stamps", "interpreter", "socket_path", "warm_key", "workload_module"]

WARM_DIR = "telltale-warm-python"
"""The folder of a user's warm Pythons, one dir per key, beside the local services' state."""
_SOCKET = "sock"
_MAX_SOURCE = 1 << 20

# The warm Python's code: a child forked from an older one is not what this code would run.
_SOURCES = tuple(Path(__file__).resolve().with_name(name) for name in
                 ("warm_key.py", "warm_python.py", "warm_command.py"))
# Variables no import reads: who runs it and where its records go (a test's, a run's own),
# and AWS's, which boto and botocore read when a session or client is made — at run time, in
# the child, which has the run's own environment. Keyed, a rotated session token or another
# endpoint was another warm Python (the suite's S3 tests: three more, ~5 CPU-s each).
_NOT_KEYED_PREFIXES = ("TELLTALE_", "PREFECT_", "PYTEST_", "COV_CORE_", "AWS_")
_NOT_KEYED = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES", "PYTHONUNBUFFERED"})
SHELL_BOOKKEEPING = frozenset({
    "_", "OLDPWD", "PWD", "SHLVL", "COLUMNS", "LINES", "HISTFILE", "PS1", "PS2", "WINDOWID",
    "TERM_SESSION_ID", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", "TMUX",
    "TMUX_PANE", "STY", "XDG_SESSION_ID", "XDG_VTNR", "DISPLAY", "WAYLAND_DISPLAY"})
"""Variables a shell or terminal sets for itself, never read by Telltale's code or an import
(relative paths are keyed as given and made absolute): left out of the keys of whatever
depends on the whole environment (a post-processing's memo, a command line's warm Python),
so that the same command from another terminal or directory still matches."""
_SKIP_IN_CODE = frozenset({"__pycache__"})
CodeRoot = tuple[str, Path, bool]
"""A location of code: (name, path, walk): ``walk`` False stamps the path itself only."""


def warm_key(python: str, modules: Sequence[str], cwd: str | Path,
             env: Mapping[str, str], *, code: Sequence[CodeRoot] | None = None) -> str:
    """What a warm Python must share with a request to serve it (a short digest).

    The interpreter, the modules imported ahead and where they are installed (their
    stamps: `installed_stamps`), the working directory (``python -m``'s ``sys.path[0]``),
    the warm Python's source, and the environment but for the variables no import reads
    (Telltale's and Prefect's own, AWS's, the shell's bookkeeping).

    With ``code`` (a warm Python that keeps Telltale's modules: `core.warm_command`), also
    the stamps of that code (`code_stamps` of `code_locations`), and every variable but
    the shell's bookkeeping: kept modules were imported under the warm Python's
    environment, and an edited file must never run as it was.
    """
    kept = code is not None
    keyed = sorted((k, v) for k, v in env.items() if (
        k not in SHELL_BOOKKEEPING if kept else
        k not in _NOT_KEYED and not k.startswith(_NOT_KEYED_PREFIXES)))
    digest = hashlib.sha256()
    for path in _SOURCES:
        with open(path, "rb") as source:  # our own code, never a tree's file
            digest.update(source.read(_MAX_SOURCE))
    text = json.dumps([interpreter(python), sorted(modules), str(Path(cwd).resolve()),
                       keyed, digest.hexdigest(), installed_stamps(modules, python),
                       code_stamps(code) if kept else None])
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def code_locations() -> list[CodeRoot]:
    """The code a Telltale command runs, as `CodeRoot` s.

    This checkout's packages (``analysis``, ``core``, ``projects``), its installed metadata
    (``*.egg-info``: its entry points name the registered projects), and each site-packages
    dir itself (an install or a removal changes its stamp). What the post-processing memo
    (`analysis.memo`) witnesses of the code, and what keys a command line's warm Python.
    """
    here = Path(__file__).resolve().parent.parent
    roots: list[CodeRoot] = [(f"code:{name}", here / name, True)
                                           for name in ("analysis", "core", "projects")]
    roots += [(f"code:{p.name}", p, True) for p in sorted(here.glob("*.egg-info"))]
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    roots += [(f"site:{i}", Path(p), False) for i, p in enumerate(folders)]
    return roots


def code_stamps(roots: Sequence[CodeRoot]) -> str:
    """A digest of the stamps of every file and dir under ``roots``.

    A stamp: mode, size, mtime and inode. ``__pycache__`` aside; a root not walked, a file
    or absent: its own stamp.
    """
    digest = hashlib.sha256()
    for _, top, walk in roots:
        pending = [str(top)]
        while pending:
            folder = pending.pop()
            try:
                st = os.lstat(folder)
            except OSError:
                digest.update(f"{folder}\0-\n".encode("utf-8", "surrogateescape"))
                continue
            digest.update(f"{folder}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0"
                          f"{st.st_ino}\n".encode("utf-8", "surrogateescape"))
            if not walk or not os.path.isdir(folder) or os.path.islink(folder):
                continue
            try:
                with os.scandir(folder) as entries:
                    found = sorted(entries, key=lambda e: e.name)
            except OSError:
                continue
            for entry in found:
                if entry.name in _SKIP_IN_CODE:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                digest.update(f"{entry.path}\0{st.st_mode}\0{st.st_size}\0"
                              f"{st.st_mtime_ns}\0{st.st_ino}\n".encode(
                                  "utf-8", "surrogateescape"))
    return digest.hexdigest()


@contextlib.contextmanager
def socket_path(directory: Path) -> Iterator[str]:
    """A short path to ``directory``'s socket, through an open fd (``/proc/self/fd/N/``).

    A Unix socket's path holds at most 107 bytes; a user's home can be longer.
    """
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{_SOCKET}"
    finally:
        os.close(fd)


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
