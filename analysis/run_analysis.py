"""Analysing a result tree's runs: parse, validity, KPIs and LTS payload of each run.

One `RunAnalysis` per result dir (`analyse_run`), then the tree's (`_analyse_tree`): runs
that share a uuid are refused, and the payloads of older runs are slimmed to what their
history needs (`KEEP_BULKY` keeps the bulky fields of the newest).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, Field

from analysis.construct import constructor
from analysis.discovery import Discovery, SkippedDir, discover
from analysis.fingerprint import Fingerprint
from analysis.kpi import Kpi, compute_kpis, label_strings
from analysis.lts import LtsKpi, LtsMetadata, LtsPayload, require_complete
from analysis.parsing import (
    Helper,
    ParsedResult,
    Served,
    engine_inputs,
    parse_dirs,
    serve_claimed,
)
from analysis.project import AnalysisProject
from analysis.settings import ValidityPolicy
from analysis.validity import MachineInputs, Validity, judge_validity
from core.errors import ResultsError
from core.forked import Claims
from core.progress import StageProgress
from core.redact import redact

if TYPE_CHECKING:
    import pandas as pd

# No pandas here at import: the command line's early parse analyses runs with this module
# beside its own import of pandas (`analysis.cli`); only `runs_table` and the rare
# time `_usable_time` cannot read without it import it.


class RunAnalysis(BaseModel):
    """Everything computed for one result dir."""

    result: ParsedResult
    run_uuid: str
    timestamp: str | None
    labels: dict[str, str]
    kpis: list[Kpi]
    payload: LtsPayload | None = Field(description="The run's LTS payload; None once "
                                       "post-processing has spooled it to disk (~1.7 KB a "
                                       "run held, `analysis.pipeline`).")
    status: Literal["success", "failed", "partial"] = Field(
        default="success", description="The run's status, as its payload says.")
    start: str | None = Field(default=None, description="Its start (ISO), as its payload says.")
    end: str | None = Field(default=None, description="Its end (ISO), as its payload says.")
    presets: list[str] | None = Field(default=None, description="Its presets, as its payload "
                                      "says.")
    identity: str = Field(description="Hash of the settings and start (the history refuses "
                          "another run under this uuid).")
    validity: Validity = Field(default_factory=Validity)
    fingerprint: Fingerprint = Field(default_factory=dict)
    cell: str | None = Field(default=None, description="The cell's name (its ``cell.json``).")

    @property
    def name(self) -> str:
        """The run as every output names it: its cell's name, else its dir (relative)."""
        return self.cell or self.result.rel_path


_new_run = constructor(RunAnalysis)  # one fields set for every run (`analysis.construct`)


def _status(result: ParsedResult) -> Literal["success", "failed", "partial"]:
    if result.exit_code != 0:
        return "failed"
    return "partial" if result.problems else "success"


_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(2200, 1, 1, tzinfo=UTC)
_ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?"
                       r"(?:Z|[+-]\d{2}:\d{2})?)?", re.ASCII)
"""The ISO 8601 times runs write, read without pandas; anything else goes through pandas."""


def _usable_time(text: Any) -> Any:
    """A run's start or end as read from its tree, or None when it is not a usable time.

    Result trees are untrusted: a start in year 9999 overflowed every nanosecond timestamp
    the history and verdicts use. Times outside 1970-2200 are treated as unknown. What
    ``pd.Timestamp`` reads is usable; the plain ISO forms are read by the standard library
    (the same answer: a test generates both), others by pandas.
    """
    if text is None:
        return None
    if isinstance(text, str) and _ISO_TIME.fullmatch(text):
        try:
            stamp = datetime.fromisoformat(text)
        except ValueError:  # a 13th month: pandas has the last word
            return _usable_by_pandas(text)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        return text if _EARLIEST <= stamp < _LATEST else None
    return _usable_by_pandas(text)


def _usable_by_pandas(text: Any) -> Any:
    """`_usable_time` for what only ``pd.Timestamp`` reads."""
    import pandas as pd

    try:
        stamp = pd.Timestamp(text)
    except (ValueError, TypeError, OverflowError):
        return None
    if stamp.tzinfo is None:
        stamp = stamp.tz_localize("UTC")
    return text if pd.Timestamp(_EARLIEST) <= stamp < pd.Timestamp(_LATEST) else None


