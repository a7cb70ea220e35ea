"""The post-processing memo: an unchanged tree answers from the outputs it already made.

``python -m analysis`` on a tree it has already post-processed into the same ``--out`` reads
the same files and writes the same outputs; on 1 000 warm result dirs that was ~1.4 s, most
of it importing pandas and pyarrow and re-deriving each run's KPIs from its parse cache. The
memo, ``<out>/.telltale_memo``, lets it answer in a fraction of that when nothing it
depends on changed, the way ``make`` skips a target whose inputs are older than it.

What it witnesses (a *stamp* is an entry's mode, size, mtime, ctime and inode, from
``lstat``; nothing is read):

- every entry under the results tree (files, dirs, links; hidden ones too), ``--out``
  excepted when it lies inside the tree: a dir's stamp changes whenever an entry is added,
  removed or renamed in it, so an unchanged stamp of every recorded dir means no new entry
  anywhere, and an unchanged stamp of every file means no file changed;
- a local ``--history`` the same way (an ``s3://`` history is never memoised);
- the code: every file of the ``analysis``, ``core`` and ``projects`` packages (``__pycache__``
  aside) and of this checkout's ``*.egg-info`` (its entry points name the projects), and the
  stamp of each site-packages dir (an install or removal changes it);
- the outputs under ``--out``, as this command left them (a deleted or edited report is made
  again);
- the key: the command's arguments (paths made absolute), the whole environment (hashed,
  never stored) and the Python that runs it.

A memo is written only by a run that saw the tree, the history and the code the same before
and after it, with every stamp over `SETTLED_NS` old when it began: a writer that changed
a file during the run, or within one timestamp tick of its stamps (coarse file-system
clocks, a skewed NFS server), leaves no memo to be trusted. So the run that parses a tree
cold (it writes the parse caches into it) leaves none; the next one does. A run that appends
to a history changes it, so it is always analysed again (``--no-append`` memoises). A run
that fails, or is stopped, leaves no memo: the old one is removed before any output is
written. ``--force`` ignores it.

``tests/analysis/test_memo.py`` mutates generated trees every way an entry can change and
fails when the memo still answers; its audit runs a post-processing with Python's audit
hooks on and fails when it opens or lists anything outside what this memo witnesses.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from core.forked import Beside, Handoff, beside, can_fork
from core.redact import redact_bytes
from core.safeio import RefusedInput, atomic_open, open_stream
from core.warm_key import SHELL_BOOKKEEPING, code_locations

__all__ = ["MEMO_FILE", "SETTLED_NS", "Before", "Listings", "Root", "answer", "code_roots",
           "forget", "key_of", "record", "stamps_hold", "take_stamps"]

MEMO_FILE = ".telltale_memo"
SETTLED_NS = 1_000_000_000
"""A stamp newer than this (before the run began) is not trusted to have settled."""
_FORMAT = 1
_MAX_BYTES = 1 << 30  # a memo larger than this is not ours

Stamp = tuple[int, int, int, int, int]  # mode, size, mtime_ns, ctime_ns, inode
Root = tuple[str, Path, bool]
"""A witnessed root: (name, path, walk): ``walk`` False stamps the path itself only."""

_SKIP_IN_CODE = frozenset({"__pycache__"})
def _stamp_of(st: os.stat_result) -> Stamp:
    return st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _stamp(path: str) -> Stamp | None:
    try:
        return _stamp_of(os.lstat(path))
    except OSError:
        return None


def _named(roots: Sequence[Root]) -> list[list[Any]]:
    """The roots as a memo's header records them."""
    return [[name, str(path), walk] for name, path, walk in roots]


