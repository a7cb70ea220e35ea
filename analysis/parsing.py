"""The parsing contract and the parse cache.

A project supplies a `ResultParser`: ``parse(result_dir, reader)`` returns a typed
`ParsedResult` subclass. The parser reads files only through the `FileReader` it is given,
which

- degrades gracefully: a missing or corrupt file returns ``None`` and records a
  `ParseProblem` (file, line, message) in the result, it never aborts the parse;
- records every file (and glob) it touched, so the cache can fingerprint them;
- treats the tree as untrusted: it never follows a symlink (a link to the system's password
  file once reached an exported LTS payload), reads regular files only (a FIFO hung the
  analysis), refuses files over `MAX_FILE_BYTES`, and cuts lines at `MAX_LINE_CHARS` (a 2 GB
  log without newlines took 4.3 GB of memory).

Cache: ``<result dir>/.telltale_parse_cache.json`` holds the parser name and version, the
fingerprints (size, mtime) of every file read, and the result as JSON (never pickle). It is
reused only when the parser version and every fingerprint still match; anything else
re-parses. ``TELLTALE_FORCE_REPARSE=1`` (or ``force=True``) ignores it. Many dirs are parsed
in parallel worker processes.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import IO, Any, ClassVar, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from analysis.discovery import ResultDir
from analysis.environment import env_settings
from analysis.errors import ConfigError
from analysis.yamlio import load_yaml_text

__all__ = [
    "CACHE_FILE",
    "FORCE_ENV",
    "MAX_FILE_BYTES",
    "MAX_LINE_CHARS",
    "FileReader",
    "ParseProblem",
    "ParsedResult",
    "ResultParser",
    "parse_dirs",
    "parse_one",
    "read_tail",
]

MAX_FILE_BYTES = 64 * 1024 * 1024
"""Largest file `FileReader.text`/`json`/`yaml` read whole (logs are streamed by `lines`)."""
MAX_LINE_CHARS = 64 * 1024
"""Longest line `FileReader.lines` yields; the rest of a longer line is dropped."""
CACHE_FILE = ".telltale_parse_cache.json"
FORCE_ENV = "TELLTALE_FORCE_REPARSE"
_PARALLEL_MIN = 16  # below this many dirs, worker start-up costs more than it saves
_BLOCK = 1 << 20  # bytes a log is scanned by
_CACHE_FORMAT = 2  # 2: bulky fields on a line of their own
_buffers = threading.local()  # per thread: Prefect runs tasks in threads


def _newline_mask(data: bytes, begin: int, end: int) -> Any:
    """Where ``data[begin:end]`` holds a newline, as a bool array in a reused buffer."""
    size = end - begin
    mask = getattr(_buffers, "mask", None)
    if mask is None or len(mask) < size:
        mask = _buffers.mask = np.empty(max(size, _BLOCK), dtype=bool)
    out = mask[:size]
    np.equal(np.frombuffer(data, np.uint8, count=size, offset=begin), 10, out=out)
    return out

R = TypeVar("R", bound="ParsedResult")


class ParseProblem(BaseModel):
    """Something that could not be read; the fields it would have filled stay empty."""

    file: str = Field(description="Path relative to the result dir.")
    line: int | None = Field(default=None, description="1-based line, when known.")
    message: str


class ParsedResult(BaseModel):
    """Base of every project's parsed result."""

    path: str = Field(description="Absolute result dir path.")
    rel_path: str = Field(description="Path relative to the results root.")
    settings: dict[str, Any]
    exit_code: int
    parser: str
    parser_version: str
    problems: list[ParseProblem] = Field(default_factory=list)
    failure: str | None = Field(default=None, description="Why a failed run failed, in the "
                                "workload's own words (the last lines of its log).")

    @property
    def failed(self) -> bool:
        """True when the run itself failed (it is still parsed and reported)."""
        return self.exit_code != 0


