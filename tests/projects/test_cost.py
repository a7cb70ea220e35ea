"""Cost per million tokens from declared prices (#44 item 4): hand-computed figures, no
figure without a price, and a block from a result tree that is not valid prices nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from analysis.discovery import ResultDir
from analysis.kpi import compute_kpis
from analysis.parsing import FileReader
from projects import registry
from projects.library.cost import CostBlock, cost_per_million_tokens, declared_cost
from tests.factories import make_result_dir

FINE_TUNING = registry.load("fine_tuning")


def _fine_tuning_kpis(tmp_path: Path, settings: dict) -> dict[str, float]:
    cell = make_result_dir(tmp_path, "000__cell", settings=settings, runtime=40.0)
    parsed = FINE_TUNING.parser.parse(ResultDir(
        path=str(cell), rel_path=cell.name,
        settings=yaml.safe_load((cell / "settings.yaml").read_text()), exit_code=0),
        FileReader(cell))
    return {k.name: k.value for k in compute_kpis(FINE_TUNING.kpis, parsed, {})}


@pytest.mark.parametrize(("settings", "expected"), [
    # 51 234 dataset tokens in 40 s = 1 280.85 tokens/s; 2 GPUs a pod, 2 pods at 3 a GPU-hour
    ({"gpu": 2, "pod_count": 2, "cost": {"per_gpu_hour": 3.0}},
     4 * 3.0 * 1e6 / (51234 / 40.0 * 3600)),
    # no GPU: the node's price
    ({"gpu": 0, "cost": {"per_node_hour": 0.5, "currency": "EUR"}},
     0.5 * 1e6 / (51234 / 40.0 * 3600)),
])
def test_fine_tuning_cost_matches_the_hand_computed_price(tmp_path: Path, settings: dict,
                                                          expected: float) -> None:
    kpis = _fine_tuning_kpis(tmp_path, settings)
    assert kpis["cost_per_million_tokens"] == pytest.approx(expected)


@pytest.mark.parametrize("cost", [
    None, {}, {"per_gpu_hour": 3.0},  # a CPU run with only a GPU price: nothing priced
    {"per_node_hour": "\x1b[2J"}, {"per_node_hour": -1}, {"currency": "dollars"},
    {"per_node_hour": 1.0, "unknown": 2},
])
def test_no_valid_price_gives_no_cost(tmp_path: Path, cost: dict | None) -> None:
    settings = {"gpu": 0} if cost is None else {"gpu": 0, "cost": cost}
    assert "cost_per_million_tokens" not in _fine_tuning_kpis(tmp_path, settings)


def test_llm_serving_cost_of_a_recorded_run(tmp_path: Path) -> None:
    from projects.llm_serving.kpis import KPIS
    from projects.llm_serving.parser import WORKLOAD_GLOB

    data = json.loads((Path(__file__).resolve().parent.parent / "data" /
                       "guidellm_light.json").read_text())
    job = tmp_path / WORKLOAD_GLOB.replace("*", "001") / "artifacts"
    job.mkdir(parents=True)
    (job / "guidellm.json").write_text(json.dumps(data))
    (tmp_path / ".uuid").write_text("run-1\n")
    project = registry.load("llm_serving")
    parsed = project.parser.parse(ResultDir(
        path=str(tmp_path), rel_path=".", exit_code=0,
        settings={"concurrency": 1, "gpu": 1, "cost": {"per_gpu_hour": 2.5}}),
        FileReader(tmp_path))
    tps = data["benchmarks"][0]["metrics"]["output_tokens_per_second"]["successful"]["mean"]
    values = {k.name: k.compute(parsed) for k in KPIS}
    assert values["cost_per_million_tokens"] == pytest.approx(2.5 * 1e6 / (tps * 3600))
    assert values["gpu_hours_per_million_tokens"] == pytest.approx(1e6 / (tps * 3600))


@given(price=st.floats(0, 1e5), tps=st.floats(1e-3, 1e7), gpus=st.integers(0, 64),
       nodes=st.integers(1, 64))
def test_cost_is_non_negative_and_proportional_to_the_price(price: float, tps: float,
                                                            gpus: int, nodes: int) -> None:
    block = CostBlock(per_gpu_hour=price, per_node_hour=price)
    one = cost_per_million_tokens(block, tps, gpus=gpus, nodes=nodes)
    assert one is not None and one >= 0
    double = cost_per_million_tokens(CostBlock(per_gpu_hour=2 * price, per_node_hour=2 * price)
                                     if price <= 5e4 else block, tps, gpus=gpus, nodes=nodes)
    assert double == pytest.approx(2 * one if price <= 5e4 else one)
    assert declared_cost({"cost": block.model_dump()}) == block