def key_of(parts: Mapping[str, Any]) -> str:
    """The memo's key: a hash of the command's parts, the environment and the Python."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"format": _FORMAT, "parts": parts, "python": sys.version,
                              "executable": sys.executable}, sort_keys=True,
                             default=str).encode())
    # the whole environment, hashed: a TELLTALE_* setting, the AWS and Prefect variables,
    # the locale, anything the run or its libraries could read (its values are never
    # written anywhere); only the shell's and terminal's own bookkeeping is left out, so the
    # same command from another terminal or directory still matches
    for name, value in sorted(os.environ.items()):
        if name in SHELL_BOOKKEEPING:
            continue
        digest.update(f"\0{name}\0{value}".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def code_roots() -> list[Root]:
    """The code a post-processing runs: `core.warm_key.code_locations`."""
    return code_locations()


Listings = dict[str, list[tuple[str, bool]]]
"""Each walked dir's entries as the stamps' walk listed them: real path -> sorted (name,
is a dir and not a link); what the tree's discovery reads instead of listing it again."""


def _walk(root: Path, skip: frozenset[str], exclude: frozenset[str],
          listings: Listings | None = None, part: Sequence[os.DirEntry[str]] | None = None
          ) -> Iterator[tuple[str, Stamp | None]]:
    """Every entry under ``root`` (itself first), relative, with its stamp; links unfollowed.

    ``listings``, given, receives each dir's entries (skipped and excluded ones too).
    ``part``: only these entries of ``root`` and what lies under them (``root`` itself, its
    stamp and its listing, are the caller's: `Before` shares one tree between two walkers).
    """
    top = str(root)
    pending: list[str] = []
    if part is not None:
        yield from _entries(top, "", part, skip, exclude, pending)
    else:
        yield "", _stamp(top)
        pending.append("")
    while pending:
        rel = pending.pop()
        here = os.path.join(top, rel) if rel else top
        try:
            with os.scandir(here) as entries:
                found = list(entries)
        except OSError:
            continue  # its own stamp says what it is (gone, a file, unreadable)
        yield from _entries(top, rel, found, skip, exclude, pending)
        if listings is not None:
            listings[here] = _listing(found)


def _entries(top: str, rel: str, found: Sequence[os.DirEntry[str]], skip: frozenset[str],
             exclude: frozenset[str], pending: list[str]
             ) -> Iterator[tuple[str, Stamp | None]]:
    """The stamps of one dir's entries (``found``); its subdirs go onto ``pending``."""
    for entry in found:
        name = entry.name
        if name in skip or entry.path in exclude:
            continue
        child = f"{rel}/{name}" if rel else name
        try:
            stamp: Stamp | None = _stamp_of(entry.stat(follow_symlinks=False))
        except OSError:
            stamp = None
        yield child, stamp
        if entry.is_dir(follow_symlinks=False):
            pending.append(child)


def _listing(found: Sequence[os.DirEntry[str]]) -> list[tuple[str, bool]]:
    """A dir's entries as `Listings` holds them."""
    return sorted((entry.name, entry.is_dir(follow_symlinks=False)) for entry in found)


def take_stamps(roots: Sequence[Root], exclude: Sequence[Path] = (),
                listings: Listings | None = None,
                parts: Mapping[int, Sequence[os.DirEntry[str]]] | None = None
                ) -> Iterator[tuple[int, str, Stamp | None]]:
    """Every witnessed entry: (root index, path relative to it, stamp or None if absent).

    ``listings``, given, receives the walked dirs' entries (`Listings`). ``parts``: for a
    root's index, only those of its entries are walked (`_walk`'s ``part``).
    """
    left_out = frozenset(str(p) for p in exclude)
    for index, (name, path, walk) in enumerate(roots):
        if not walk:
            yield index, "", _stamp(str(path))
            continue
        skip = _SKIP_IN_CODE if name.startswith("code:") else frozenset()
        part = parts.get(index) if parts else None
        for rel, stamp in _walk(path, skip, left_out, listings, part):
            yield index, rel, stamp


