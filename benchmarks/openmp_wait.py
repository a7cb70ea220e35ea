"""The light trainer quiet and beside busy processes, under each OpenMP wait policy.

    python benchmarks/openmp_wait.py [--runs 3] [--busy 6] [--policies default,PASSIVE]

libgomp (torch's OpenMP runtime) lets an idle worker thread spin before it sleeps
(``OMP_WAIT_POLICY``; ``GOMP_SPINCOUNT`` bounds the spin). On a quiet machine spinning is the
fastest; beside busy processes the spinning threads take the CPU the others need, and each
parallel region waits for a thread the scheduler put off. The test suite runs four workers
on two cores, so its trainers and vLLM servers run ``PASSIVE`` (tests/conftest.py); the
product keeps libgomp's default, because a measurement is only valid on a quiet machine.

One light run (``python -m flows.fine_tuning --preset light``) writes the trainer's config;
then the trainer alone (a fresh process, as `main_job.py` times it) runs ``--runs`` times per
policy, quiet and beside ``--busy`` pure-Python busy loops (load ~``--busy`` on the machine),
alternating the policies. Prints the median wall and training time of each and the ratio
of each policy to the default.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from main_job import REPO, _cli, _trainer_config  # noqa: E402

TRAIN_RUNTIME = re.compile(r"train_runtime\W+([0-9.]+)")


def _trainer(config: Path, env: dict[str, str]) -> tuple[float, float]:
    """The trainer alone: its wall and its ``train_runtime`` (the 60 steps themselves)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "projects.fine_tuning.workload.train_local",
                           str(config)], cwd=REPO, env=env, check=True, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    found = TRAIN_RUNTIME.findall(proc.stdout + proc.stderr)
    if not found:
        raise SystemExit("openmp_wait: the trainer printed no train_runtime")
    return wall, float(found[-1])


def _busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> int:
    """Measure and print; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=int, default=6, help="busy loops beside the loaded runs")
    parser.add_argument("--policies", default="default,PASSIVE",
                        help="OMP_WAIT_POLICY values to compare; 'default' leaves it unset")
    args = parser.parse_args()
    policies = args.policies.split(",")
    with tempfile.TemporaryDirectory(prefix="telltale-openmp-wait-") as scratch:
        tmp = Path(scratch)
        base = {key: value for key, value in os.environ.items()
                if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        env = {**base, "TELLTALE_DATA_DIR": str(tmp / "data"),
               "TELLTALE_PREFECT_API": "temporary", "PREFECT_HOME": str(tmp / "prefect"),
               "TELLTALE_SPARE_PROMETHEUS_MINUTES": "0", "TELLTALE_WARM_PYTHON_MINUTES": "0"}
        env.pop("PREFECT_API_URL", None)
        _, run_dir = _cli(tmp, "run-0", env)
        config = _trainer_config(run_dir, tmp)
        figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for setting in ("quiet", f"beside {args.busy} busy loops"):
            loops = _busy_loops(args.busy) if setting != "quiet" else []
            try:
                for _ in range(args.runs):
                    for policy in policies:  # alternately: the machine's drift hits all alike
                        policy_env = dict(env)
                        if policy != "default":
                            policy_env["OMP_WAIT_POLICY"] = policy
                        figures.setdefault((setting, policy), []).append(
                            _trainer(config, policy_env))
            finally:
                for loop in loops:
                    loop.kill()
                    loop.wait()
    print(f"the light trainer alone, {os.cpu_count()} CPU(s), median of {args.runs}:")
    for (setting, policy), runs in figures.items():
        wall = statistics.median(w for w, _ in runs)
        train = statistics.median(t for _, t in runs)
        reference = figures[(setting, policies[0])]
        ratio = wall / statistics.median(w for w, _ in reference)
        print(f"  {setting:24s} {policy:8s} wall {wall:6.2f} s  training {train:6.2f} s  "
              f"wall {ratio:5.2f}x {policies[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
