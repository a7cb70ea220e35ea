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

The cache also keeps the engine's own readings of the dir (`EngineInputs`: the environment
fingerprint and what the validity checks read), with the files and listings they read among
its fingerprints: a warm post-processing then checks their stamps instead of reading and
parsing them again (they were ~0.8 s of a warm 1 000-dir run).

Over 500 lines: how many dirs are served, and by which process (this one, a child beside
it, an early child from the first dir on, workers for the cold ones: `parse_dirs`,
`serve_claimed`), reads the cache's private format, so it stays beside the cache.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from analysis.discovery import ResultDir

# the reader's public names are part of the parsing contract (``__all__``)
from analysis.file_reader import (
    MAX_FILE_BYTES,
    MAX_LINE_CHARS,
    FileReader,
    ParseProblem,
    _listdir,
    read_tail,
)
from analysis.fingerprint import fingerprint_of
from analysis.validity import MachineInputs, read_machine_inputs
from core.environment import env_settings
from core.forked import Claims, beside, can_fork
from core.safeio import RefusedInput, open_stream, write_bytes

__all__ = [
    "BESIDE_MAX_RUNS",
    "CACHE_FILE",
    "FORCE_ENV",
    "EngineInputs",
    "MAX_FILE_BYTES",
    "MAX_LINE_CHARS",
    "FileReader",
    "ParseProblem",
    "ParsedResult",
    "ResultParser",
    "Helper",
    "Served",
    "engine_inputs",
    "parse_dirs",
    "parse_one",
    "read_engine_inputs",
    "read_tail",
]
CACHE_FILE = ".telltale_parse_cache.json"
FORCE_ENV = "TELLTALE_FORCE_REPARSE"
_PARALLEL_MIN = 16  # below this many dirs, worker start-up costs more than it saves
_WARM_WINDOW = 2048  # warm dirs served at a time, some of them beside (`parse_dirs`)
BESIDE_MAX_RUNS = 2_500
"""Up to this many result dirs, post-processing works on both cores (`core.forked`): the
end of each warm window parsed beside, then the tables, the report and the tree's stamps.
A child copies every page of its parent it touches (a read writes an object's reference
count): at 10 000 runs the processes held 468 MB together (PSS) against 279 MB on one core,
over #43's 300 MB, and 347 MB with the parse alone beside. Above it only the memo's stamps
and the discovery run beside (taken at the start, from a small parent)."""
_BESIDE_SHARE = 0.44
"""The share of a window served beside: this process also takes in each of the child's
answers (unpickled, its payload spooled); with half, it waited ~40 ms of 1 000 dirs."""
_CACHE_FORMAT = 3  # 2: bulky fields on a line of their own; 3: the engine's inputs


class EngineInputs(BaseModel):
    """What the engine reads of a result dir besides the project's parse."""

    fingerprint: dict[str, str] = Field(default_factory=dict)
    machine: MachineInputs = Field(default_factory=MachineInputs)


def read_engine_inputs(path: str, fingerprints: dict[str, Any] | None = None) -> EngineInputs:
    """Read a dir's `EngineInputs`; what they depend on goes into ``fingerprints``."""
    return EngineInputs(fingerprint=fingerprint_of(path, fingerprints),
                        machine=read_machine_inputs(path, fingerprints))


def engine_inputs(result: ParsedResult) -> EngineInputs:
    """The result's `EngineInputs`: kept from its parse (or its cache), else read now."""
    kept = getattr(result, "_engine", None)
    return kept if isinstance(kept, EngineInputs) else read_engine_inputs(result.path)


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
    _engine: Any = PrivateAttr(default=None)  # `EngineInputs`, kept by the parse cache

    @property
    def failed(self) -> bool:
        """True when the run itself failed (it is still parsed and reported)."""
        return self.exit_code != 0


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
        # lstat, as the reader fingerprints: a file swapped for a link re-parses
        try:
            st = os.lstat(f"{root}/{rel}")
        except OSError:
            if expected is None:  # was missing, still missing
                continue
            return False
        if expected is None:
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
    try:  # the one reader: a FIFO or a link planted as the cache is refused, not waited on
        with open_stream(f"{result.path}/{CACHE_FILE}") as stream:
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
            engine = EngineInputs.model_validate(header.get("engine") or {})
            body = stream.readline().rstrip(b"\n")
            apart = set(header.get("apart") or ())
            if not skip or not set(skip) <= apart:
                body = _joined(body, stream.readline().rstrip(b"\n"))
            parsed = parser.result_model.model_validate_json(body)
            parsed._engine = engine
            return parsed
    except (OSError, ValueError, ValidationError, RefusedInput):
        return None