def _line(index: int, rel: str, stamp: Stamp | None) -> bytes:
    """One entry as a line: ``index<TAB>path[<TAB>mode<TAB>size<TAB>mtime<TAB>ctime<TAB>ino]``.

    Tab-separated, not a JSON document a line (that was half of the stamps' cost): a path
    with a tab, a line break, a leading quote or bytes that are not UTF-8 is written as a
    JSON string (its escapes keep it on one line).
    """
    try:
        plain = rel.encode()
    except UnicodeEncodeError:  # a name's undecodable bytes (surrogate escapes)
        plain = b""
    if not plain and rel or plain[:1] == b'"' or any(c in rel for c in "\t\n\r"):
        plain = json.dumps(rel).encode()
    if stamp is None:
        return b"%d\t%s\n" % (index, plain)
    return b"%d\t%s\t%d\t%d\t%d\t%d\t%d\n" % (index, plain, *stamp)


def stamps_hold(roots: Sequence[Root], lines: Iterator[bytes]) -> bool:
    """True when every recorded entry has the same stamp now (an absent one still absent)."""
    paths = [str(path) for _, path, _ in roots]
    for line in lines:
        index_text, raw, *recorded = line.rstrip(b"\n").split(b"\t")
        index = int(index_text)
        rel = json.loads(raw) if raw[:1] == b'"' else raw.decode()
        if not 0 <= index < len(paths) or not isinstance(rel, str) or len(recorded) not in (
                0, 5) or (".." in rel and ".." in rel.split("/")):
            return False
        now = _stamp(f"{paths[index]}/{rel}" if rel else paths[index])
        if (now is None) != (not recorded) or (now is not None and now != tuple(
                map(int, recorded))):
            return False
    return True


def _header(stream: IO[bytes]) -> dict[str, Any] | None:
    header = json.loads(stream.readline())
    return header if isinstance(header, dict) and header.get("format") == _FORMAT else None


def answer(out: Path, key: str, roots: Sequence[Root]) -> dict[str, Any] | None:
    """The summary a memo in ``out`` recorded, when its key and every stamp still hold."""
    try:
        with open_stream(out / MEMO_FILE, max_bytes=_MAX_BYTES) as stream:
            header = _header(stream)
            expected = [*roots, ("out", out, True)]
            if header is None or header.get("key") != key or \
                    header.get("roots") != _named(expected):
                return None
            if not stamps_hold(expected, iter(stream.readline, b"")):
                return None
            summary = header.get("summary")
            return summary if isinstance(summary, dict) else None
    except (OSError, RefusedInput, ValueError, TypeError):
        return None


def forget(out: Path) -> None:
    """Remove ``out``'s memo: the outputs are about to change."""
    try:
        os.unlink(out / MEMO_FILE)
    except (FileNotFoundError, IsADirectoryError):  # no memo (a dir there is none either:
        pass  # it is never read as one, and no memo is written over it)


