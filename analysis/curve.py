"""A load sweep judged as one curve: its knee, its frontier, and one verdict for its shape.

A *curve* is the cells of one run (the ``run_id`` label) that differ only in their load
label (``concurrency``): one point per load with the project's throughput and latency KPIs
and whether the load met its SLO. Its history is the curves of earlier runs with the same
other labels (the configuration's ignored labels may differ, as for every KPI).

Curve KPIs (higher is better):

- ``knee_load``: the highest load such that it and every lower load met the SLO (0: even
  the lowest did not);
- ``throughput_at_knee``: the throughput measured at that load (0 without a knee);
- ``frontier_throughput``: the area under the throughput–latency frontier up to the SLO's
  latency bound, divided by that bound: the best throughput reachable within a latency
  budget, averaged over every budget from 0 to the bound (a server faster anywhere below the
  bound scores higher). None without a bound.

Each is judged against the same KPI of the earlier curves by `analysis.regression.verdict`
(with its MDE), like any KPI.

**The shape verdict** (`judge_points`): each load's latency and throughput are compared
with that load's values in the earlier curves (median, log scale), in units of the noise
*pooled* over every load and both KPIs (one noise estimate from many runs, not a fragile one
per point). A load is *moved* when both its KPIs moved ``point_z`` (3) or more the same
way (latency up and throughput down: worse); the strongest moved load sets the direction
(``regression`` or ``improvement``), the verdict names the range of the loads moved that
way and gives each point's change with its 95 % interval. A run noisy everywhere moves no
load far enough in one direction to be called; a server slower only near saturation is one
verdict naming that range, not one per cell.

Pure functions over KPI tables (`analysis.kpi.kpi_table` rows with their labels as
columns); no Prefect.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from analysis.curve_spec import CurveSpec
from analysis.history import RUN_COLUMNS, usable_rows
from analysis.kpi import BASE_COLUMNS
from analysis.lts import LtsCurve
from analysis.power import minimum_detectable_effect
from analysis.regression import DEFAULTS, DetectorSettings, verdict

__all__ = ["CURVE_KPIS", "BandPoint", "CurveResult", "CurveSpec", "CurveVerdict", "PointChange",
           "curve_kpi_rows", "curve_kpis", "curves_of", "judge_curves", "judge_points",
           "load_span", "lts_curve"]

RUN_LABEL = "run_id"
MAX_KPI_HISTORY = 500
"""Earlier curves a curve KPI's verdict reads (the newest): a KPI verdict's own window."""
CURVE_KPIS = {"knee_load": "Highest load meeting the SLO (it and every lower one)",
              "throughput_at_knee": "Throughput at the knee",
              "frontier_throughput": "Best throughput within a latency budget, averaged over "
                                     "budgets up to the SLO's latency bound"}


class PointChange(BaseModel):
    """One load's change against its history (log-scale, as %)."""

    load: float
    kpi: str
    latest: float
    baseline: float
    change_pct: float
    low_pct: float = Field(description="95 % interval of the change, low end.")
    high_pct: float
    z: float = Field(description="Worse-direction z-score (positive: worse).")


class BandPoint(BaseModel):
    """The history of one load's KPI: its median and the ±2 pooled-noise SD band."""

    load: float
    kpi: str
    median: float
    low: float
    high: float


class CurveVerdict(BaseModel):
    """The curve's shape against its history: one verdict for the whole sweep."""

    kind: Literal["regression", "improvement", "unchanged", "insufficient_history"]
    loads: list[float] = Field(default_factory=list, description="The moved loads.")
    load_range: tuple[float, float] | None = None
    points: list[PointChange] = Field(default_factory=list)
    history_curves: int = 0
    noise_pct: float | None = Field(default=None, description="Pooled noise, one SD (%).")
    explanation: str = ""


class CurveResult(BaseModel):
    """One curve of this run: its points, KPIs, their verdicts and the shape verdict."""

    group: dict[str, str]
    run_id: str
    run_uuids: list[str] = Field(default_factory=list, description="The curve's cells.")
    timestamp: str | None = None
    points: list[dict[str, float | None]] = Field(default_factory=list)
    kpis: dict[str, float | None] = Field(default_factory=dict)
    kpi_verdicts: dict[str, dict[str, Any]] = Field(default_factory=dict)
    verdict: CurveVerdict
    band: list[BandPoint] = Field(default_factory=list, description="Per load and KPI: "
                                  "the history's median and ±2 noise SD band.")

    def group_text(self) -> str:
        """The curve's labels as read: ``model_name=tiny · prompt_tokens=128`` (no empty ones)."""
        return " · ".join(f"{k}={v}" for k, v in self.group.items() if v and v != "nan")


