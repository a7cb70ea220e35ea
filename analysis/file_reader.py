"""The one way a parser reads a result tree: `FileReader`, bounded and never trusting it.

It degrades gracefully (a missing or corrupt file returns ``None`` and records a
`ParseProblem`, never aborts the parse), records every file and glob it touched (the parse
cache fingerprints them), never follows a symlink, reads regular files only, refuses files
over `MAX_FILE_BYTES` and cuts lines at `MAX_LINE_CHARS`. See `analysis.parsing` for the
contract and the cache.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, Field

from core.errors import ConfigError
from core.safeio import RefusedInput, open_regular, open_stream
from core.yamlio import load_yaml_text

MAX_FILE_BYTES = 64 * 1024 * 1024
"""Largest file `FileReader.text`/`json`/`yaml` read whole (logs are streamed by `lines`)."""
MAX_LINE_CHARS = 64 * 1024
"""Longest line `FileReader.lines` yields; the rest of a longer line is dropped."""
_BLOCK = 1 << 20  # bytes a log is scanned by
_pool = threading.local()  # per thread (Prefect runs tasks in threads): free scan buffers
_SYMLINK_PROBLEM = ("is or passes through a symlink: not followed (results are read only "
                    "inside their own tree)")


@contextmanager
def _borrowed_block() -> Iterator[bytearray]:
    """A `_BLOCK`-byte buffer of this thread's pool, for ``readinto``.

    Reused from file to file: a fresh 1 MiB ``bytes`` a block (``read``) cost its page faults
    and its copy every time, ~3/4 of a cold log scan. A pool, not one buffer: two scans
    may be under way at once (generators), each holds its own until it ends.
    """
    free: list[bytearray] = _pool.__dict__.setdefault("free", [])
    block = free.pop() if free else bytearray(_BLOCK)
    if len(block) != _BLOCK:  # the block size changed (tests shrink it)
        block = bytearray(_BLOCK)
    try:
        yield block
    finally:
        free.append(block)


class _LineCounter:
    """Line numbers of byte offsets in a binary stream, asked in increasing order (one pass)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._block = b""
        self._position = 0  # file offset of the block
        self._cursor = 0  # where in the block the last count stopped
        self._line = 1  # line number at the cursor

    def line_at(self, offset: int) -> int:
        """The 1-based line holding byte ``offset`` (not below any offset asked before)."""
        while offset >= self._position + len(self._block):
            self._line += self._block.count(b"\n", self._cursor)
            self._position += len(self._block)
            self._block, self._cursor = self._stream.read(_BLOCK), 0
            if not self._block:  # past the end: the last line
                return self._line
        target = max(offset - self._position, self._cursor)
        self._line += self._block.count(b"\n", self._cursor, target)
        self._cursor = target
        return self._line




class ParseProblem(BaseModel):
    """Something that could not be read; the fields it would have filled stay empty."""

    file: str = Field(description="Path relative to the result dir.")
    line: int | None = Field(default=None, description="1-based line, when known.")
    message: str