def _joined(body: bytes, rest: bytes) -> bytes:
    """One JSON object of two with disjoint fields (the cache's body and its fields apart)."""
    if rest in (b"", b"{}"):
        return body
    return body[:-1] + (b"," if body != b"{}" else b"") + rest[1:]


def _store_cache(result: ResultDir, parser: ResultParser, parsed: ParsedResult,
                 fingerprints: dict[str, Any], apart: Sequence[str] = (),
                 engine: EngineInputs | None = None) -> tuple[bytes, bytes]:
    """Write the dir's cache; return its two JSON objects: without the fields apart, those."""
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
        "engine": engine.model_dump(mode="json") if engine is not None else None,
    }
    fields = set(apart)
    body = parsed.model_dump_json(exclude=fields).encode()
    rest = parsed.model_dump_json(include=fields).encode() if fields else b"{}"
    try:
        write_bytes(root / CACHE_FILE,
                    json.dumps(header).encode() + b"\n" + body + b"\n" + rest + b"\n",
                    durable=False)  # a cache: made again when lost
    except OSError:  # a read-only (or link-planted) results tree parses without a cache
        pass
    return body, rest


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
    return _parse_fresh(result, parser, use_cache, apart)[0]


def _parse_fresh(result: ResultDir, parser: ResultParser, use_cache: bool,
                 apart: Sequence[str], lean: bool = False) -> tuple[ParsedResult, bytes]:
    """Parse a dir (no cache read), store it when ``use_cache``; the result and its JSON.

    ``lean``: the JSON leaves out the ``apart`` fields (see `parse_dirs`' ``skip_before``).
    """
    reader = FileReader(result.path)
    parsed = parser.parse(result, reader)
    if reader.problems:
        parsed = parsed.model_copy(update={"problems": [*parsed.problems, *reader.problems]})
    # the engine's readings, their files stamped among the parse's (a later change to any of
    # them re-reads the whole dir)
    parsed._engine = read_engine_inputs(result.path, reader.fingerprints)
    if not use_cache:
        fields = set(apart) if lean else None
        return parsed, parsed.model_dump_json(exclude=fields).encode()
    body, rest = _store_cache(result, parser, parsed, reader.fingerprints, apart,
                              parsed._engine)
    return parsed, body if lean else _joined(body, rest)


def _parse_chunk(parser: ResultParser, results: list[ResultDir], use_cache: bool,
                 apart: Sequence[str], lean: list[bool]) -> list[tuple[bytes, bytes]]:
    """Parse cold dirs afresh in a worker process (the parent served the warm ones).

    Each dir's result and `EngineInputs`, as JSON.

    The parser travels pickled (a project's parser is a module-level class: ~60 bytes).
    """
    # JSON bytes, not dicts: pickling thousands of small objects and validating them again
    # in the parent cost more than pydantic's Rust (de)serialisation on both sides; lean
    # ones without their bulky fields, which the parent validated only to drop (~0.3 ms a
    # dir, the parent's whole share of a cold parse)
    out = []
    for result, thin in zip(results, lean, strict=True):
        parsed, data = _parse_fresh(result, parser, use_cache, apart, thin)
        out.append((data, parsed._engine.model_dump_json().encode()))
    return out


Served = tuple[list[tuple[int, Any]], list[int]]
"""Warm dirs a helper served (`serve_claimed`): (index, what ``then`` made of it) for each
warm one, then the indices of those found cold."""