@dataclass
class Curve:
    """The points of one run's curve: load → {KPI: value}, in load order.

    Plain dicts, not a frame a curve: a thousand small frames cost a second to build.
    """

    group: tuple[tuple[str, str], ...]
    run_id: str
    timestamp: pd.Timestamp | None
    points: dict[float, dict[str, float]] = field(default_factory=dict)
    run_uuids: tuple[str, ...] = ()


def _label_columns(frame: pd.DataFrame, spec: CurveSpec, ignored: Iterable[str]) -> list[str]:
    skip = {*BASE_COLUMNS, *RUN_COLUMNS, *ignored, spec.load, RUN_LABEL, "test_path", "_load"}
    return sorted(c for c in frame.columns if c not in skip)


def curves_of(frame: pd.DataFrame, spec: CurveSpec, ignored_labels: Iterable[str] = ()
              ) -> list[Curve]:
    """Every curve in a KPI table: rows grouped by run and by every other label.

    Rows without a run id, a numeric load or one of the two KPIs are left out; a run with
    fewer than two loads is not a curve.
    """
    needed = {spec.load, RUN_LABEL, "kpi", "value", "run_uuid"}
    if frame.empty or not needed <= set(frame.columns):
        return []
    kpis = [k for k in (spec.throughput, spec.latency, spec.meets) if k]
    rows = frame[frame["kpi"].isin(kpis) & frame[RUN_LABEL].notna()
                 & (frame[RUN_LABEL].astype(str) != "")]
    rows = rows.assign(_load=pd.to_numeric(rows[spec.load], errors="coerce")).dropna(
        subset=["_load"])
    if rows.empty:
        return []
    labels = _label_columns(rows, spec, ignored_labels)
    keys = [RUN_LABEL, *labels]
    # one pivot for every curve (a pivot per run cost ~10 ms: 10 s for 1 000 runs)
    # an unset label is one value whether empty or absent (`analysis.history.matched_labels`)
    rows = rows.assign(**{k: rows[k].astype("string").fillna("").astype(str) for k in keys},
                       timestamp=pd.to_datetime(rows["timestamp"], utc=True, errors="coerce"))
    wide = rows.pivot_table(index=[*keys, "_load"], columns="kpi", values="value",
                            aggfunc="median", observed=True)
    if spec.throughput not in wide.columns or spec.latency not in wide.columns:
        return []
    wide = wide.dropna(subset=[spec.throughput, spec.latency])
    by_run = rows.groupby(keys, sort=False)
    stamps, cells = by_run["timestamp"].min(), by_run["run_uuid"].unique()
    flat = wide.reset_index()
    loads = flat["_load"].to_numpy(dtype=float)
    columns = {k: flat[k].to_numpy(dtype=float) for k in wide.columns}
    out: list[Curve] = []
    for key, where in flat.groupby(keys, sort=False).indices.items():
        if len(where) < 2:
            continue
        values = key if isinstance(key, tuple) else (key,)
        points = {float(loads[i]): {k: float(v[i]) for k, v in columns.items()
                                    if not math.isnan(v[i])}
                  for i in sorted(where, key=lambda i: loads[i])}
        index = values if len(keys) > 1 else values[0]
        stamp = stamps.get(index)
        out.append(Curve(group=tuple(zip(labels, values[1:], strict=True)),
                         run_id=str(values[0]),
                         timestamp=stamp if stamp is not None and not pd.isna(stamp) else None,
                         points=points, run_uuids=tuple(str(u) for u in cells.get(index, ()))))
    out.sort(key=lambda c: (c.timestamp is None, c.timestamp or pd.Timestamp(0, tz="UTC")))
    return out


def curve_kpis(curve: Curve, spec: CurveSpec) -> dict[str, float | None]:
    """``knee_load``, ``throughput_at_knee`` and ``frontier_throughput`` of one curve."""
    points = curve.points
    out: dict[str, float | None] = {name: None for name in CURVE_KPIS}
    if spec.meets and all(spec.meets in p for p in points.values()):
        knee, at_knee = 0.0, 0.0
        for load, point in points.items():
            if point[spec.meets] < 0.5:
                break
            knee, at_knee = load, point[spec.throughput]
        out["knee_load"], out["throughput_at_knee"] = knee, at_knee
    cap = spec.latency_cap(dict(curve.group)) if spec.latency_cap else None
    if cap and cap > 0:
        ordered = sorted(points.values(), key=lambda p: p[spec.latency])
        best, area = 0.0, 0.0
        latencies = [*(p[spec.latency] for p in ordered), math.inf]
        for i, point in enumerate(ordered):
            if latencies[i] >= cap:
                break
            best = max(best, point[spec.throughput])
            area += best * (min(latencies[i + 1], cap) - latencies[i])
        out["frontier_throughput"] = area / cap
    return out