class Before:
    """The inputs' stamps as a run began: what it must still see at its end.

    They wait in an anonymous temporary file, not in memory (~100 bytes an entry: ~20 MB
    at 10 000 result dirs, through the whole post-processing). The code's few hundred
    entries are stamped here and now, before the caller imports more of it; the trees (the
    results, a read-only history: ~15 000 entries at 1 000 result dirs, 0.1 s) in a child
    beside the caller (`core.forked`) while it imports pandas and pyarrow, and that child
    goes on with ``then`` (the command line's discovery of the tree: it may read the
    tree once the stamps are taken), given the trees' dirs as the stamps' walk listed them
    (`Listings`: the discovery need not list them again). `wait` returns once both are
    done (the caller asks before it reads a tree); `take` hands ``then``'s answer over.

    ``share``: the caller has nothing else to do meanwhile (its imports are done: a warm
    Python's child, `core.warm_command`), so it stamps the second half of the first tree's
    entries itself, into a spool of its own, while the child stamps the first half; the
    child waits for that half (and its listings) before ``then``.

    `recheck_trees`, called once the trees have been read for the last time, checks their
    stamps beside the caller while it writes its outputs; `held` checks the rest.
    """

    def __init__(self, roots: Sequence[Root], exclude: Sequence[Path] = (),
                 then: Callable[[Listings], Any] | None = None, *,
                 share: bool = False) -> None:
        self.roots = list(roots)
        settled_before = time.time_ns() - SETTLED_NS
        self._settled = True
        self._then: Any = None
        self._recheck: Beside[bool] | None = None
        self._trees: Beside[tuple[bool, Any]] | None = None
        self._own: IO[bytes] | None = None  # this process's half of a shared tree
        code = [i for i, (name, _, _) in enumerate(self.roots) if name.startswith(_CODE)]
        self._tree_roots = [i for i in range(len(self.roots)) if i not in code]
        try:
            self._spool: IO[bytes] | None = tempfile.TemporaryFile(prefix="telltale-memo-")
        except OSError:  # no usable temporary dir: this run leaves no memo, and still runs
            self._spool, self._settled = None, False
            self._trees = beside(_then_of, then)
            return
        self._settled = _write_stamps(self._spool, self.roots, code, exclude, settled_before)
        if share and self._tree_roots and can_fork():
            self._share(self._tree_roots[0], exclude, settled_before, then)
            return
        self._trees = beside(_stamps_then, self._spool, self.roots, self._tree_roots,
                             exclude, settled_before, then)

    def _share(self, first: int, exclude: Sequence[Path], settled_before: int,
               then: Callable[[Listings], Any] | None) -> None:
        """Stamp the first tree's entries in two halves: the first beside, the second here.

        The tree's own stamp is taken before it is listed, here: an entry added after that
        changes it (no memo), and every entry listed is in one half or the other.
        """
        top = str(self.roots[first][1])
        stamp = _stamp(top)
        try:
            with os.scandir(top) as entries:
                found = sorted(entries, key=lambda entry: entry.name)
        except OSError:  # the usual walk says what it is (gone, a file, unreadable)
            found = []
        half = len(found) // 2
        given = Handoff(to_child=True)
        try:
            self._own = tempfile.TemporaryFile(prefix="telltale-memo-")
            self._trees = beside(_stamps_then, self._spool, self.roots, self._tree_roots,
                                 exclude, settled_before, then, (first, found[:half], given))
            listings: Listings = {top: _listing(found)}
            self._own.write(_line(first, "", stamp))
            # as `_write_stamps` reads a stamp: an absent root is no change to settle
            settled = stamp is None or max(stamp[2], stamp[3]) < settled_before
            settled = _write_stamps(self._own, self.roots, [first], exclude, settled_before,
                                    listings, {first: found[half:]}) and settled
            given.give(listings)
        finally:
            given.close()  # given, or never will be: the child then lists that half again
        self._settled = self._settled and settled

    def wait(self) -> None:
        """Return once every stamp is taken and ``then`` has answered.

        The trees' stamps and ``then`` in the child beside; its exception is raised here.
        """
        if self._trees is not None:
            trees, self._trees = self._trees, None
            with trees:
                settled, self._then = trees.result()
            self._settled = settled and self._settled

    def take(self) -> Any:
        """``then``'s answer (None without one), handed over.

        Not held here after: a discovery of 10 000 dirs is ~20 MB.
        """
        self.wait()
        answer, self._then = self._then, None
        return answer

    @property
    def settled(self) -> bool:
        """True when every stamp was older than `SETTLED_NS` as the run began."""
        self.wait()
        return self._settled

    def lines(self, roots: Sequence[int] | None = None) -> Iterator[bytes]:
        """The recorded lines, from the first (only those of ``roots``, given)."""
        self.wait()
        spools = [spool for spool in (self._spool, self._own) if spool is not None]
        for spool in spools:
            spool.seek(0)
        every = itertools.chain.from_iterable(iter(spool.readline, b"") for spool in spools)
        if roots is None:
            return every
        chosen = {b"%d" % i for i in roots}
        return (line for line in every if line.split(b"\t", 1)[0] in chosen)

    def recheck_trees(self) -> None:
        """Start checking the trees' stamps beside the caller: it has read them for good."""
        if self._spool is not None and self._recheck is None and self.settled:
            self._recheck = beside(stamps_hold, self.roots, self.lines(self._tree_roots))

    def held(self) -> bool:
        """True when the run changed none of its inputs (and nothing else did)."""
        if not self.settled:
            return False
        if self._recheck is None:
            return stamps_hold(self.roots, self.lines())
        recheck, self._recheck = self._recheck, None
        with recheck:
            trees = recheck.result()
        rest = [i for i in range(len(self.roots)) if i not in self._tree_roots]
        return trees and stamps_hold(self.roots, self.lines(rest))

    def close(self) -> None:
        """Drop the recorded stamps (a child still at work is stopped)."""
        for job in (self._trees, self._recheck):
            if job is not None:
                job.close()
        self._trees = self._recheck = None
        for spool in (self._spool, self._own):
            if spool is not None:
                spool.close()


