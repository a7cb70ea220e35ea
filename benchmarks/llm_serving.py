"""What an llm_serving run costs, and whether its load generator measures the server.

    python benchmarks/llm_serving.py [--runs 2] [--preset light] [--var key=value ...]

Runs ``python -m flows.llm_serving --preset light`` as a user types it and prints, per run
and as medians:

- wall: the whole command (the Prefect API, prepare, server, load, analysis, cleanup);
- server start: vLLM's start to its ``/health`` answering 200 (``service.json``);
- load step: the cell's load step (GuideLLM's own start-up plus ``duration_s`` of load;
  forked from the serving venv's warm Python by default, ``TELLTALE_WARM_PYTHON_MINUTES=0``:
  a fresh load process);
- post-processing: the analysis step (parse, KPIs, regression, report);
- generator overhead: GuideLLM's mean request-generation delay as a share of the mean TTFT
  (the metric behind its "bottlenecked by the data generation" warning, threshold 1 %).

- server forked: 1 when the vLLM server was forked from its warm Python
  (`tasks.platforms.service_launch`: the first run starts it, later runs find it), 0 for a
  fresh server;
- TTFT and ITL means, and requests/s: what the run measured.

Goals: light preset <= 30 s wall (issue #43; #17 asked 90 s) including the server start;
generator overhead <= 1 % of TTFT.

``--ab``: every other run starts its server fresh (``TELLTALE_WARM_PYTHON_MINUTES=0``: its
load step is a fresh process too, which its KPIs, measured over the load window, do not
see), the others fork it; the medians are printed per group — does a forked server measure
what a fresh one does?
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


def one_run(root: Path, preset: str, extra: list[str], api_home: Path,
            fresh: bool = False) -> dict[str, float]:
    run_dir = root / "run"
    env = {**os.environ, "PREFECT_HOME": str(root / "prefect-home"),
           "TELLTALE_DATA_DIR": str(root / "data"), "TELLTALE_PREFECT_API_HOME": str(api_home),
           **({"TELLTALE_WARM_PYTHON_MINUTES": "0"} if fresh else {})}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "flows.llm_serving", "--preset", preset,
                           *extra, "--artifact-dir", str(run_dir)], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}):\n{done.stdout[-3000:]}"
                         f"{done.stderr[-3000:]}")
    service = json.loads(next(run_dir.glob("services/*/service.json")).read_text())
    job = next(run_dir.glob("*__cell/*__run_llm_serving_load"))
    load = json.loads((job / "step.json").read_text())["duration_s"]
    post = json.loads(next(run_dir.glob("*__analysis__postprocess_results/step.json"))
                      .read_text())["duration_s"]
    launch = json.loads((job / "artifacts" / "process.json").read_text())["launch"]
    print(f"load step launch: {launch}", flush=True)  # forked: GuideLLM imported ahead
    bench = json.loads((job / "artifacts" / "guidellm.json").read_text())["benchmarks"][0]
    delay = bench["scheduler_metrics"]["generation_delay"]["mean"]
    metrics = bench["metrics"]
    ttft_s = metrics["time_to_first_token_ms"]["successful"]["mean"] / 1000
    return {"wall_s": wall, "server_start_s": float(service["startup_s"]),
            "load_step_s": float(load), "postprocess_s": float(post),
            "generator_overhead_pct": 100 * delay / ttft_s, "ttft_mean_ms": ttft_s * 1000,
            "itl_mean_ms": float(metrics["inter_token_latency_ms"]["successful"]["mean"]),
            "requests_per_s": float(metrics["requests_per_second"]["successful"]["mean"]),
            "server_forked": float(str(service.get("launch", "")).startswith("forked"))}


def medians(rows: list[dict[str, float]], title: str) -> None:
    """Print the median of every column of ``rows``."""
    print(f"\n{title}:")
    for key in rows[0]:
        print(f"  {key:24s} {statistics.median(r[key] for r in rows):9.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--preset", default="light")
    parser.add_argument("--var", action="append", default=[], help="passed to the CLI")
    parser.add_argument("--ab", action="store_true",
                        help="alternate fresh and forked servers (see the docstring)")
    args = parser.parse_args()
    extra = [a for v in args.var for a in ("--var", v)]
    rows = []
    # the runs share one local Prefect API (as a user's later runs do), stopped at the end;
    # the first run pays its start
    with tempfile.TemporaryDirectory(prefix="llm-serving-bench-api-") as api_home:
        try:
            for index in range(args.runs):
                with tempfile.TemporaryDirectory(prefix="llm-serving-bench-") as tmp:
                    row = one_run(Path(tmp), args.preset, extra, Path(api_home),
                                  fresh=args.ab and index % 2 == 0)
                rows.append(row)
                print(f"run {index + 1}: " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()),
                      flush=True)
        finally:
            subprocess.run([sys.executable, "-m", "flows.local_api", "stop"], cwd=REPO,
                           env={**os.environ, "TELLTALE_PREFECT_API_HOME": api_home},
                           capture_output=True, check=False)
    medians(rows, "medians")
    if args.ab:
        for forked in (0.0, 1.0):
            group = [r for r in rows if r["server_forked"] == forked]
            if group:
                medians(group, f"{'forked' if forked else 'fresh'} servers ({len(group)})")
    wall = statistics.median(r["wall_s"] for r in rows)
    overhead = statistics.median(r["generator_overhead_pct"] for r in rows)
    floor = statistics.median(r["server_start_s"] + r["load_step_s"] for r in rows)
    print(f"\nwall vs #43's 30 s goal: {wall / 30:.2f}x; vs its floor (the server's start "
          f"plus the load step, {floor:.1f} s): {wall / floor:.2f}x; generator overhead vs "
          f"the 1 % goal: {overhead:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
