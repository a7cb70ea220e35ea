"""Which labels and KPIs make a project's load curve (`analysis.curve` judges it).

Apart from `analysis.curve` so that a project's declaration (`analysis.project`), read by
every command line before it runs anything, does not import pandas with the judging code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CurveSpec"]


@dataclass(frozen=True)
class CurveSpec:
    """Which labels and KPIs make a project's curve.

    Attributes:
        load: The load label (``concurrency``).
        throughput: A higher-better KPI (``output_tokens_per_second``).
        latency: A lower-better KPI (``ttft_p95``).
        meets: A KPI that is 1 when the load met the SLO, 0 when not (None: no knee).
        latency_cap: The SLO's bound on ``latency`` from a curve's labels (None: no
            frontier KPI), in the latency KPI's unit.
        point_z: How far (pooled noise units) a load must move to be named.
        min_history: Earlier curves needed before a verdict.
        max_history: Newest earlier curves used.
    """

    load: str
    throughput: str
    latency: str
    meets: str | None = None
    latency_cap: Callable[[dict[str, str]], float | None] | None = None
    point_z: float = 3.0
    min_history: int = 3
    max_history: int = 30