def run_identity(settings: Any, start: str | None) -> str:
    """A run's identity: the hash of its settings and start time (16 hex characters)."""
    text = json.dumps([settings, start], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _timestamp(start: str | None, result: ParsedResult) -> str:
    if start:
        return start
    try:
        mtime = (Path(result.path) / "exit_code").stat().st_mtime
    except OSError:
        mtime = datetime.now(UTC).timestamp()
    return datetime.fromtimestamp(mtime, UTC).isoformat()


def result_validity(project: AnalysisProject, result: ParsedResult,
                    policy: ValidityPolicy, machine: MachineInputs | None = None) -> Validity:
    """One result's validity: the engine's checks on its dir and the project's own.

    ``machine``: what the engine's checks read, when already read (`engine_inputs`).
    """
    window = None
    if project.measured_window is not None and result.exit_code == 0:
        try:
            window = project.measured_window(result)
        except (TypeError, ValueError, AttributeError, KeyError):
            window = None
    checks = project.validity
    return judge_validity(result.path, result.exit_code, policy,
                          project_reasons=(lambda: checks(result)) if checks else None,
                          measured_window_s=window, min_window_s=project.min_window_s,
                          machine=machine)


def analyse_run(project: AnalysisProject, result: ParsedResult,
                presets: Sequence[str] | None = None, config_text: str | None = None,
                policy: ValidityPolicy | None = None, *, cell: str | None = None
                ) -> RunAnalysis:
    """Compute labels, KPIs, validity, fingerprint and the LTS payload of one result.

    ``cell`` is the cell's name from discovery (`ResultDir.cell`): what outputs call it.
    """
    labels = label_strings(project.labels(result))
    kpis = compute_kpis(project.kpis, result, labels)  # its KPIs share this dict
    start, end = (_usable_time(t) for t in project.timestamps(result))
    run_uuid = project.run_uuid(result)
    if not isinstance(run_uuid, str):
        raise TypeError(f"the project's run uuid is {type(run_uuid).__name__}, not a string")
    parsed_presets = getattr(result, "presets", None)
    engine = engine_inputs(result)  # kept by the parse cache: not read again when warm
    validity = _shared_validity(result_validity(project, result, policy or ValidityPolicy(),
                                                engine.machine))
    fingerprint = engine.fingerprint
    metadata = LtsMetadata(
        project=project.name, run_uuid=run_uuid, start=start, end=end,
        presets=list(presets) if presets is not None else parsed_presets,
        config=config_text if config_text is not None else getattr(result, "config_text", None),
        settings=redact(result.settings), exit_code=result.exit_code, status=_status(result),
        test_path=result.rel_path, validity=validity.status,
        validity_reasons=validity.reasons, fingerprint=fingerprint,
    )
    payload = LtsPayload(
        metadata=metadata, results=project.results_summary(result),
        kpis={k.name: LtsKpi.from_kpi(k) for k in kpis},
        problems=[f"{p.file}{f':{p.line}' if p.line else ''}: {p.message}"
                  for p in result.problems],
    )
    # constructed: validation would copy the labels its KPIs share; every value is typed
    return _new_run(
        result=result, run_uuid=run_uuid, timestamp=_timestamp(start, result), labels=labels,
        kpis=kpis, payload=payload, identity=run_identity(result.settings, start),
        validity=validity, fingerprint=fingerprint, cell=cell, status=metadata.status,
        start=start, end=end, presets=metadata.presets)


def runs_table(runs: Sequence[RunAnalysis]) -> pd.DataFrame:
    """One row per run: identity, timing, status and where it lives, then its labels.

    Built column by column: a dict per run was ~2.3 KB (23 MB at 10 000 runs) for a
    table of 4 MB. A label a run lacks is missing (NA) on its row.
    """
    import pandas as pd

    columns: dict[str, list[Any]] = {name: [] for name in (
        "run_uuid", "start", "end", "status", "exit_code", "test_path", "cell", "presets",
        "problems")}
    for row, r in enumerate(runs):
        for name, value in (("run_uuid", r.run_uuid), ("start", r.start), ("end", r.end),
                            ("status", r.status), ("exit_code", r.result.exit_code),
                            ("test_path", r.result.rel_path), ("cell", r.name),
                            ("presets", ",".join(r.presets or [])),
                            ("problems", len(r.result.problems)), *r.labels.items()):
            column = columns.get(name)
            if column is None:  # a label first seen on this run: missing on the earlier
                column = columns[name] = [None] * row
            if len(column) > row:  # a label named as a column above wins, as in a dict
                column[row] = value
            else:
                column.append(value)
        for column in columns.values():
            if len(column) == row:  # a label this run lacks
                column.append(None)
    return pd.DataFrame(columns)


@dataclass(frozen=True)
class Analyser:
    """How each run of a tree is analysed: `parse_dirs`' ``then``, wherever it runs.

    `analyse_run`, then the payload encoded when ``mode`` is given (post-processing spools
    it: `Keep`), then the parsed result slimmed unless it is among the newest
    `KEEP_BULKY`. It may run beside the caller (`parse_dirs`, `serve_early`): it changes
    nothing of the caller's.
    """

    hooks: AnalysisProject
    found: Discovery
    presets: tuple[str, ...] | None
    config_text: str | None
    policy: ValidityPolicy
    mode: Literal["investigate", "cpt"] | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        """What the runs it makes depend on beyond the tree: equal keys, equal runs."""
        return (self.hooks.name, self.presets, self.config_text,
                self.policy.model_dump_json(), self.mode)

    def __call__(self, index: int, result: ParsedResult) -> _Analysed:
        """The run of ``results[index]``, parsed as ``result``: see the class."""
        failed, problems = result.exit_code != 0, len(result.problems)
        try:
            run = analyse_run(self.hooks, result, self.presets, self.config_text, self.policy,
                              cell=self.found.results[index].cell)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            # Result trees are untrusted: a badly typed field (numbers for strings, a
            # scalar for a mapping) is this run's problem, never the whole analysis's.
            return SkippedDir(path=result.path, reason=(
                f"labels/KPIs could not be computed: {type(exc).__name__}: {exc}")[:300]), \
                failed, problems, None
        data = None
        if self.mode is not None and run.payload is not None:
            data = encode_payload(run.payload, self.mode)
            run.payload = None  # encoded: the bytes travel, not the model
        if index < len(self.found.results) - KEEP_BULKY:
            run.result = _slimmed(run.result, self.hooks)
        return run, failed, problems, data


def encode_payload(payload: LtsPayload, mode: Literal["investigate", "cpt"]) -> bytes:
    """A run's payload as post-processing spools it: without the keys judging adds.

    Raises:
        ResultsError: cpt mode, and the payload is incomplete.
    """
    require_complete(payload, mode)
    return payload.model_dump_json(exclude={"regression", "curve"}).encode()


Keyed = tuple[tuple[Any, ...], Served]
"""A child's early serving (`serve_early`): the key of the `Analyser` it used, what it served."""


def _nothing() -> Keyed | None:
    return None


@dataclass(frozen=True)
class Prepared:
    """What a caller made of a tree before post-processing asked for it.

    Its discovery and, with ``claims``, a child serving its warm dirs from the first on
    (`serve_early`) while this process serves them from the last down; ``answer`` waits for
    what the child served. Its runs are taken in when its `Analyser`'s key is this
    analysis's, else served again here: the key comes with the runs, so the child hands
    the discovery over before it has loaded the project and read the settings.
    """

    discovery: Discovery
    claims: Claims | None = None
    answer: Callable[[], Keyed | None] = _nothing


def serve_early(analyser: Analyser, claims: Claims) -> Keyed:
    """Serve the tree's warm dirs from the first on, as ``claims`` gives them (a `Helper`'s).

    The command line's child does it beside the command's imports (`analysis.cli`),
    then beside its serving from the last down (`parse_dirs`' ``helper``). Returns the
    analyser's key with what was served.
    """
    results = analyser.found.results
    served: list[tuple[int, _Analysed]] = []

    def claim() -> int | None:
        # Its answer is pickled once it stops, while the command waits for it (~25 ms for
        # 500 runs): it stops that much earlier, leaving the command a dir for every
        # `_PICKLED_PER_DIR` it served, which the command serves meanwhile.
        return claims.front(len(results), leave=len(served) // _PICKLED_PER_DIR)

    _, missed = serve_claimed(
        results, analyser.hooks.parser, analyser, claim, apart=analyser.hooks.bulky,
        skip_before=len(results) - KEEP_BULKY,
        take=lambda index, value: served.append((index, value)))
    return analyser.key, (served, missed)


_PICKLED_PER_DIR = 8
"""Analysed runs the early child pickles in the time it analyses one warm dir (~0.05 ms
against ~0.45 ms a run of the fine_tuning project)."""


def _served_alike(answer: Callable[[], Keyed | None], key: tuple[Any, ...]) -> Served | None:
    """What a child served early, when it analysed as ``key`` says; None: served again."""
    given = answer()
    return given[1] if given is not None and given[0] == key else None


def _analyse_tree(results_dir: str | Path, hooks: AnalysisProject,
                  presets: Sequence[str] | None, config_text: str | None, *, force: bool,
                  trust_cache: bool, keep: Keep | None = None,
                  policy: ValidityPolicy | None = None, found: Discovery | None = None,
                  prepared: Prepared | None = None,
                  ) -> tuple[Discovery, list[RunAnalysis], list[SkippedDir], tuple[int, int]]:
    """Discover, parse and analyse every result dir of a tree (nothing written but caches).

    ``keep`` sees each analysed run as it arrives (its payload encoded, before its bulky
    fields are dropped): post-processing spools the LTS payload to disk there.
    ``found``: the tree's discovery when the caller made it already; ``prepared``: that
    and a child serving the warm dirs (`Prepared`).

    Returns the discovery (its root and skipped dirs: the result dirs it found are the runs
    now, ~2 KB a dir with their settings), the analysed runs, the skipped dirs and (failed
    runs, parse problems) counted over every parsed dir.

    Raises:
        ResultsError: No result dir, or no usable run.
    """
    if prepared is not None:
        found = prepared.discovery
    if found is None:
        found = discover(results_dir, project=hooks.name)
    if not found.results:
        reasons = "; ".join(f"{s.path}: {s.reason}" for s in found.skipped[:5])
        raise ResultsError(f"no result dir (settings.yaml + exit_code) under {results_dir}"
                           + (f" (skipped: {reasons})" if reasons else ""))
    total = len(found.results)
    counts = [0, 0]
    progress = StageProgress("parse", total)
    analyse = Analyser(hooks, found, tuple(presets) if presets is not None else None,
                       config_text, policy or ValidityPolicy(),
                       keep.mode if keep is not None else None)
    helper = None
    if prepared is not None and prepared.claims is not None:
        helper = Helper(prepared.claims, functools.partial(_served_alike, prepared.answer,
                                                           analyse.key))

    def arrived(index: int, analysed: _Analysed) -> RunAnalysis | SkippedDir:
        run, failed, problems, data = analysed
        progress.advance()
        counts[0] += failed
        counts[1] += problems
        if isinstance(run, RunAnalysis):
            if data is not None and keep is not None:
                keep.store(run, data)
            if index < total - KEEP_BULKY:
                _share_again(run, hooks)
        return run

    analysed = parse_dirs(found.results, hooks.parser, project=hooks.name, force=force,
                          trust_cache=trust_cache, then=analyse, after=arrived,
                          apart=hooks.bulky, skip_before=total - KEEP_BULKY, helper=helper)
    progress.finish()
    runs = [a for a in analysed if isinstance(a, RunAnalysis)]
    skipped = [*found.skipped, *(a for a in analysed if isinstance(a, SkippedDir))]
    _refuse_shared_uuids(runs)
    if not runs:
        raise ResultsError(f"no usable run under {results_dir}: "
                           + "; ".join(f"{s.path}: {s.reason}" for s in skipped[:5]))
    lean = Discovery.model_construct(root=found.root, results=[], skipped=found.skipped)
    return lean, runs, skipped, (counts[0], counts[1])


class Keep(Protocol):
    """What `_analyse_tree` does with each run's LTS payload (post-processing's spool)."""

    mode: Literal["investigate", "cpt"]
    """The payloads' mode: each is encoded as `encode_payload` says, where it is analysed."""

    def store(self, run: RunAnalysis, data: bytes) -> None:
        """Keep ``data`` for ``run``; run in the caller, in order."""


_Analysed = tuple["RunAnalysis | SkippedDir", bool, int, bytes | None]
"""An analysed dir as it travels from `parse_dirs`' ``then`` to its ``after``: the run (or
why it was skipped), whether it failed, its parse problems, its encoded payload."""


def _refuse_shared_uuids(runs: Sequence[RunAnalysis]) -> None:
    """Two result dirs of one tree with one ``.uuid`` would store one run's rows twice.

    Raises:
        ResultsError: Naming the uuid and the dirs that share it.
    """
    seen: dict[str, str] = {}
    for run in runs:
        path = run.result.rel_path or run.result.path
        first = seen.setdefault(run.run_uuid, path)
        if first != path:
            raise ResultsError(f"result dirs {first} and {path} share the run uuid "
                               f"{run.run_uuid} (.uuid): give each run its own")


KEEP_BULKY = 40
"""Runs (the last in discovery order) that keep their bulky parsed fields for the report."""


def _slimmed(result: ParsedResult, hooks: AnalysisProject) -> ParsedResult:
    """``result`` without the project's bulky and analysis-only fields.

    Its KPIs and payload are computed: ~8 KB a fine_tuning run, 80 MB over 10 000 runs.
    The emptied fields share one default value per model field (read-only by convention):
    a fresh empty loss curve, timeline... per run was still ~3 KB.
    """
    model = type(result)
    drop = {name: _empty(model, name) for name in (*hooks.bulky, *hooks.analysis_only)
            if name in model.model_fields and not model.model_fields[name].is_required()}
    # what model_copy(update=...) makes, without its copies of the fields set (~1.2 KB a
    # run: 12 MB over 10 000) and of the private values: the parsed result is dropped here
    slim = model.__new__(model)
    _set(slim, "__dict__", {**result.__dict__, **drop,
                            "settings": _shared_settings(result.settings)})
    _set(slim, "__pydantic_fields_set__",
         _shared_fields(result.__pydantic_fields_set__ | drop.keys()))
    _set(slim, "__pydantic_extra__", result.__pydantic_extra__)
    _set(slim, "__pydantic_private__", {**(result.__pydantic_private__ or {}),
                                        "_engine": None})  # read into the run already
    return slim


def _share_again(run: RunAnalysis, hooks: AnalysisProject) -> None:
    """A slimmed run that crossed from a child (`parse_dirs`) shares this process's values.

    Unpickled, its fields set, settings, emptied fields and validity are copies of its own
    (pickle shares them only within one child's answer): slimmed again, they are the ones
    every run here shares. A run slimmed in this process already is left as it is.
    """
    names = run.result.__pydantic_fields_set__
    if names is _FIELD_SETS.get(frozenset(names)):
        return
    run.result = _slimmed(run.result, hooks)
    run.validity = _shared_validity(run.validity)


_set = object.__setattr__
_FIELD_SETS: dict[frozenset[str], set[str]] = {}


def _shared_fields(names: set[str]) -> set[str]:
    """One fields set for equal fields sets (read-only by convention).

    Every slimmed result of a project has the same; pydantic adds to it only when a field is
    assigned, which nothing does to a slimmed result.
    """
    return _FIELD_SETS.setdefault(frozenset(names), set(names))


_T = TypeVar("_T")
_SHARED: dict[tuple[str, Hashable], Any] = {}


def _shared(kind: str, key: Hashable, value: _T) -> _T:
    """One object for the equal ``value``s of a kind (read-only by convention).

    The runs of a configuration repeat their settings and validity; each run held its own
    copies (~1.8 KB a run: 18 MB over 10 000). Labels are not shared: each run's name one
    (``test_path``). Bounded: a long-lived process (a
    Prefect worker) analyses many trees.
    """
    if len(_SHARED) > 16_384:
        _SHARED.clear()
    return _SHARED.setdefault((kind, key), value)  # type: ignore[no-any-return]


def _shared_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """One dict for equal settings (~1.3 KB a run)."""
    try:
        key = json.dumps(settings, sort_keys=True)
    except (TypeError, ValueError):  # a value JSON has no type for (a YAML date): not shared
        return settings
    return _shared("settings", key, settings)


def _shared_validity(validity: Validity) -> Validity:
    """One `Validity` for equal ones: most runs are valid, with no reason (~0.5 KB a run)."""
    return _shared("validity", (validity.status, tuple(validity.reasons)), validity)


@functools.cache
def _empty(model: type[ParsedResult], name: str) -> Any:
    """The default of ``model.name``, made once (shared by every slimmed result)."""
    return model.model_fields[name].get_default(call_default_factory=True)
