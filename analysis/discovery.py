"""Find result dirs under a results tree (DESIGN §4).

A *result dir* holds ``settings.yaml`` and ``exit_code``. Rules:

- a dir with a ``skip`` file is hidden, but its children are still searched;
- settings merge from parent dirs down to the result dir (deeper wins), so a matrix root can
  hold the settings every cell shares;
- a dir with ``settings.yaml`` but a missing or non-integer ``exit_code`` is skipped with a
  recorded reason (it never aborts discovery);
- failed runs (non-zero ``exit_code``) are kept: they are parsed and reported.

Hidden dirs (``.git``...) are not searched.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from analysis.errors import ConfigError, ResultsError
from analysis.yamlio import load_yaml

__all__ = ["Discovery", "ResultDir", "SkippedDir", "discover", "read_exit_code"]

SETTINGS_FILE = "settings.yaml"
EXIT_CODE_FILE = "exit_code"
SKIP_FILE = "skip"


class ResultDir(BaseModel):
    """One run to parse."""

    path: str = Field(description="Absolute path of the result dir.")
    rel_path: str = Field(description="Path relative to the discovery root ('.' for the root).")
    settings: dict[str, Any] = Field(description="Settings merged from the parents (deeper wins).")
    exit_code: int = Field(description="The run's exit code (0: success).")


class SkippedDir(BaseModel):
    """A dir that looked like a result dir but could not be used."""

    path: str
    reason: str


class Discovery(BaseModel):
    """What `discover` found."""

    root: str
    results: list[ResultDir] = Field(default_factory=list)
    skipped: list[SkippedDir] = Field(default_factory=list)


_SMALL_FILE = 64 * 1024  # settings.yaml, exit_code: anything larger is not ours


def _unsafe(path: Path, limit: int) -> str | None:
    """Why ``path`` must not be read (a symlink, not a regular file, too large), or None."""
    st = os.lstat(path)  # FileNotFoundError goes to the caller
    if stat.S_ISLNK(st.st_mode):
        return f"{path.name} is a symlink: not followed"
    if not stat.S_ISREG(st.st_mode):
        return f"{path.name} is not a regular file"
    if st.st_size > limit:
        return f"{path.name} is {st.st_size} bytes (over {limit})"
    return None


def read_exit_code(path: Path) -> int | str:
    """Return the integer in ``path/exit_code``, or a reason string when it is unusable."""
    try:
        reason = _unsafe(path / EXIT_CODE_FILE, _SMALL_FILE)
        if reason:
            return reason
        text = (path / EXIT_CODE_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return "no exit_code file"
    except (OSError, UnicodeDecodeError) as exc:
        return f"unreadable exit_code: {exc}"
    try:
        return int(text)
    except ValueError:
        return f"exit_code is not an integer: {text[:40]!r}"


def _merge(parent: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(parent)
    for key, value in child.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def discover(root: str | Path) -> Discovery:
    """Walk ``root`` and return its result dirs, in sorted path order.

    Args:
        root: The results tree.

    Returns:
        The `Discovery`: usable result dirs and skipped ones with reasons.

    Raises:
        ResultsError: ``root`` does not exist or is not a directory.
    """
    base = Path(root).resolve()
    if not base.is_dir():
        raise ResultsError(f"results dir not found: {root}")
    found = Discovery(root=str(base))

    # Depth-first with an explicit stack: 1 500 nested dirs hit Python's recursion limit.
    # Children are pushed in reverse so they are visited in sorted order, as before.
    stack: list[tuple[Path, dict[str, Any]]] = [(base, {})]
    while stack:
        directory, inherited = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            found.skipped.append(SkippedDir(path=str(directory), reason=f"unreadable: {exc}"))
            continue
        names = {e.name for e in entries}
        settings = inherited
        if SETTINGS_FILE in names:
            data = _read_settings(directory, found)
            if isinstance(data, Mapping):
                settings = _merge(inherited, data)
                if SKIP_FILE not in names:
                    code = read_exit_code(directory)
                    rel = os.path.relpath(directory, base)
                    if isinstance(code, int):
                        found.results.append(ResultDir(path=str(directory), rel_path=rel,
                                                       settings=settings, exit_code=code))
                    else:
                        found.skipped.append(SkippedDir(path=str(directory), reason=code))
        stack.extend((Path(entry.path), settings) for entry in reversed(entries)
                     if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."))
    return found


def _read_settings(directory: Path, found: Discovery) -> Any:
    """The mapping in ``settings.yaml`` (untrusted: no symlink, bounded, no aliases)."""
    path = directory / SETTINGS_FILE
    try:
        reason = _unsafe(path, _SMALL_FILE)
        if reason is None:
            data, _ = load_yaml(path, untrusted=True)
            if data is None or isinstance(data, Mapping):
                return data
            reason = "settings.yaml is not a mapping"
    except ConfigError as exc:
        reason = exc.reason
    except OSError as exc:
        reason = f"unreadable settings.yaml: {exc}"
    found.skipped.append(SkippedDir(path=str(directory), reason=reason))
    return None