class FileReader:
    """Reads files of one result dir, records problems and fingerprints."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.problems: list[ParseProblem] = []
        self.fingerprints: dict[str, Any] = {}
        self._real_root: str | None = None
        self._safe_dirs: dict[str, bool] = {}  # dir (absolute) -> no symlink down to it

    def _through_symlink(self, rel: str) -> bool:
        """Whether ``rel`` is, or passes through, a symlink below the result dir's parent.

        A few ``lstat`` calls on the components under the base (cached per dir), instead
        of a ``realpath`` of the whole absolute path per file.
        """
        if self._real_root is None:
            self._real_root = os.path.realpath(self.root)
        lexical = os.path.normpath(os.path.join(self._real_root, rel))
        base = self._real_root if lexical.startswith(self._real_root + os.sep) else \
            os.path.dirname(self._real_root)  # "../config.yaml" reads the run dir's parent
        parts = os.path.relpath(lexical, base).split(os.sep)
        current = base
        for depth, part in enumerate(parts):
            current = os.path.join(current, part)
            last = depth == len(parts) - 1
            if not last and current in self._safe_dirs:
                if not self._safe_dirs[current]:
                    return True
                continue
            try:
                linked = stat.S_ISLNK(os.lstat(current).st_mode)
            except FileNotFoundError:
                return False  # missing: the caller reports it as missing
            if not last:
                self._safe_dirs[current] = not linked
            if linked:
                return True
        return False

    def _touch(self, rel: str) -> Path:
        path = self.root / rel
        try:
            st = path.stat()
            self.fingerprints[rel] = [st.st_size, st.st_mtime_ns]
        except OSError:
            self.fingerprints[rel] = None
        return path

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
        """Tell whether a file exists (recorded, so its later appearance re-parses)."""
        return self.fingerprints.get(rel) is not None if rel in self.fingerprints else (
            self._touch(rel).exists())

    def _checked(self, rel: str, limit: int | None) -> Path | None:
        """The path of ``rel`` when it is safe to read; else None and a problem.

        Safe: no symlink on the way (the real path is the lexical one), a regular file, and
        (with ``limit``) not larger than ``limit`` bytes. A missing file raises
        FileNotFoundError for the caller to report (or not).
        """
        path = self._touch(rel)
        if self._through_symlink(rel):
            self.problem(rel, "is or passes through a symlink: not followed (results are "
                              "read only inside their own tree)")
            return None
        st = os.stat(path)  # FileNotFoundError goes to the caller
        if not stat.S_ISREG(st.st_mode):
            self.problem(rel, "not a regular file: not read")
            return None
        if limit is not None and st.st_size > limit:
            self.problem(rel, f"{st.st_size} bytes, over the {limit} read whole: not read")
            return None
        return path

    def _open(self, rel: str, *, limit: int | None, required: bool,
              binary: bool = False) -> IO[Any] | None:
        """Open ``rel`` when `_checked` allows it; else None, with a problem recorded.

        A missing file is a problem only when ``required``.
        """
        try:
            path = self._checked(rel, limit)
            if path is None:
                return None
            if binary:
                return open(path, "rb")  # noqa: SIM115
            return open(path, encoding="utf-8", errors="replace", newline="")  # noqa: SIM115
        except FileNotFoundError:
            if required:
                self.problem(rel, "missing")
        except OSError as exc:
            self.problem(rel, f"unreadable: {exc.strerror}")
        return None

    def text(self, rel: str, *, required: bool = True,
             max_bytes: int = MAX_FILE_BYTES) -> str | None:
        """Return a file's text, or None (and a problem when ``required`` or unsafe)."""
        stream = self._open(rel, limit=max_bytes, required=required)
        if stream is None:
            return None
        with stream:
            try:
                return str(stream.read())
            except OSError as exc:
                self.problem(rel, f"unreadable: {exc.strerror}")
                return None

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
            path = self._checked(rel, None)
        except OSError:
            return None
        return read_tail(path, lines) if path is not None else None

    def matching_lines(self, rel: str, needle: str, *,
                       required: bool = True) -> Iterator[tuple[int, str]] | None:
        """Stream ``(line number, line)`` for the lines that contain ``needle``.

        The file is scanned in 1 MiB binary blocks with ``bytes.find`` (C speed), so the
        lines without ``needle`` — a trainer log's progress bars, most of its size — cost
        no Python work; line numbers stay exact. Memory is bounded like `lines`: a line
        longer than `MAX_LINE_CHARS` bytes is cut there and reported once.
        """
        stream = self._open(rel, limit=None, required=required, binary=True)
        if stream is None:
            return None
        token = needle.encode()

        def scan(data: bytes, begin: int, end: int,
                 first: int) -> tuple[list[tuple[int, str]], int]:
            """Matching lines of the complete lines ``data[begin:end]``, and the next number.

            The first of those lines is line ``first``.
            """
            starts: list[int] = []
            texts: list[str] = []
            hit = data.find(token, begin, end)
            while hit >= 0:
                start = data.rfind(b"\n", begin, hit) + 1 or begin
                stop = data.find(b"\n", hit, end)
                stop = end if stop < 0 else stop
                starts.append(start - begin)
                texts.append(data[start:min(stop, start + MAX_LINE_CHARS)].decode(
                    "utf-8", errors="replace"))
                hit = data.find(token, stop + 1, end)
            # Line numbers from a newline mask of the block (numpy, into a reused buffer:
            # a fresh 1 MiB array costs its page faults every block); bytes.count between
            # hits was ~0.7-1 ms a MiB, the biggest single cost of a cold parse.
            newline = _newline_mask(data, begin, end)
            if not starts:
                return [], first + int(np.count_nonzero(newline))
            positions = np.flatnonzero(newline)
            numbers = np.searchsorted(positions, starts) + first
            return list(zip(numbers.tolist(), texts, strict=True)), first + len(positions)

        def iterate() -> Iterator[tuple[int, str]]:
            lineno, carry, skipping, cut = 1, b"", False, False
            with stream:
                while True:
                    block = stream.read(_BLOCK)
                    if not block:
                        break
                    begin = 0
                    if skipping:  # the rest of an over-long line: drop it
                        newline = block.find(b"\n")
                        if newline < 0:
                            continue
                        begin, skipping, lineno = newline + 1, False, lineno + 1
                    elif carry:  # the line cut by the last block ends in this one?
                        newline = block.find(b"\n")
                        if newline < 0:
                            carry, begin = carry + block, len(block)
                        else:
                            line = carry + block[:newline]
                            if token in line:
                                yield lineno, line[:MAX_LINE_CHARS].decode("utf-8", "replace")
                            carry, begin, lineno = b"", newline + 1, lineno + 1
                    if begin < len(block):
                        end = block.rfind(b"\n", begin) + 1 or begin
                        if end > begin:
                            found, lineno = scan(block, begin, end, lineno)
                            yield from found
                        carry = block[end:]
                    if len(carry) > MAX_LINE_CHARS:  # no newline in sight: cut the line
                        if not cut:
                            self.problem(rel, f"line over {MAX_LINE_CHARS} characters: cut")
                            cut = True
                        if token in carry[:MAX_LINE_CHARS]:
                            yield lineno, carry[:MAX_LINE_CHARS].decode("utf-8", "replace")
                        carry, skipping = b"", True
                if carry and token in carry:
                    yield lineno, carry.decode("utf-8", errors="replace")

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