def _then_of(then: Callable[[Listings], Any] | None) -> tuple[bool, Any]:
    return False, then({}) if then is not None else None


def _stamps_then(spool: IO[bytes], roots: Sequence[Root], indices: Sequence[int],
                 exclude: Sequence[Path], settled_before: int,
                 then: Callable[[Listings], Any] | None,
                 shared: tuple[int, Sequence[os.DirEntry[str]], Handoff] | None = None
                 ) -> tuple[bool, Any]:
    """`_write_stamps`, then ``then`` with the dirs the walk listed: (settled, its answer).

    ``shared``: (a tree's index, the entries of it walked here, the parent's listings of
    the rest, taken before ``then``: `Before._share`).
    """
    listings: Listings = {}
    parts = {shared[0]: shared[1]} if shared is not None else None
    settled = _write_stamps(spool, roots, indices, exclude, settled_before, listings, parts)
    if shared is not None:
        listings.update(shared[2].take() or {})
    return settled, then(listings) if then is not None else None


_CODE = ("code:", "site:")  # the roots `code_roots` names


def _write_stamps(spool: IO[bytes], roots: Sequence[Root], indices: Sequence[int],
                  exclude: Sequence[Path], settled_before: int,
                  listings: Listings | None = None,
                  parts: Mapping[int, Sequence[os.DirEntry[str]]] | None = None) -> bool:
    """Write the stamps of ``roots[i]`` for each of ``indices`` into ``spool``, flushed.

    ``listings``, given, receives the walked dirs' entries (`Listings`); ``parts``: a
    root's entries walked alone, by the root's index (`take_stamps`).

    Returns:
        True when every stamp is older than ``settled_before`` (git's "racy" rule, with a
        margin for coarse and skewed clocks: an entry changed just before these stamps
        could change again within the same timestamp tick).
    """
    settled = True
    chosen = [roots[i] for i in indices]
    by_position = {indices.index(i): part for i, part in parts.items()} if parts else None
    for position, rel, stamp in take_stamps(chosen, exclude, listings, by_position):
        if stamp is not None and max(stamp[2], stamp[3]) >= settled_before:
            settled = False
        spool.write(_line(indices[position], rel, stamp))
    spool.flush()  # before a fork, or a child's end: nothing left in a buffer to copy
    return settled


def _is_memo(rel: str) -> bool:
    # the memo and atomic_open's temporary file beside it (".<name>.tmp-...")
    return rel.lstrip(".").startswith(MEMO_FILE.lstrip("."))


def record(out: Path, key: str, before: Before, summary: Mapping[str, Any]) -> bool:
    """Write ``out``'s memo when the run's inputs held still; True when written.

    The outputs are stamped as they are now; ``out`` itself is not (writing the memo
    changes it), so a file added beside the outputs is not noticed, one changed or removed
    is.
    """
    if not before.held():
        return False
    roots = [*before.roots, ("out", out, True)]
    header = {"format": _FORMAT, "key": key, "summary": summary,
              "roots": _named(roots)}
    index = len(before.roots)
    try:
        with atomic_open(out / MEMO_FILE, durable=False) as stream:  # a cache: made again
            stream.write(redact_bytes(json.dumps(header).encode()) + b"\n")
            stream.writelines(before.lines())
            stream.writelines(_line(index, rel, stamp) for _, rel, stamp in
                              take_stamps(roots[index:]) if rel and not _is_memo(rel))
    except OSError:  # a read-only --out keeps no memo
        return False
    return True