class FileReader:
    """Reads files of one result dir, records problems and fingerprints."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.problems: list[ParseProblem] = []
        self.fingerprints: dict[str, Any] = {}
        self._real_root: str | None = None
        self._linked_dirs: dict[str, bool] = {}  # relative dir -> is or passes through a link

    def _real(self, rel: str) -> str:
        """The path of ``rel`` under the result dir's real path (``rel`` normalised)."""
        if self._real_root is None:
            self._real_root = os.path.realpath(self.root)
        return f"{self._real_root}/{rel}"

    def _linked_dir(self, head: str) -> bool:
        """Whether the dir ``head`` (relative, normalised) is or passes through a symlink.

        One cached ``lstat`` per dir: the result dir and its parent are real paths already.
        """
        known = self._linked_dirs.get(head)
        if known is None:
            if head in ("", ".") or set(head.split("/")) == {".."}:
                return False
            try:
                linked = stat.S_ISLNK(os.lstat(self._real(head)).st_mode)
            except OSError:
                linked = False  # missing: the open reports it as missing
            known = self._linked_dir(os.path.dirname(head)) or linked
            self._linked_dirs[head] = known
        return known

    def _fingerprint(self, rel: str, st: os.stat_result | None) -> None:
        self.fingerprints[rel] = stamp_of(st)

    def problem(self, rel: str, message: str, line: int | None = None) -> None:
        """Record a problem with a file (for parser-detected inconsistencies)."""
        self.problems.append(ParseProblem(file=rel, line=line, message=message))

    def glob(self, pattern: str) -> str | None:
        """Return the last dir/file (sort order) matching a one-level pattern, or None.

        The listing is fingerprinted: a new match invalidates the cache.
        """
        matches = sorted(n for n in _listdir(self.root) if fnmatch.fnmatch(n, pattern))
        self.fingerprints[f"glob:{pattern}"] = matches
        return matches[-1] if matches else None

    def listdir(self, rel: str, pattern: str = "*") -> list[str]:
        """Sorted names under ``rel`` matching ``pattern`` (fingerprinted like a glob)."""
        names = sorted(fnmatch.filter(_listdir(self.root / rel), pattern))
        self.fingerprints[f"list:{rel}/{pattern}"] = names
        return names

    def exists(self, rel: str) -> bool:
        """Tell whether a file exists (recorded, so its later appearance re-parses).

        A symlink exists (reading it is refused and reported), whatever it points to.
        """
        if rel not in self.fingerprints:
            try:
                self._fingerprint(rel, os.lstat(self._real(os.path.normpath(rel))))
            except OSError:
                self._fingerprint(rel, None)
        return self.fingerprints[rel] is not None

    def _open_fd(self, rel: str, limit: int | None) -> int | None:
        """A read-only descriptor of ``rel`` when it is safe to read; else None and a problem.

        Safe: no symlink on the way (dirs: a cached ``lstat`` each), a regular file that is
        not a link (``lstat`` before the open: a device or a FIFO is never even opened, as
        opening some devices acts), and (with ``limit``) not larger than ``limit`` bytes.
        The open itself takes ``O_NOFOLLOW | O_NONBLOCK`` and its ``fstat`` must be the same
        regular file, so a swap between check and open can neither follow a link nor hang on
        a FIFO. Three system calls a file, no path objects: a cold parse reads a dozen small
        files a dir. A missing file raises FileNotFoundError (fingerprinted as missing) for
        the caller to report (or not).
        """
        norm = os.path.normpath(rel)
        path = self._real(norm)
        if self._linked_dir(os.path.dirname(norm)):
            self._fingerprint(rel, None)
            self.problem(rel, _SYMLINK_PROBLEM)
            return None
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            self._fingerprint(rel, None)
            raise
        self._fingerprint(rel, st)  # a link's own: its change re-parses
        try:
            # the one way an untrusted file is opened (core.safeio), given this lstat
            return open_regular(path, max_bytes=limit, known=st)
        except RefusedInput as exc:
            self.problem(rel, {
                "link": _SYMLINK_PROBLEM,
                "special": "not a regular file: not read",
                "size": f"{st.st_size} bytes, over the {limit} read whole: not read",
                "replaced": "replaced while being read: not read",
            }.get(exc.kind, f"unreadable: {exc.reason}"))
            return None

    def _open(self, rel: str, *, limit: int | None, required: bool,
              binary: bool = False, raw: bool = False) -> IO[Any] | None:
        """Open ``rel`` when `_open_fd` allows it; else None, with a problem recorded.

        A missing file is a problem only when ``required``. ``raw``: binary and unbuffered
        (``readinto`` a large buffer then reads straight into it).
        """
        try:
            fd = self._open_fd(rel, limit)
            if fd is None:
                return None
            if binary or raw:
                return open(fd, "rb", buffering=0 if raw else -1)  # noqa: SIM115
            return open(fd, encoding="utf-8", errors="replace", newline="")  # noqa: SIM115
        except FileNotFoundError:
            if required:
                self.problem(rel, "missing")
        except OSError as exc:
            self.problem(rel, f"unreadable: {exc.strerror}")
        return None

    def text(self, rel: str, *, required: bool = True,
             max_bytes: int = MAX_FILE_BYTES) -> str | None:
        """Return a file's text, or None (and a problem when ``required`` or unsafe)."""
        stream = self._open(rel, limit=max_bytes, required=required, raw=True)
        if stream is None:
            return None
        with stream:
            try:
                # sized by the file (read(max_bytes + 1) allocated 64 MiB a file); still
                # bounded when it grew since it was checked
                data = stream.read(os.fstat(stream.fileno()).st_size + 1)
                while len(data) <= max_bytes and (more := stream.read(
                        min(_BLOCK, max_bytes + 1 - len(data)))):
                    data += more
            except OSError as exc:
                self.problem(rel, f"unreadable: {exc.strerror}")
                return None
        if len(data) > max_bytes:
            self.problem(rel, f"over the {max_bytes} bytes read whole: not read")
            return None
        return data.decode("utf-8", errors="replace")

    def json(self, rel: str, *, required: bool = True) -> Any:
        """Return a JSON file's data, or None (recording a problem with the line)."""
        text = self.text(rel, required=required)
        if text is None:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            self.problem(rel, f"invalid JSON: {exc.msg}", exc.lineno)
            return None

    def yaml(self, rel: str, *, required: bool = True) -> Any:
        """Return a YAML file's data, or None (recording a problem with the line).

        Results are untrusted: YAML aliases are refused like in user input.
        """
        text = self.text(rel, required=required, max_bytes=MAX_FILE_BYTES // 16)
        if text is None:
            return None
        try:
            data, _ = load_yaml_text(text, source=rel, untrusted=True)
            return data
        except ConfigError as exc:
            self.problem(rel, exc.reason, exc.line)
            return None

    def table(self, rel: str, *, required: bool = True) -> Any:
        """Return a Parquet file as a pandas DataFrame, or None (recording why)."""
        stream = self._open(rel, limit=MAX_FILE_BYTES, required=required, binary=True)
        if stream is None:
            return None
        import pandas as pd
        import pyarrow as pa

        with stream:
            try:
                return pd.read_parquet(stream)
            except (OSError, ValueError, pa.ArrowException) as exc:
                self.problem(rel, f"unreadable Parquet: {str(exc)[:200]}")
                return None

    def tail(self, rel: str, lines: int = 5) -> str | None:
        """The last non-empty lines of a file (see `read_tail`), or None."""
        try:
            fd = self._open_fd(rel, None)
        except OSError:
            return None
        if fd is None:
            return None
        with open(fd, "rb") as stream:
            return _tail(stream, lines)

    def matching_spans(self, rel: str, needle: str, *,
                       required: bool = True) -> Iterator[tuple[int, str]] | None:
        """Stream ``(byte offset, line)`` for the lines that contain ``needle``.

        The file is scanned in 1 MiB binary blocks with ``bytes.find`` (C speed), so the
        lines without ``needle`` — a trainer log's progress bars, most of its size — cost
        no Python work. Memory is bounded like `lines`: a line longer than
        `MAX_LINE_CHARS` bytes is cut there and reported once. Offsets, not line numbers:
        counting every newline was a third of a cold scan, and only a problem needs its
        line (`line_numbers`, or `matching_lines` to number every line).
        """
        stream = self._open(rel, limit=None, required=required, raw=True)
        if stream is None:
            return None
        token = needle.encode()

        def scan(data: bytearray, begin: int, end: int, base: int) -> list[tuple[int, str]]:
            """Matching lines among the complete lines ``data[begin:end]``.

            ``data`` starts at file offset ``base``.
            """
            found: list[tuple[int, str]] = []
            hit = data.find(token, begin, end)
            while hit >= 0:
                start = data.rfind(b"\n", begin, hit) + 1 or begin
                stop = data.find(b"\n", hit, end)
                stop = end if stop < 0 else stop
                found.append((base + start, data[start:min(stop, start + MAX_LINE_CHARS)]
                              .decode("utf-8", errors="replace")))
                hit = data.find(token, stop + 1, end)
            return found

        def iterate() -> Iterator[tuple[int, str]]:
            position = 0  # file offset of the block
            carry, carry_at, skipping, cut = b"", 0, False, False
            with stream, _borrowed_block() as block:
                while True:
                    size = stream.readinto(block)
                    if not size:
                        break
                    begin = 0
                    if skipping:  # the rest of an over-long line: drop it
                        newline = block.find(b"\n", 0, size)
                        if newline < 0:
                            position += size
                            continue
                        begin, skipping = newline + 1, False
                    elif carry:  # the line cut by the last block ends in this one?
                        newline = block.find(b"\n", 0, size)
                        if newline < 0:
                            carry, begin = carry + block[:size], size
                        else:
                            line = carry + block[:newline]
                            if token in line:
                                yield carry_at, line[:MAX_LINE_CHARS].decode("utf-8",
                                                                             "replace")
                            carry, begin = b"", newline + 1
                    if begin < size:
                        end = block.rfind(b"\n", begin, size) + 1 or begin
                        if end > begin:  # a list: the block is read again only after it
                            yield from scan(block, begin, end, position)
                        carry, carry_at = bytes(block[end:size]), position + end
                    if len(carry) > MAX_LINE_CHARS:  # no newline in sight: cut the line
                        if not cut:
                            self.problem(rel, f"line over {MAX_LINE_CHARS} characters: cut")
                            cut = True
                        if token in carry[:MAX_LINE_CHARS]:
                            yield carry_at, carry[:MAX_LINE_CHARS].decode("utf-8", "replace")
                        carry, skipping = b"", True
                    position += size
                if carry and token in carry:
                    yield carry_at, carry.decode("utf-8", errors="replace")

        return iterate()

    def line_numbers(self, rel: str, offsets: Sequence[int]) -> list[int | None]:
        """The 1-based line of each byte offset of ``rel`` (None: the file is unreadable).

        One pass over the file, however many offsets: for the few lines a problem names.
        """
        if not offsets:
            return []
        stream = self._open(rel, limit=None, required=False, binary=True)
        if stream is None:
            return [None] * len(offsets)
        with stream:
            counter = _LineCounter(stream)
            numbers = {offset: counter.line_at(offset) for offset in sorted(set(offsets))}
        return [numbers[offset] for offset in offsets]

    def matching_lines(self, rel: str, needle: str, *,
                       required: bool = True) -> Iterator[tuple[int, str]] | None:
        """Stream ``(line number, line)`` for the lines that contain ``needle``.

        `matching_spans` with every line numbered (a second, counting read of the file).
        """
        spans = self.matching_spans(rel, needle, required=required)
        if spans is None:
            return None
        counting = self._open(rel, limit=None, required=False, binary=True)

        def iterate() -> Iterator[tuple[int, str]]:
            if counting is None:  # gone since: no numbers to give
                return
            with counting:
                counter = _LineCounter(counting)
                for offset, line in spans:
                    yield counter.line_at(offset), line

        return iterate()

    def lines(self, rel: str, *, required: bool = True) -> Iterator[str] | None:
        """Stream a text file line by line (never loads it whole), or None when missing.

        Lines longer than `MAX_LINE_CHARS` are cut there (the rest is skipped without being
        held in memory) and reported once.
        """
        stream = self._open(rel, limit=None, required=required)
        if stream is None:
            return None

        def iterate() -> Iterator[str]:
            cut = False
            with stream:
                while True:
                    line = stream.readline(MAX_LINE_CHARS)
                    if not line:
                        return
                    if len(line) == MAX_LINE_CHARS and not line.endswith(("\n", "\r")):
                        while True:  # drop the rest of this line, chunk by chunk
                            rest = stream.readline(MAX_LINE_CHARS)
                            if not rest or rest.endswith(("\n", "\r")):
                                break
                        if not cut:
                            self.problem(rel, f"line over {MAX_LINE_CHARS} characters: cut")
                            cut = True
                    yield line

        return iterate()


TAIL_WIDTH = 200
"""A tail line longer than this is cut (a JSON summary line is thousands of characters)."""


def read_tail(path: str | Path, lines: int = 5, limit: int = 64 * 1024) -> str | None:
    """The last non-empty lines of a file, read from its end only (None when unreadable).

    For a failed workload's last words: a multi-GB log is never read whole. Long lines are
    cut to `TAIL_WIDTH`; the last ``error:`` line of the window comes first when the last
    lines do not hold it.
    """
    try:
        with open_stream(path, follow_links=True) as stream:  # a FIFO would block the tail
            return _tail(stream, lines, limit)
    except (OSError, RefusedInput):
        return None


def _tail(stream: IO[bytes], lines: int = 5, limit: int = 64 * 1024) -> str | None:
    try:
        stream.seek(0, os.SEEK_END)
        stream.seek(max(0, stream.tell() - limit))
        text = stream.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return None
    every = [line.rstrip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    kept = [_short(line) for line in every[-lines:]]
    # the workload's own reason (its last "error:" line), when the last lines are not it:
    # a JSON summary or a traceback's frames would otherwise hide why it failed
    said = next((line for line in reversed(every) if line.lstrip().lower()
                 .startswith("error:")), None)
    if said is not None and _short(said) not in kept:
        kept = [_short(said), "...", *kept[-(lines - 1):]] if lines > 1 else [_short(said)]
    return "\n".join(kept) or None


def _short(line: str, width: int = TAIL_WIDTH) -> str:
    """A log line cut to ``width`` characters, saying how much was left out."""
    return line if len(line) <= width else f"{line[:width]}… ({len(line) - width} more chars)"


def stamp_of(st: os.stat_result | None) -> list[int] | None:
    """How the parse cache records a file it depends on: its ``lstat``'s size and mtime.

    None when it is missing: its later appearance invalidates the cache too.
    """
    return None if st is None else [st.st_size, st.st_mtime_ns]


def lstat_or_none(path: str) -> os.stat_result | None:
    """``os.lstat(path)``, None when it cannot be stat'ed (missing)."""
    try:
        return os.lstat(path)
    except OSError:
        return None


def file_stamp(path: str) -> list[int] | None:
    """The `stamp_of` the file at ``path`` now."""
    return stamp_of(lstat_or_none(path))


def _listdir(path: str | Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
