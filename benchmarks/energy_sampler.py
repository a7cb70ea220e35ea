"""What the local platform's energy sampling costs: CPU time per sample and per second.

    python benchmarks/energy_sampler.py [--zones 2] [--samples 2000]

Reads a RAPL powercap tree made in a temporary folder (this machine's own is not readable)
through `tasks.observe.energy.RaplMeter`, as the recorder does every 0.25 s, and prints the
CPU time of one sample and the share of one core the recorder takes at its rate. NVML's
cost is the driver's (a few µs a query on a real GPU, per NVIDIA's documentation of
``nvmlDeviceGetPowerUsage``); it is not measurable without one.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.observe.energy import _SAMPLE_S, EnergyRecorder, RaplMeter  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zones", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(args.zones):
            zone = root / f"intel-rapl:{i}"
            zone.mkdir()
            (zone / "name").write_text(f"package-{i}\n")
            (zone / "energy_uj").write_text("123456789\n")
            (zone / "max_energy_range_uj").write_text("262143328850\n")
        recorder = EnergyRecorder([RaplMeter(root)], interval_s=3600)
        start = time.process_time()
        for _ in range(args.samples):
            recorder.sample()
        per_sample = (time.process_time() - start) / args.samples
    print(f"RAPL, {args.zones} package(s): {per_sample * 1e6:.0f} µs CPU a sample; at one "
          f"sample every {_SAMPLE_S} s: {per_sample / _SAMPLE_S * 100:.3f} % of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
