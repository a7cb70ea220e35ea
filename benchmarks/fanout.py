"""Local fan-out cost: orchestration overhead per user and barrier release skew.

    python benchmarks/fanout.py [--users 10 100 200] [--scenario-s 0.2] [--repeat 3]

Scenario: every user sleeps ``--scenario-s`` seconds (trivial on purpose: what is measured is
the fan-out itself). Overhead per user = (wall time - scenario time) / users. Skew = each
user's barrier release time minus the first release (p50, p99). Goals (issue #9): <= 5 ms
overhead per user; p99 skew <= 100 ms at 100 users.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tasks.platforms.fanout import run_local_fanout  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, nargs="+", default=[10, 100, 200])
    parser.add_argument("--scenario-s", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'users':>6} {'wall s':>8} {'overhead/user ms':>17} {'skew p50 ms':>12} "
          f"{'skew p99 ms':>12}")
    for users in args.users:
        walls, p50s, p99s = [], [], []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                result = run_local_fanout(users, tmp, [f"sleep:{args.scenario_s}"])
                walls.append(time.perf_counter() - start)
                assert result.success_count == users
                p50s.append(result.release_skew_p50_ms or 0.0)
                p99s.append(result.release_skew_p99_ms or 0.0)
        wall = statistics.median(walls)
        overhead = (wall - args.scenario_s) / users * 1000
        print(f"{users:>6} {wall:>8.2f} {overhead:>17.2f} {statistics.median(p50s):>12.1f} "
              f"{statistics.median(p99s):>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