def read_tail(path: str | Path, lines: int = 5, limit: int = 64 * 1024) -> str | None:
    """The last non-empty lines of a file, read from its end only (None when unreadable).

    For a failed workload's last words: a multi-GB log is never read whole.
    """
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - limit))
            text = stream.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    kept = [line.rstrip()[-500:] for line in text.replace("\r", "\n").splitlines()
            if line.strip()][-lines:]
    return "\n".join(kept) or None


def _listdir(path: str | Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class ResultParser(Protocol):
    """What a project supplies to turn a result dir into a typed result."""

    name: ClassVar[str]
    version: ClassVar[str]
    result_model: ClassVar[type[ParsedResult]]

    def parse(self, result: ResultDir, reader: FileReader) -> ParsedResult:
        """Parse one result dir; read files only through ``reader``."""
        ...


def _fingerprints_match(root: str, recorded: dict[str, Any]) -> bool:
    names: list[str] | None = None  # listed once, for every glob of this dir
    for rel, expected in recorded.items():
        if rel.startswith("glob:"):
            if names is None:
                names = _listdir(root)  # plain strings: the warm path runs per dir
            if sorted(fnmatch.filter(names, rel[len("glob:"):])) != expected:
                return False
            continue
        if rel.startswith("list:"):
            directory, _, pattern = rel[len("list:"):].rpartition("/")
            if sorted(fnmatch.filter(_listdir(os.path.join(root, directory)),
                                     pattern)) != expected:
                return False
            continue
        path = f"{root}/{rel}"
        if expected is None:  # was missing: still missing? (no exception raised per file)
            if os.access(path, os.F_OK):
                return False
            continue
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_size != expected[0] or st.st_mtime_ns != expected[1]:
            return False
    return True


def _load_cached(result: ResultDir, parser: ResultParser, trust: bool = False,
                 skip: Sequence[str] = ()) -> ParsedResult | None:
    """Return the cached result when it is still valid, else None.

    The cache file is three JSON lines: a small header (parser, version, inputs,
    fingerprints, the fields stored apart) checked first, the result without the fields
    stored apart, and those fields. With ``skip`` (fields stored apart), the third line is
    not read and those fields keep their defaults: a warm post-processing of many runs
    validated each run's loss curve (three quarters of its validation time) to drop it.
    """
    try:
        with open(f"{result.path}/{CACHE_FILE}", "rb") as stream:
            header_line = stream.readline()
            header = json.loads(header_line)
            if not isinstance(header, dict) or header.get("parser") != parser.name or \
                    header.get("version") != parser.version or \
                    header.get("format") != _CACHE_FORMAT:
                return None
            if header.get("exit_code") != result.exit_code or \
                    header.get("settings") != result.settings:
                return None
            if not trust and not _fingerprints_match(result.path,
                                                     header.get("fingerprints") or {}):
                return None
            body = stream.readline().rstrip(b"\n")
            apart = set(header.get("apart") or ())
            if not skip or not set(skip) <= apart:
                rest = stream.readline().rstrip(b"\n")
                if rest not in (b"", b"{}"):  # disjoint fields: one object again
                    body = body[:-1] + (b"," if body != b"{}" else b"") + rest[1:]
            return parser.result_model.model_validate_json(body)
    except (OSError, ValueError, ValidationError):
        return None


def _store_cache(result: ResultDir, parser: ResultParser, parsed: ParsedResult,
                 fingerprints: dict[str, Any], apart: Sequence[str] = ()) -> None:
    root = Path(result.path)
    apart = [name for name in apart if name in type(parsed).model_fields]
    header = {
        "parser": parser.name,
        "version": parser.version,
        "format": _CACHE_FORMAT,
        "exit_code": result.exit_code,
        "settings": result.settings,
        "fingerprints": fingerprints,
        "apart": apart,
    }
    fields = set(apart)
    tmp = root / f".{CACHE_FILE}.{os.getpid()}"
    try:
        tmp.write_text(json.dumps(header) + "\n" + parsed.model_dump_json(exclude=fields)
                       + "\n" + (parsed.model_dump_json(include=fields) if fields else "{}")
                       + "\n", encoding="utf-8")
        os.replace(tmp, root / CACHE_FILE)
    except OSError:  # a read-only results tree still parses, just without a cache
        tmp.unlink(missing_ok=True)


def _force_from_env() -> bool:
    return env_settings().force_reparse


def parse_one(result: ResultDir, parser: ResultParser, *, force: bool | None = None,
              use_cache: bool = True, trust_cache: bool = False,
              apart: Sequence[str] = (), skip: Sequence[str] = ()) -> ParsedResult:
    """Parse one result dir, through the cache unless ``force``.

    Args:
        result: The dir, as discovered.
        parser: The project's parser.
        force: Ignore any cache; None: as ``TELLTALE_FORCE_REPARSE`` says.
        use_cache: Read and write the cache at all.
        trust_cache: Accept a cache of the right parser version without checking the
            fingerprints (the source files may be absent, e.g. after a cache-only download).
        apart: Bulky fields the cache stores on a line of their own (the project's
            ``bulky``), so that a later read can skip them.
        skip: Fields the caller does not need: a cache that stores them apart is read
            without them (they keep their defaults); a fresh parse still has them.

    Returns:
        The typed result; problems inside it, never an exception for a bad file.
    """
    if force is None:
        force = _force_from_env()
    if use_cache and not force:
        cached = _load_cached(result, parser, trust_cache, skip)
        if cached is not None:
            return cached
    reader = FileReader(result.path)
    parsed = parser.parse(result, reader)
    if reader.problems:
        parsed = parsed.model_copy(update={"problems": [*parsed.problems, *reader.problems]})
    if use_cache:
        _store_cache(result, parser, parsed, reader.fingerprints, apart)
    return parsed


def _parse_chunk(project: str, results: list[ResultDir], force: bool,
                 use_cache: bool, apart: Sequence[str]) -> list[bytes]:
    from analysis.project import load_project  # in the worker process

    parser = load_project(project).parser
    # JSON bytes, not dicts: pickling thousands of small objects and validating them again
    # in the parent cost more than pydantic's Rust (de)serialisation on both sides
    return [parse_one(r, parser, force=force, use_cache=use_cache,
                      apart=apart).model_dump_json().encode() for r in results]


def parse_dirs(results: Sequence[ResultDir], parser: ResultParser, *, project: str | None = None,
               force: bool = False, use_cache: bool = True,
               workers: int | None = None, trust_cache: bool = False,
               then: Callable[[int, ParsedResult], Any] | None = None,
               apart: Sequence[str] = (), skip_before: int = 0) -> list[Any]:
    """Parse many result dirs, in parallel processes when there are enough of them.

    Args:
        results: Discovered dirs.
        parser: The project's parser (used in this process).
        project: Project name, so worker processes can load the same parser; without it
            everything is parsed in this process.
        force: Ignore caches.
        use_cache: Read and write caches.
        workers: Worker processes (default: CPU count).
        trust_cache: See `parse_one`.
        then: Called with (index, result) as each result arrives; its return value takes
            the result's place. Post-processing analyses and slims each run here, so the
            full parsed results of 10 000 dirs are never all in memory at once.
        apart: Bulky fields (the project's ``bulky``) the caches store apart (`parse_one`).
        skip_before: Results before this index may come without the ``apart`` fields
            (read from a cache that stores them apart: they keep their defaults).

    Returns:
        Results (or what ``then`` made of them) in the order of ``results``.
    """
    emit: Callable[[int, ParsedResult], Any] = then or (lambda _index, result: result)
    force = force or _force_from_env()  # asked once here, not once per dir
    workers = workers or os.cpu_count() or 1

    def skip(index: int) -> Sequence[str]:
        return apart if index < skip_before else ()

    if project is None or workers <= 1 or len(results) < _PARALLEL_MIN:
        return [emit(i, parse_one(r, parser, force=force, use_cache=use_cache,
                                  trust_cache=trust_cache, apart=apart, skip=skip(i)))
                for i, r in enumerate(results)]
    # Warm dirs are cheap: serve them here and send only the cold ones to workers.
    parsed: dict[int, Any] = {}
    cold: list[int] = []
    for index, result in enumerate(results):
        cached = None if (force or not use_cache) else _load_cached(
            result, parser, trust_cache, skip(index))
        if cached is not None:
            parsed[index] = emit(index, cached)
        else:
            cold.append(index)
    if len(cold) < _PARALLEL_MIN:
        for index in cold:
            parsed[index] = emit(index, parse_one(results[index], parser, force=True,
                                                  use_cache=use_cache, apart=apart))
    else:
        size = max(1, len(cold) // (workers * 4))
        chunks = [cold[i:i + size] for i in range(0, len(cold), size)]
        import multiprocessing

        context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [pool.submit(_parse_chunk, project, [results[i] for i in chunk], True,
                                   use_cache, tuple(apart)) for chunk in chunks]
            for chunk, future in zip(chunks, futures, strict=True):
                for index, data in zip(chunk, future.result(), strict=True):
                    parsed[index] = emit(index, parser.result_model.model_validate_json(data))
    return [parsed[i] for i in range(len(results))]
