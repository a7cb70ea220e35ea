"""Energy over a KPI's own window (`projects.library.energy`): known counters, power-only
boards, partial coverage, resets, and additivity over any split of the window."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.parsing import FileReader
from projects.library.energy import energy_in_window, read_energy

T0 = datetime(2026, 11, 27, 6, 0, tzinfo=UTC)


def _rows(query: str, labels: dict[str, str], points: list[tuple[float, float]]) -> list[dict]:
    return [{"query": query, "labels": json.dumps(labels, sort_keys=True),
             "timestamp": T0 + timedelta(seconds=t), "value": v} for t, v in points]


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_counters_give_the_energy_between_the_window_edges() -> None:
    """A GPU at 300 W and a CPU package at 50 W, sampled each second; the window falls
    between samples: the counters are interpolated at its edges."""
    frame = pd.DataFrame(
        _rows("gpu_energy_joules", {"gpu": "0"}, [(t, 1e6 + 300 * t) for t in range(101)])
        + _rows("gpu_power_watts", {"gpu": "0"}, [(t, 300.0) for t in range(101)])
        + _rows("cpu_energy_joules", {"zone": "package-0"}, [(t, 50.0 * t) for t in range(101)])
        + _rows("gpu_util_percent", {"gpu": "0"}, [(t, 99.0) for t in range(101)]))
    used = energy_in_window(frame, _at(10.5), _at(50.25))
    assert used is not None
    assert used.window_s == pytest.approx(39.75)
    assert used.gpu_energy_joules == pytest.approx(300 * 39.75)  # its power not counted again
    assert used.cpu_energy_joules == pytest.approx(50 * 39.75)
    assert used.energy_joules == pytest.approx(350 * 39.75)
    assert used.power_watts_mean == pytest.approx(350.0)
    assert used.power_watts_max == pytest.approx(350.0)
    assert used.sources == ["cpu_energy_joules", "gpu_energy_joules", "gpu_power_watts"]


def test_a_board_without_a_counter_integrates_its_power() -> None:
    frame = pd.DataFrame(
        _rows("gpu_energy_joules", {"gpu": "0"}, [(t, 300.0 * t) for t in range(0, 61, 2)])
        + _rows("gpu_power_watts", {"gpu": "1"}, [(t, 100.0 + t) for t in range(0, 61, 2)]))
    used = energy_in_window(frame, _at(0), _at(60))
    assert used is not None
    # 300 W x 60 s, plus the integral of 100 + t over [0, 60]
    assert used.gpu_energy_joules == pytest.approx(300 * 60 + 100 * 60 + 60 ** 2 / 2)
    assert used.power_watts_max == pytest.approx(160.0)  # power samples only: board 1's


def test_nothing_measured_gives_none() -> None:
    """No energy series, a window the samples barely cover, a counter that reset."""
    util = pd.DataFrame(_rows("gpu_util_percent", {"gpu": "0"}, [(0, 1.0), (10, 1.0)]))
    assert energy_in_window(util, _at(0), _at(10)) is None
    late = pd.DataFrame(_rows("cpu_energy_joules", {"zone": "p"}, [(8, 0.0), (10, 20.0)]))
    assert energy_in_window(late, _at(0), _at(10)) is None  # 20 % of the window covered
    reset = pd.DataFrame(_rows("gpu_energy_joules", {"gpu": "0"},
                               [(0, 500.0), (5, 900.0), (10, 3.0)]))
    assert energy_in_window(reset, _at(0), _at(10)) is None
    assert energy_in_window(pd.DataFrame(columns=["query", "labels", "timestamp", "value"]),
                            _at(0), _at(10)) is None
    assert energy_in_window(late, _at(10), _at(0)) is None


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.floats(0, 500), min_size=3, max_size=40),
       gaps=st.lists(st.floats(0.05, 5), min_size=3, max_size=40),
       cut=st.floats(0.01, 0.99))
def test_energy_is_additive_over_a_split_window(steps: list[float], gaps: list[float],
                                                cut: float) -> None:
    """Any monotone counter sampled at any instants: [a, c] = [a, b] + [b, c], and >= 0."""
    n = min(len(steps), len(gaps))
    t, v, points = 0.0, 0.0, []
    for step, gap in zip(steps[:n], gaps[:n], strict=True):
        points.append((t, v))
        t, v = t + gap, v + step
    points.append((t, v))
    frame = pd.DataFrame(_rows("cpu_energy_joules", {"zone": "p"}, points))
    end = points[-1][0]
    middle = end * cut
    whole = energy_in_window(frame, _at(0), _at(end))
    first = energy_in_window(frame, _at(0), _at(middle))
    second = energy_in_window(frame, _at(middle), _at(end))
    assert whole is not None and first is not None and second is not None
    assert whole.energy_joules >= 0
    assert first.energy_joules + second.energy_joules == pytest.approx(
        whole.energy_joules, rel=1e-9, abs=1e-6)
    assert whole.energy_joules == pytest.approx(points[-1][1], rel=1e-9, abs=1e-6)


def test_read_energy_combines_the_local_and_the_prometheus_captures(tmp_path: Path) -> None:
    """The local meters' file and a cluster's DCGM series are read alike; a broken file is
    a parse problem, not an exception."""
    local = tmp_path / "003__observe__capture_energy" / "energy"
    local.mkdir(parents=True)
    pd.DataFrame(_rows("cpu_energy_joules", {"zone": "p"}, [(0, 0.0), (20, 400.0)])).to_parquet(
        local / "series.parquet")
    prom = tmp_path / "004__observe__capture_prometheus" / "prometheus"
    prom.mkdir(parents=True)
    pd.DataFrame(_rows("gpu_energy_joules", {"gpu": "0"}, [(0, 0.0), (20, 2000.0)])).to_parquet(
        prom / "series.parquet")
    used = read_energy(FileReader(tmp_path), _at(5), _at(15))
    assert used is not None and used.energy_joules == pytest.approx(200.0 + 1000.0)
    assert read_energy(FileReader(tmp_path), None, _at(15)) is None
    (prom / "series.parquet").write_bytes(b"not parquet")
    reader = FileReader(tmp_path)
    used = read_energy(reader, _at(5), _at(15))
    assert used is not None and used.energy_joules == pytest.approx(200.0)
    assert any("Parquet" in str(p) for p in reader.problems)


def test_a_cluster_cell_gets_dcgm_energy_over_its_training_steps(tmp_path: Path) -> None:
    """The cluster's queries, answered by a Prometheus with DCGM's series (two GPUs at 300
    and 250 W, their energy counters), captured like a cell's window, then parsed: the
    energy of the training steps (the trainer's runtime ending when its pod finished)."""
    from analysis.discovery import ResultDir
    from analysis.kpi import compute_kpis
    from projects import registry
    from tasks.observe.capture import cluster_queries
    from tasks.observe.prometheus import PrometheusServer
    from tasks.observe.promql import capture_window
    from tests.factories import make_result_dir
    from tests.servers.prometheus import prometheus_api

    project = registry.load("fine_tuning")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    cell = make_result_dir(tmp_path, "000__cell", runtime=40.0, start=start)
    with prometheus_api() as api:
        capture_window(PrometheusServer(api.url), cluster_queries("fine-tuning-testing"),
                       start, start + timedelta(seconds=70),
                       cell / "003__observe__capture_prometheus" / "prometheus")
    import yaml

    parsed = project.parser.parse(ResultDir(
        path=str(cell), rel_path=cell.name, exit_code=0,
        settings=yaml.safe_load((cell / "settings.yaml").read_text())), FileReader(cell))
    assert parsed.energy is not None
    assert parsed.energy.window_s == pytest.approx(40.0)
    assert parsed.energy.gpu_energy_joules == pytest.approx(550.0 * 40.0)
    kpis = {k.name: k.value for k in compute_kpis(project.kpis, parsed, {})}
    assert kpis["power_watts_mean"] == pytest.approx(550.0)
    assert kpis["power_watts_max"] == pytest.approx(550.0)
    assert kpis["joules_per_token"] == pytest.approx(550.0 * 40.0 / (1200.0 * 40.0))
