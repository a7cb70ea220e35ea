"""Tests of the llm_serving project (scaffolded): config, plan, a real workload run, parser, KPIs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from analysis.discovery import ResultDir
from analysis.kpi import compute_kpis
from analysis.parsing import FileReader
from projects import registry
from projects.config import resolve

PROJECT = registry.load("llm_serving")
STEP = PROJECT.workload_step


def test_light_preset_resolves_with_a_small_buffer() -> None:
    config = resolve("llm_serving", presets=["light"], env={})
    assert config.model.tests.llm_serving.test_settings.size_mb == 32


def test_a_real_run_parses_into_finite_kpis(tmp_path: Path) -> None:
    job = tmp_path / f"000__llm_serving__{STEP}"
    (job / "artifacts").mkdir(parents=True)
    config = job / "config.json"
    config.write_text(json.dumps({"size_mb": 1, "rounds": 3, "algorithm": "sha256"}))
    log = subprocess.run([sys.executable, str(PROJECT.folder / "workload.py"), str(config)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    (job / "artifacts" / "pod.log").write_text(log)
    (tmp_path / ".uuid").write_text("run-1\n")
    settings = {"name": "llm_serving", "size_mb": 1, "rounds": 3, "algorithm": "sha256"}
    reader = FileReader(tmp_path)
    result = PROJECT.parser.parse(ResultDir(path=str(tmp_path), rel_path=".",
                                            settings=settings, exit_code=0), reader)
    assert reader.problems == [] and result.rounds == 3
    kpis = {k.name: k.value for k in compute_kpis(PROJECT.kpis, result, {})}
    assert kpis["hash_mb_per_second"] > 0 and kpis["hash_runtime"] > 0


def test_a_log_without_summary_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    job = tmp_path / f"000__llm_serving__{STEP}" / "artifacts"
    job.mkdir(parents=True)
    (job / "pod.log").write_text('{"event": "round"}\nnot json\n')
    reader = FileReader(tmp_path)
    result = PROJECT.parser.parse(ResultDir(path=str(tmp_path), rel_path=".", settings={},
                                            exit_code=0), reader)
    assert result.mb_per_s is None and any("summary" in p.message for p in reader.problems)
