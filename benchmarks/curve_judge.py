"""What judging a sweep as one curve costs, by history length (post-processing's share).

    python benchmarks/curve_judge.py [--runs 30,300,1000] [--repeat 5]

A history of ``runs`` earlier sweeps (5 loads, 3 KPIs a load, like llm_serving's) and one
new sweep; prints the median time of `analysis.curve.judge_curves` (curves, curve KPIs and
their verdicts, the shape verdict) and its ratio to the same history's rows read from a
Parquet file (the floor every verdict pays).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.curve import CurveSpec, judge_curves  # noqa: E402

LOADS = (1, 2, 4, 8, 16)
SPEC = CurveSpec(load="concurrency", throughput="output_tokens_per_second",
                 latency="ttft_p95", meets="slo_met", latency_cap=lambda labels: 400.0)


def _rows(runs: int, rng: np.random.Generator) -> pd.DataFrame:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for run in range(runs):
        for load in LOADS:
            throughput = 50.0 * load / (1 + load / 8) * np.exp(rng.normal(0, 0.03))
            latency = 100.0 * (1 + load ** 2 / 64) * np.exp(rng.normal(0, 0.03))
            for kpi, value in (("output_tokens_per_second", throughput),
                               ("ttft_p95", latency), ("slo_met", float(latency <= 400))):
                rows.append({"run_uuid": f"r{run}-{load}", "kpi": kpi, "value": value,
                             "timestamp": start + timedelta(hours=run), "unit": "",
                             "lower_better": kpi == "ttft_p95",
                             "ignored_for_regression": False, "validity": "valid",
                             "run_id": f"run-{run}", "concurrency": str(load),
                             "model_name": "tiny", "slo": "ttft_ms<=400"})
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="30,300,1000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for runs in (int(x) for x in args.runs.split(",")):
        frame = _rows(runs + 1, rng)
        current = frame[frame["run_id"] == f"run-{runs}"]
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            judge_curves(current, frame, SPEC)
            times.append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "h.parquet"
            frame.to_parquet(path)
            reads = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                pd.read_parquet(path)
                reads.append(time.perf_counter() - start)
        judged, read = statistics.median(times), statistics.median(reads)
        print(f"{runs:>5} earlier sweeps ({len(frame):>6} rows): judge_curves "
              f"{judged * 1000:7.1f} ms, {judged / read:5.1f}x reading the rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
