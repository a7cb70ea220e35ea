"""What the run's own Prometheus costs: the light preset with and without it.

    python benchmarks/prometheus_overhead.py [--pairs 3] [--var key=value ...]

Runs ``python -m flows.fine_tuning --preset light`` as a user types it, alternating
``observe.prometheus.mode=on`` and ``off`` (so drift of this machine's speed hits both
alike), and prints each run's wall time and workload time (the trainer's own, from
``process.json``), the medians, and the ratios. Two costs are told apart: the wall-time delta
(start, the wait for the first scrape, capture, snapshot, stop) and the workload's slowdown
(the scrapes competing for the 2 cores while it trains).

Goal (issue #18): wall-time delta <= 5 % on the light preset.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one_run(mode: str, root: Path, index: int, extra: list[str]) -> tuple[float, float]:
    """(wall seconds, workload seconds) of one light-preset CLI run."""
    run_dir = root / f"{mode}-{index}"
    env = {**os.environ, "PREFECT_LOGGING_TO_API_ENABLED": "false"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flows.fine_tuning", "--preset", "light",
                           "--var", f"observe.prometheus.mode={mode}", *extra,
                           "--artifact-dir", str(run_dir)],
                          cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{mode} run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    work = sum(json.loads(p.read_text())["duration_s"] for p in
               run_dir.glob("*__cell/*__run_fine_tuning_job/artifacts/process.json"))
    return wall, work


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--var", action="append", default=[],
                        help="more config overrides for both modes (key=value)")
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.pairs):
            for mode in ("off", "on") if index % 2 else ("on", "off"):
                wall, work = one_run(mode, Path(tmp), index,
                                     [a for v in args.var for a in ("--var", v)])
                results[mode].append((wall, work))
                print(f"{mode:3s} run {index}: wall {wall:6.2f} s, workload {work:6.2f} s",
                      flush=True)
    med = {mode: (statistics.median(w for w, _ in runs), statistics.median(k for _, k in runs))
           for mode, runs in results.items()}
    (wall_on, work_on), (wall_off, work_off) = med["on"], med["off"]
    print(f"median wall     : on {wall_on:6.2f} s, off {wall_off:6.2f} s, "
          f"delta {wall_on - wall_off:+.2f} s = {100 * (wall_on / wall_off - 1):+.1f} % "
          "(goal <= 5 %)")
    print(f"median workload : on {work_on:6.2f} s, off {work_off:6.2f} s, "
          f"delta {100 * (work_on / work_off - 1):+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