@dataclass(frozen=True)
class Helper:
    """A forked child serving a tree's warm dirs from the first on: the early parse.

    The child serves with `serve_claimed` while `parse_dirs` serves from the last down.
    ``finish`` gives the child's answer once the two ends met (or it stopped); None when it
    served nothing.
    """

    claims: Claims
    finish: Callable[[], Served | None]

    def dismiss(self) -> None:
        """Stop the child and drop whatever it served (made for another analysis)."""
        self.claims.stop()
        self.finish()


def serve_claimed(results: Sequence[ResultDir], parser: ResultParser,
                  then: Callable[[int, ParsedResult], Any], claim: Callable[[], int | None], *,
                  apart: Sequence[str] = (), skip_before: int = 0, trust_cache: bool = False,
                  take: Callable[[int, Any], None] | None = None) -> Served:
    """Serve the warm dirs ``claim()`` gives, until it gives None: a `Helper`'s answer.

    Each warm dir's value is given to ``take`` as it is made (without it: returned). A dir
    whose ``then`` raises ends the serving there (it was claimed, not served): `parse_dirs`
    serves it again, in index order, and raises the same error where one process serving
    every dir in order raises its first. Nothing is served when a forced parse was asked
    for (``TELLTALE_FORCE_REPARSE``).
    """
    served: list[tuple[int, Any]] = []
    missed: list[int] = []
    if _force_from_env():
        return served, missed
    while (index := claim()) is not None:
        cached = _load_cached(results[index], parser, trust_cache,
                              apart if index < skip_before else ())
        if cached is None:
            missed.append(index)
            continue
        try:
            value = then(index, cached)
        except Exception:  # noqa: BLE001 - raised again where parse_dirs serves it
            break
        if take is not None:
            take(index, value)
        else:
            served.append((index, value))
    return served, missed


