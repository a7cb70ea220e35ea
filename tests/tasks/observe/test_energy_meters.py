"""The energy meters: NVML through the real binding and a stand-in driver library, RAPL
through the bounded reader on a powercap tree, the recorder's series file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from tasks.observe.energy import EnergyRecorder, RaplMeter, meters, record_energy, write_series
from tests.servers.nvml import build_nvml_standin

REPO = Path(__file__).resolve().parents[3]


def _zone(root: Path, name: str, label: str, energy_uj: int, wrap: int) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(label + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{wrap}\n")
    return zone


def test_rapl_counters_are_read_in_joules_and_unwrapped(tmp_path: Path) -> None:
    """A package counter that wraps keeps growing; subzones (cores, dram) are not added."""
    package = _zone(tmp_path, "intel-rapl:0", "package-0", 999_000_000, 1_000_000_000)
    _zone(tmp_path, "intel-rapl:0:0", "core", 5, 1_000_000_000)
    meter = RaplMeter(tmp_path)
    first = meter.read()
    assert [(r.query, r.labels, r.value) for r in first] == [
        ("cpu_energy_joules", {"zone": "package-0"}, pytest.approx(999.0))]
    (package / "energy_uj").write_text("2000000\n")  # wrapped at 1 000 J: 1 003 J in all
    assert meter.read()[0].value == pytest.approx(1002.0)
    (package / "energy_uj").write_text("5000000\n")
    assert meter.read()[0].value == pytest.approx(1005.0)
    # read backwards by less than half the range: a bad sample, never a wrap of 1 000 J
    (package / "energy_uj").write_text("4000000\n")
    assert meter.read() == []
    (package / "energy_uj").write_text("6000000\n")
    assert meter.read()[0].value == pytest.approx(1006.0)


def test_rapl_absent_or_unreadable_means_no_meter(tmp_path: Path) -> None:
    """No powercap zone, or a counter that is not a number (or root-only): not measurable."""
    assert meters(gpu=False, rapl_root=tmp_path) == []
    zone = _zone(tmp_path, "intel-rapl:0", "package-0", 1, 10)
    (zone / "energy_uj").write_text("n/a\n")
    assert meters(gpu=False, rapl_root=tmp_path) == []
    (zone / "energy_uj").write_text("x" * 10_000)  # over the bounded reader's limit
    assert meters(gpu=False, rapl_root=tmp_path) == []


def test_recorder_writes_the_capture_form(tmp_path: Path) -> None:
    """Samples bracket the window (one at start, one at stop) and land in the tidy file."""
    package = _zone(tmp_path / "powercap", "intel-rapl:0", "package-0", 0, 10**12)
    with record_energy(gpu=False, rapl_root=tmp_path / "powercap",
                       interval_s=3600) as recorder:
        assert recorder is not None
        package.joinpath("energy_uj").write_text("42000000\n")
    rows = recorder.rows
    assert [r["value"] for r in rows] == [0.0, pytest.approx(42.0)]
    summary = write_series(rows, tmp_path / "out", ["rapl"])
    frame = pd.read_parquet(tmp_path / "out" / "series.parquet")
    assert list(frame.columns) == ["query", "labels", "timestamp", "value"]
    assert set(frame["query"]) == {"cpu_energy_joules"}
    assert json.loads(frame["labels"][0]) == {"zone": "package-0"}
    assert summary == {"sources": ["rapl"], "rows": 2, "queries": ["cpu_energy_joules"]}


def test_recorder_stops_once_and_survives_a_failing_meter() -> None:
    class Broken:
        name = "broken"
        closed = 0

        def read(self) -> list:
            raise OSError("the device went away")

        def close(self) -> None:
            self.closed += 1

    broken = Broken()
    recorder = EnergyRecorder([broken], interval_s=3600).start()
    assert recorder.stop() == [] and recorder.stop() == []
    assert broken.closed == 1


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = build_nvml_standin(tmp_path_factory.mktemp("nvml"))
    if folder is None:
        pytest.skip("no C compiler: the NVML stand-in library cannot be built")
    return folder


def _with_standin(nvml_lib: Path, code: str) -> dict:
    """Run ``code`` in a process that loads the stand-in as libnvidia-ml.so.1."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_lib), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_nvml_meter_reads_the_stand_in_driver(nvml_lib: Path) -> None:
    """nvidia-ml-py, unmodified, against a driver library with known counters."""
    found = _with_standin(nvml_lib, """
        import json
        from tasks.observe.energy import meters
        found = meters(gpu=True, rapl_root=__import__("pathlib").Path("/nonexistent"))
        meter = found[0]
        first, second = meter.read(), meter.read()
        meter.close()
        print(json.dumps({"names": [m.name for m in found], "gpus": meter.names,
                          "first": [[r.query, r.labels["gpu"], r.value] for r in first],
                          "second": [[r.query, r.labels["gpu"], r.value] for r in second]}))
    """)
    assert found["names"] == ["nvml"]
    assert found["gpus"] == ["Stand-in GPU 0", "Stand-in GPU 1"]
    first = {(q, g): v for q, g, v in found["first"]}
    assert first == {("gpu_energy_joules", "0"): 5000.0, ("gpu_power_watts", "0"): 250.0,
                     ("gpu_util_percent", "0"): 75.0,
                     ("gpu_memory_used_bytes", "0"): float(10 << 30),
                     # device 1 has no energy counter: left out, its power stays
                     ("gpu_power_watts", "1"): 150.0, ("gpu_util_percent", "1"): 25.0,
                     ("gpu_memory_used_bytes", "1"): float(5 << 30)}
    second = {(q, g): v for q, g, v in found["second"]}
    assert second[("gpu_energy_joules", "0")] == 6000.0  # +1 kJ a read


def test_no_nvml_library_means_no_gpu_meter(tmp_path: Path) -> None:
    """Without libnvidia-ml (this machine, CI) the GPU meter is absent, never an error."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", "from tasks.observe.energy import meters; "
                           "from pathlib import Path; "
                           "print(len(meters(gpu=True, rapl_root=Path('/nonexistent'))))"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    if Path("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").exists():
        pytest.skip("this machine has NVIDIA's library")
    assert done.stdout.strip() == "0"
