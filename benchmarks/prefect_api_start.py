"""A local Prefect API's start on a new home: migrated there, or seeded from a kept copy.

    python benchmarks/prefect_api_start.py [--runs 5]

Each run starts the shared local API's server (``python -m flows.local_api serve``, as a
command-line run does) on a new Prefect home and waits for its ``state.json`` (written once
it answers). ``migrate``: no template in its cache (``XDG_CACHE_HOME``: a new dir), so the
server creates its database (Alembic's migrations, the block types) and keeps a copy;
``seeded``: the cache holds that copy, and the database is seeded from it
(`core.prefect_seed`). Prints the medians of the wall time and of the server's CPU time
until it answered, and their ratios.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tasks.process import free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def start_once(home: Path, cache: Path) -> tuple[float, float]:
    """Start a server on ``home`` with templates in ``cache``; (wall s, CPU s) until ready."""
    directory = home / "telltale-api"
    directory.mkdir(parents=True)
    env = {**os.environ, "PREFECT_HOME": str(home), "XDG_CACHE_HOME": str(cache),
           "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "flows.local_api", "serve", str(directory),
                               str(free_port()), "600"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (directory / "state.json").exists():
            if server.poll() is not None:
                raise SystemExit(f"the server exited with {server.returncode}")
            if time.perf_counter() - started > 240:
                raise SystemExit("the server did not answer within 240 s")
            time.sleep(0.02)
        return time.perf_counter() - started, _cpu_s(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"migrate": [], "seeded": []}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        kept = tmp / "kept-cache"
        for i in range(args.runs):
            # alternating, so that a slow stretch of the machine weighs on both
            results["migrate"].append(start_once(tmp / f"m{i}", tmp / f"empty-cache-{i}"))
            if i == 0:
                (tmp / "empty-cache-0").rename(kept)  # what the first migrate kept
            results["seeded"].append(start_once(tmp / f"s{i}", kept))
    wall = {k: statistics.median(w for w, _ in v) for k, v in results.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in results.items()}
    for name in results:
        print(f"{name:8} wall {wall[name]:6.2f} s  server CPU {cpu[name]:6.2f} s  "
              f"(median of {args.runs})")
    print(f"seeded / migrate: wall x{wall['seeded'] / wall['migrate']:.2f}, "
          f"CPU x{cpu['seeded'] / cpu['migrate']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
