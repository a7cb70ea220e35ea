from __future__ import annotations

import math
from pathlib import Path

import pytest

from analysis.discovery import discover
from analysis.kpi import Kpi, KpiDefinition, compute_kpis, kpi_table, to_openmetrics
from analysis.lts import LtsMetadata, LtsPayload, lts_json_schema, require_complete
from analysis.parsing import parse_one
from analysis.project import load_project
from analysis.run_analysis import analyse_run
from core.errors import ResultsError
from tests.factories import make_result_dir


def test_fine_tuning_kpis_follow_the_design_formulas(tmp_path: Path) -> None:
    make_result_dir(tmp_path, "r", settings={"gpu": 4}, tokens_per_second=1000, runtime=50)
    project = load_project("fine_tuning")
    result = parse_one(discover(tmp_path).results[0], project.parser)
    kpis = {k.name: k for k in compute_kpis(project.kpis, result, project.labels(result))}
    assert kpis["train_tokens_per_second"].value == 4000  # trainer value x num_gpus
    assert kpis["dataset_tokens_per_second"].value == pytest.approx(51234 / 50)
    assert kpis["dataset_tokens_per_second_per_gpu"].value == pytest.approx(51234 / 50 / 4)
    assert kpis["train_tokens_per_gpu_per_second"].value == 1000
    assert kpis["gpu_hours_per_million_tokens"].value == pytest.approx(1e6 / (51234 / 50) / 3600 * 4)
    assert kpis["gpu_hours_per_million_tokens"].lower_better
    assert kpis["train_runtime"].lower_better and kpis["train_runtime"].value == 50
    assert kpis["avg_tokens_per_sample"].ignored_for_regression
    labels = kpis["train_runtime"].labels
    assert labels["tuning_method"] == "lora" and labels["accelerator_count"] == "4"
    assert labels["global_batch_size"] == "16" and labels["lora_rank"] == "8"


def test_gpu_zero_counts_as_one_and_full_tuning(tmp_path: Path) -> None:
    make_result_dir(tmp_path, "r", settings={"gpu": 0, "hyper_parameters": {
        "peft_method": "none", "per_device_train_batch_size": 2}}, tokens_per_second=10)
    project = load_project("fine_tuning")
    result = parse_one(discover(tmp_path).results[0], project.parser)
    kpis = {k.name: k for k in compute_kpis(project.kpis, result, project.labels(result))}
    assert kpis["train_tokens_per_second"].value == 10
    assert kpis["train_runtime"].labels["tuning_method"] == "full"
    assert kpis["train_runtime"].labels["lora_rank"] == ""


def test_missing_inputs_drop_the_kpi_not_zero() -> None:
    definitions = [KpiDefinition("a", "A", "u", False, lambda r: None),
                   KpiDefinition("b", "B", "u", True, lambda r: 1 / 0),
                   KpiDefinition("c", "C", "u", False, lambda r: math.nan),
                   KpiDefinition("d", "D", "Mu", False, lambda r: 3e6, divisor=1e6)]
    kpis = compute_kpis(definitions, object(), {})
    assert [(k.name, k.value) for k in kpis] == [("d", 3.0)]


def test_openmetrics_text() -> None:
    kpi = Kpi(name="tps", value=12.5, unit="tokens/s", help='say "hi"', lower_better=False,
              labels={"model": 'a"b', "gpu.count": "1"})
    text = to_openmetrics([kpi, kpi.model_copy(update={"value": 3.0, "labels": {}})])
    assert text.splitlines() == [
        "# TYPE tps gauge",
        '# HELP tps say "hi" [tokens/s, higher is better]',
        'tps{gpu_count="1",model="a\\"b"} 12.5',
        "tps 3.0",
        "# EOF",
    ]


def test_tidy_table_columns() -> None:
    kpi = Kpi(name="tps", value=1.0, unit="u", help="h", lower_better=False,
              labels={"model": "m"})
    frame = kpi_table([("run-1", "2026-01-01T00:00:00+00:00", [kpi])])
    assert list(frame.columns) == ["run_uuid", "timestamp", "kpi", "value", "unit",
                                   "lower_better", "ignored_for_regression", "model"]
    assert str(frame["timestamp"].dtype).startswith("datetime64") and "UTC" in str(frame["timestamp"].dtype)
    with pytest.raises(ValueError, match="clash"):
        kpi_table([("r", None, [kpi.model_copy(update={"labels": {"kpi": "x"}})])])


def test_lts_lenient_and_strict(tmp_path: Path) -> None:
    make_result_dir(tmp_path, "r")
    project = load_project("fine_tuning")
    result = parse_one(discover(tmp_path).results[0], project.parser)
    run = analyse_run(project, result, presets=["light"], config_text="a: 1\n")
    require_complete(run.payload, "cpt")  # everything present
    assert run.payload.metadata.status == "success"
    lenient = LtsPayload(metadata=LtsMetadata(run_uuid="x"))
    require_complete(lenient, "investigate")
    with pytest.raises(ResultsError, match="metadata.start"):
        require_complete(lenient, "cpt")
    schema = lts_json_schema()
    assert schema["title"] == "LtsPayload" and "metadata" in schema["properties"]