def _pooled_noise(groups: Sequence[np.ndarray]) -> float:
    """One noise SD for every load and KPI: the pooled variance around each one's mean.

    Residuals beyond 4 robust SDs (an outlier run in the history) are clipped first; the
    divisor is the degrees of freedom (``n - 1`` a group): deviations from a fitted centre
    are smaller than the noise, and a median's MAD made the noise a third too low at 8
    runs. A small floor: a perfectly repeatable history must not make every wobble a change.
    """
    residuals = np.concatenate([g - g.mean() for g in groups])
    robust = 1.4826 * float(np.median(np.abs(residuals)))
    if robust > 0:
        residuals = np.clip(residuals, -4 * robust, 4 * robust)
    dof = sum(len(g) - 1 for g in groups)
    return max(math.sqrt(float(np.sum(residuals ** 2)) / max(dof, 1)), 1e-3)


def _log(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    return np.log(np.where(array > 0, array, np.nan))


def judge_points(current: Curve, history: Sequence[Curve], spec: CurveSpec
                 ) -> tuple[CurveVerdict, list[BandPoint]]:
    """The shape verdict of ``current`` against earlier curves, and the history's band."""
    recent = list(history)[-spec.max_history:]
    if len(recent) < spec.min_history:
        return CurveVerdict(kind="insufficient_history", history_curves=len(recent),
                            explanation=f"{len(recent)} earlier curve(s); verdicts start "
                            f"with {spec.min_history}"), []
    kpis = ((spec.latency, 1.0), (spec.throughput, -1.0))  # sign: + is worse
    groups: list[np.ndarray] = []
    stats: dict[tuple[float, str], tuple[float, int]] = {}
    for load in current.points:
        for kpi, _ in kpis:
            past = _log([c.points[load][kpi] for c in recent
                         if kpi in c.points.get(load, {})])
            past = past[np.isfinite(past)]
            if len(past) < spec.min_history:
                continue
            stats[(float(load), kpi)] = (float(np.median(past)), len(past))
            groups.append(past)
    if not stats:
        return CurveVerdict(kind="insufficient_history", history_curves=len(recent),
                            explanation="no load of this curve has enough history"), []
    sigma = _pooled_noise(groups)
    band: list[BandPoint] = []
    changes: list[PointChange] = []
    moved: dict[float, float] = {}
    for load, point in current.points.items():
        zs = []
        for kpi, sign in kpis:
            got = stats.get((float(load), kpi))
            if got is None:
                continue
            centre, n = got
            scale = sigma * math.sqrt(1 + 1 / n)
            band.append(BandPoint(load=float(load), kpi=kpi, median=math.exp(centre),
                                  low=math.exp(centre - 2 * sigma),
                                  high=math.exp(centre + 2 * sigma)))
            latest = point.get(kpi, math.nan)
            if not latest > 0:
                continue
            delta = math.log(latest) - centre
            z = sign * delta / scale
            zs.append(z)
            changes.append(PointChange(
                load=float(load), kpi=kpi, latest=latest, baseline=math.exp(centre),
                change_pct=round(math.expm1(delta) * 100, 3),
                low_pct=round(math.expm1(delta - 1.96 * scale) * 100, 3),
                high_pct=round(math.expm1(delta + 1.96 * scale) * 100, 3), z=round(z, 3)))
        if len(zs) == len(kpis) and min(abs(z) for z in zs) >= spec.point_z and \
                len({np.sign(z) for z in zs}) == 1:
            # both KPIs of one load, far, one way: a slower server at a load has its latency
            # up *and* its throughput down; noise moves them independently (a run twice as
            # noisy as its history moves one load this way in ~4.5 % of runs, one as noisy
            # in ~0.0005 %)
            moved[float(load)] = sum(zs) / math.sqrt(len(zs))
    noise = round(math.expm1(sigma) * 100, 3)
    if not moved:
        return CurveVerdict(kind="unchanged", points=changes, history_curves=len(recent),
                            noise_pct=noise, explanation="no load moved beyond "
                            f"{spec.point_z:g} pooled noise SD"), band
    # the strongest load sets the direction; loads that moved the other way are named in
    # the explanation, not in the range (a real change and a noise flag elsewhere)
    strongest = max(moved.values(), key=abs)
    other = sorted(load for load, score in moved.items() if np.sign(score) != np.sign(strongest))
    moved = {load: score for load, score in moved.items() if load not in other}
    kind: Literal["regression", "improvement"] = "regression" if strongest > 0 \
        else "improvement"
    loads = sorted(moved)
    return CurveVerdict(
        kind=kind, loads=loads, load_range=(loads[0], loads[-1]), points=changes,
        history_curves=len(recent), noise_pct=noise,
        explanation=f"{kind} at {spec.load} {load_span(loads)} (of "
                    f"{load_span(sorted(current.points))}) against "
                    f"{len(recent)} earlier curve(s)" + (
                        f"; {spec.load} {', '.join(f'{x:g}' for x in other)} moved the other "
                        "way" if other else "")), band


def load_span(loads: Sequence[float]) -> str:
    """Sorted loads (or a verdict's ``load_range``) as a range: ``8–16``, or ``8`` alone."""
    return f"{loads[0]:g}" if loads[0] == loads[-1] else f"{loads[0]:g}–{loads[-1]:g}"


def judge_curves(current: pd.DataFrame, history: pd.DataFrame | None, spec: CurveSpec,
                 ignored_labels: Iterable[str] = (),
                 settings: DetectorSettings = DEFAULTS) -> list[CurveResult]:
    """Every curve of the current runs, its KPIs and verdicts against the history's curves.

    Args:
        current: This post-processing's KPI rows (invalid runs' rows are left out).
        history: The whole history (its valid rows count; the current runs' rows in it are
            left out of their own baseline).
        spec: The project's curve.
        ignored_labels: Labels that may differ within a history.
        settings: The KPI verdicts' detector settings.
    """
    ignored = list(ignored_labels)
    mine = curves_of(usable_rows(current) if "validity" in current.columns else current,
                     spec, ignored)
    if not mine:
        return []
    past_rows = usable_rows(history) if history is not None and not history.empty else None
    earlier = curves_of(past_rows, spec, ignored) if past_rows is not None else []
    out = []
    for curve in mine:
        before = [c for c in earlier if c.group == curve.group and c.run_id != curve.run_id
                  and (curve.timestamp is None or c.timestamp is None
                       or c.timestamp < curve.timestamp)]
        shape, band = judge_points(curve, before, spec)
        kpis = curve_kpis(curve, spec)
        # each earlier curve's KPIs once (not once per KPI), the newest MAX_KPI_HISTORY
        earlier_kpis = [curve_kpis(c, spec) for c in before[-MAX_KPI_HISTORY:]] \
            if any(v is not None for v in kpis.values()) else []
        judged: dict[str, dict[str, Any]] = {}
        for name, value in kpis.items():
            series = [v for v in (k[name] for k in earlier_kpis) if v is not None]
            if value is None:
                continue
            found = verdict(series, value, "higher_better", settings=settings)
            mde = minimum_detectable_effect(series, settings=settings)
            judged[name] = {"kind": found.kind, "baseline": found.baseline,
                            "change_pct": round(found.magnitude * 100, 3)
                            if found.baseline is not None else None,
                            "mde_pct": round(mde * 100, 3) if mde is not None else None,
                            "history_used": found.history_used,
                            "explanation": found.explanation}
        out.append(CurveResult(
            group=dict(curve.group), run_id=curve.run_id, run_uuids=list(curve.run_uuids),
            timestamp=curve.timestamp.isoformat() if curve.timestamp is not None else None,
            points=[{"load": load, **point} for load, point in curve.points.items()],
            kpis=kpis, kpi_verdicts=judged, verdict=shape, band=band))
    return out


def lts_curve(curve: CurveResult, spec: CurveSpec) -> LtsCurve:
    """The curve as its cells' LTS payloads carry it (OpenSearch, Horreum)."""
    shape = curve.verdict
    return LtsCurve(load=spec.load, verdict=shape.kind,
                    load_range=list(shape.load_range) if shape.load_range else None,
                    explanation=shape.explanation, history_curves=shape.history_curves,
                    kpis=dict(curve.kpis),
                    kpi_verdicts={k: str(v.get("kind")) for k, v in curve.kpi_verdicts.items()})


CURVE_POINT = "curve"
"""The load label's value on a curve KPI's row (`curve_kpi_rows`): the whole sweep."""


def curve_kpi_rows(frame: pd.DataFrame, spec: CurveSpec, ignored_labels: Iterable[str] = ()
                   ) -> pd.DataFrame:
    """Each curve's KPIs as KPI rows (one run per curve): what ``compare`` compares.

    A row has the curve's labels, its load label set to ``curve`` and its run id as run
    uuid, so the curve KPIs of two selections meet in one configuration.
    """
    units = frame.drop_duplicates("kpi").set_index("kpi")["unit"].to_dict() \
        if "unit" in frame.columns and not frame.empty else {}
    rows = []
    for curve in curves_of(frame, spec, ignored_labels):
        for name, value in curve_kpis(curve, spec).items():
            if value is None:
                continue
            rows.append({**dict(curve.group), "run_uuid": curve.run_id, "kpi": name,
                         "value": value, "timestamp": curve.timestamp,
                         "unit": spec.load if name == "knee_load"
                         else str(units.get(spec.throughput, "")),
                         "lower_better": False, "ignored_for_regression": False,
                         spec.load: CURVE_POINT, RUN_LABEL: curve.run_id})
    return pd.DataFrame(rows)
