"""The regression detector's settings (`DetectorSettings`), apart from its numerics.

A config resolves its ``analysis`` block against these defaults (`analysis.settings`) on
every command line, a plan and a one-line user error too: here they import nothing but the
standard library, where `analysis.detector` (the statistics that use them) imports NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULTS", "DetectorSettings"]


@dataclass(frozen=True)
class DetectorSettings:
    """Tuning of the detector (see the module docstring for the meaning of each).

    Attributes:
        min_size: Minimum points per segment.
        window: Points on each side used to measure (and to place) a step.
        candidate_z: Penalty of one change in the segmentation, as ``(candidate_z *
            sigma)^2``.
        z_threshold: Validation threshold of a step, in standard errors.
        min_magnitude: Smallest relative step reported (0: none; a team's own floor,
            ``analysis.regression.min_change_pct``). A fixed 2 % floor was tuned to
            generators whose noise is over 1 %: on quiet benchmarks (noise 0.1-1 %) it hid
            most steps, however many noise units they were.
        outlier_z: Distance from the local median (noise units) that marks an outlier.
        max_outlier_share: Outliers are rare: a robust noise scale that marks more than
            this share of the runs reads sticky or quantised noise, not outliers.
        drift_z: The shared within-segment slope counts as drift (and is corrected for)
            beyond this many standard errors.
        drift_floor_z: Without significant drift, a step must still exceed the drift
            explanation by this many standard errors (0 disables).
        short_length: Series shorter than this get proportionally lower ``candidate_z`` and
            ``z_threshold`` (times ``ln n / ln short_length``): fewer places for a false step
            to hide, so less multiple-testing protection is needed (0 disables).
        log_scale: Analyse positive series in log space (multiplicative noise).
        locate_radius: A change is placed where the likelihood mass within this many runs
            is largest (0: the least-squares optimum).
        min_history: Historical points needed for a verdict.
        verdict_z: Threshold of the newest level's shift, in standard errors.
        baseline_window: Points of the current segment used as the verdict baseline.
        confirm_factor: The newest run must deviate the same way by this fraction of
            ``verdict_z`` for its level's shift to count.
        recent_runs: A shift is news (regression or improvement) when its level began at
            most this many runs ago.
        verdict_drift_z: The verdict's baseline follows the history's drift beyond this
            many standard errors.
        edge_z: A level that began in the last (or first) ``min_size - 1`` runs of a series,
            too short a segment for the segmentation, counts as a change point beyond this
            many standard errors (inf: never).
        edge_short_factor: Series shorter than ``short_length`` lower ``edge_z`` like the
            other thresholds, but by at most this factor: the edge test looks at a few tail
            lengths, not at every place of the series.
        suspect_z: The newest run alone (no repeats) is a ``suspect`` beyond this many
            standard errors from the current level, either way (inf: never). Chosen for at
            most 3 % of stable runs suspected (docs/performance.md).
        spread_ratio: A change of spread is reported (a change point; ``noisier`` when it
            grew) when the noise's standard deviation changed by this factor or more.
        spread_z: Validation threshold (and segmentation penalty) of a spread change, in
            standard errors of its ``|diff| ** SPREAD_POWER`` level.
        noisier_z: The ``noisier`` verdict's threshold (a spread change among the last
            ``spread_recent`` runs): lower than ``spread_z``, because it asks one question
            about the recent runs, where ``spread_z`` marks change points anywhere in a
            whole history (measured: spread increases reported 0.50 -> 0.80 at 0.07 ->
            0.47 % of stable runs, change-point F1 unchanged; docs/performance.md).
        spread_recent: ``noisier`` is the verdict while the spread's change began at most
            this many runs ago.
        periodic: Test each series for a periodic component (`analysis.seasonality`) and
            segment it without that component.
        excursion_z: A run of 2 to ``min_size - 1`` runs, each beyond this many noise units
            on one side of the level around it, is a short excursion (a regression fixed
            soon after it landed: two change points; `analysis.excursions`; inf: never).
        excursion_alpha: ...when noise alone would make one as long at most this many
            times in the series (read from the series' own share of runs that far out).
        drift_choice_weight: When validated steps may have absorbed a drift (a staircase
            of same-sign steps), a drift with fewer steps replaces them only if its
            penalised cost is lower, each parameter of either model costing this share of
            the segmentation's penalty. At 1 a staircase of three 1-2 SD steps lost to a
            line whenever its sawtooth around the line (``n h^2 / 12``) was under two
            steps' penalty: all three steps or none (issue #41). 0.5 keeps each validated
            step on its own evidence more often (families' ``staircase`` F1 0.643 -> 0.701
            and ``drift`` 0.647 -> 0.640 on 120 series each, seed 3; docs/performance.md).
        periodic_verdict_extra_z: A history judged against its wave (`analysis.seasonality`)
            needs this many standard errors more than ``verdict_z`` for a regression or an
            improvement: the wave at the newest runs is an extrapolation whose error the
            shift's standard error leaves out (measured: false alarms of the families'
            ``sine``, ``wave`` and ``seasonal``, 50 series each, 1.32 % -> 0.97 % a stable
            run, their event recall and first-run flags unchanged; docs/performance.md).
    """

    min_size: int = 5
    window: int = 80
    candidate_z: float = 4.5
    z_threshold: float = 4.5
    min_magnitude: float = 0.0
    outlier_z: float = 5.0
    max_outlier_share: float = 0.1
    drift_z: float = 2.0
    drift_floor_z: float = 2.5
    short_length: int = 200
    log_scale: bool = True
    locate_radius: int = 2
    min_history: int = 3
    verdict_z: float = 2.4
    baseline_window: int = 30
    confirm_factor: float = 0.5
    recent_runs: int = 5
    verdict_drift_z: float = 4.0
    edge_z: float = 4.5
    edge_short_factor: float = 0.7
    suspect_z: float = 2.7
    spread_ratio: float = 1.5
    spread_z: float = 3.0
    noisier_z: float = 2.3
    spread_recent: int = 20
    periodic: bool = True
    excursion_z: float = 3.5
    excursion_alpha: float = 0.01
    drift_choice_weight: float = 0.5
    periodic_verdict_extra_z: float = 0.5


DEFAULTS = DetectorSettings()