def parse_dirs(results: Sequence[ResultDir], parser: ResultParser, *, project: str | None = None,
               force: bool = False, use_cache: bool = True,
               workers: int | None = None, trust_cache: bool = False,
               then: Callable[[int, ParsedResult], Any] | None = None,
               after: Callable[[int, Any], Any] | None = None,
               apart: Sequence[str] = (), skip_before: int = 0,
               helper: Helper | None = None) -> list[Any]:
    """Parse many result dirs, in parallel processes when there are enough of them.

    Args:
        results: Discovered dirs.
        parser: The project's parser (used in this process).
        project: Project name: given, cold dirs may be parsed in worker processes (the
            parser is sent to them pickled); without it everything is parsed in this
            process.
        force: Ignore caches.
        use_cache: Read and write caches.
        workers: Worker processes (default: CPU count).
        trust_cache: See `parse_one`.
        then: Called with (index, result) as each result arrives; its return value takes
            the result's place. Post-processing analyses and slims each run here, so the
            full parsed results of 10 000 dirs are never all in memory at once. It may run
            in a child beside this process (half of each window of warm dirs,
            `core.forked`): what it returns must pickle, and what it changes in memory
            stays there — keep that for ``after``.
        after: Called here with (index, what ``then`` made of it); its return value takes
            that place. Once an index, in no set order (a helper's from the last down,
            then each window's share, then the cold ones).
        apart: Bulky fields (the project's ``bulky``) the caches store apart (`parse_one`).
        skip_before: Results before this index may come without the ``apart`` fields
            (read from a cache that stores them apart, or parsed in a worker process: they
            keep their defaults).
        helper: A child serving the warm dirs from the first on with this ``then`` (the
            caller vouches for that): this process serves them from the last down until
            the two meet, then takes the child's in (an index both served, once); the
            cold ones are parsed with the others. Dismissed when forced or without the
            caches.

    Returns:
        Results (or what ``then`` made of them) in the order of ``results``.
    """
    made: Callable[[int, ParsedResult], Any] = then or (lambda _index, result: result)
    arrived: Callable[[int, Any], Any] = after or (lambda _index, value: value)

    force = force or _force_from_env()  # asked once here, not once per dir
    workers = workers or os.cpu_count() or 1
    parsed: dict[int, Any] = {}
    cold: list[int] = []
    todo: Sequence[int] = range(len(results))

    def skip(index: int) -> Sequence[str]:
        return apart if index < skip_before else ()

    if helper is not None and (force or not use_cache):
        helper.dismiss()
    elif helper is not None:  # this side serves from the last down (the child stops where
        # an analysis raised here as well: claims meet)

        def take_now(index: int, value: Any) -> None:
            parsed[index] = arrived(index, value)

        cold.extend(serve_claimed(
            results, parser, made, functools.partial(helper.claims.back, len(results)),
            apart=apart, skip_before=skip_before, trust_cache=trust_cache, take=take_now)[1])
        theirs = helper.finish()
        done = {*parsed, *cold}
        for index, value in theirs[0] if theirs else ():
            if index not in done:  # an index both claimed: this process's answer stands
                parsed[index] = arrived(index, value)
        cold.extend(i for i in (theirs[1] if theirs else ()) if i not in done)
        done = {*parsed, *cold}
        # what neither served (the child stopped at a dir whose analysis raised): below
        todo = [i for i in todo if i not in done]

    if project is None or workers <= 1 or len(results) < _PARALLEL_MIN:
        for i in sorted([*cold, *todo]):
            parsed[i] = arrived(i, made(i, parse_one(
                results[i], parser, force=force, use_cache=use_cache,
                trust_cache=trust_cache, apart=apart, skip=skip(i))))
        return [parsed[i] for i in range(len(results))]
    # Warm dirs are cheap: serve them here and send only the cold ones to workers.

    def serve(indices: Sequence[int], take: Callable[[int, Any], None] | None = None
              ) -> tuple[list[tuple[int, Any]], list[int]]:
        """What ``then`` makes of the warm dirs of ``indices``; the cold ones' indices.

        Each is given to ``take`` as it is made (without it: returned, a child's answer).
        """
        served: list[tuple[int, Any]] = []
        missed: list[int] = []
        for index in indices:
            cached = None if (force or not use_cache) else _load_cached(
                results[index], parser, trust_cache, skip(index))
            if cached is None:
                missed.append(index)
            elif take is not None:
                take(index, made(index, cached))
            else:
                served.append((index, made(index, cached)))
        return served, missed

    def take(index: int, value: Any) -> None:
        parsed[index] = arrived(index, value)

    # The end of each window is served beside this process, on the other core
    # (`core.forked`; 0.14 s of a 1 000-dir post-processing's 0.32 s of warm parse): a
    # window bounds what a child's answer holds in memory at once. This process takes in
    # its own share as it is made (a run's payload is spooled at once).
    split = not force and use_cache and len(results) <= BESIDE_MAX_RUNS and can_fork()
    for start in range(0, len(todo), _WARM_WINDOW):
        window = todo[start:start + _WARM_WINDOW]
        theirs = int(len(window) * _BESIDE_SHARE) if split and \
            len(window) >= 2 * _PARALLEL_MIN else 0
        mine = window[:len(window) - theirs]
        with beside(serve, window[len(mine):]) if theirs else nullcontext() as child:
            cold.extend(serve(mine, take)[1])
            if child is not None:
                result_served, missed = child.result()
                for index, value in result_served:
                    take(index, value)
                cold.extend(missed)
    if len(cold) < _PARALLEL_MIN:
        for index in cold:
            parsed[index] = arrived(index, made(index, parse_one(
                results[index], parser, force=True, use_cache=use_cache, apart=apart)))
    else:
        # small chunks: the last ones end close together (a 125-dir chunk left one core
        # idle for ~0.3 s at the end of 1 000 cold dirs)
        size = max(4, len(cold) // (workers * 16))
        chunks = [cold[i:i + size] for i in range(0, len(cold), size)]
        import multiprocessing

        context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [pool.submit(_parse_chunk, parser, [results[i] for i in chunk],
                                   use_cache, tuple(apart), [i < skip_before for i in chunk])
                       for chunk in chunks]
            for chunk, future in zip(chunks, futures, strict=True):
                for index, (data, engine) in zip(chunk, future.result(), strict=True):
                    result = parser.result_model.model_validate_json(data)
                    result._engine = EngineInputs.model_validate_json(engine)
                    parsed[index] = arrived(index, made(index, result))
    return [parsed[i] for i in range(len(results))]
