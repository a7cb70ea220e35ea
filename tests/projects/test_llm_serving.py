"""The llm_serving project without a server: config validation, the load step's refusals,
the parser on broken files, the KServe manifests against their schemas, the --plan."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import hypothesis.strategies as st
import jsonschema
import pytest
from hypothesis import given, settings

from analysis.discovery import ResultDir
from analysis.kpi import compute_kpis
from analysis.parsing import FileReader
from core.errors import ConfigError
from projects import registry
from projects.config import resolve
from projects.llm_serving.goodput import RequestTimes, ServingSlo, goodput
from projects.llm_serving.manifests import cell_manifests
from projects.llm_serving.parser import WORKLOAD_GLOB, counters
from projects.plan import cells_of
from tests.upstream_schemas import validate as upstream_validate

PROJECT = registry.load("llm_serving")
KEY = "tests.llm_serving.test_settings"


def test_light_preset_is_one_local_cell() -> None:
    config = resolve("llm_serving", presets=["light"], env={})
    assert config.model.clusters.platform == "local"
    assert len(cells_of(config, "llm_serving")) == 1


def test_sweep_is_four_concurrencies_times_two_shapes() -> None:
    cells = cells_of(resolve("llm_serving", presets=["sweep"], env={}), "llm_serving")
    assert sorted((c.settings["concurrency"], c.settings["prompt_tokens"],
                   c.settings["output_tokens"]) for c in cells) == sorted(
        (c, p, o) for c in (1, 2, 4, 8) for p, o in ((128, 64), (256, 32)))


@pytest.mark.parametrize(("key", "value", "words"), [
    ("concurrency", 0, "greater than or equal to 1"),
    ("concurrency", -4, "greater than or equal to 1"),
    ("concurrency", "lots", "valid integer"),
    ("duration_s", 2, "greater than or equal to 5"),
    ("duration_s", 86_400, "less than or equal to 3600"),
    ("output_tokens", 500, "exceed max_model_len"),
    ("name", "Bad Name;rm", "should match pattern"),
    ("warmup_s", 10, "must be shorter than duration_s"),
    ("slo.ttft_ms", -5, "greater than 0"),
    ("slo.attainment_pct", 120, "less than or equal to 100"),
    ("slo.itl_ms", "fast", "valid number"),
])
def test_nonsense_settings_are_refused_at_input(key: str, value: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        resolve("llm_serving", presets=["light"], overrides={f"{KEY}.{key}": value}, env={})


def test_a_pr_comment_may_not_set_the_images_or_the_venv() -> None:
    keys = resolve("llm_serving", env={}).model.pr_comment.allowed_keys
    assert f"{KEY}.concurrency" in keys
    assert not any(k.endswith(("image", "venv")) or k.startswith("tests.llm_serving.local")
                   for k in keys)



def _result(tmp_path: Path, files: dict[str, str], exit_code: int = 0,
            settings: dict | None = None):
    job = tmp_path / WORKLOAD_GLOB.replace("*", "001")
    for rel, text in files.items():
        (job / rel).parent.mkdir(parents=True, exist_ok=True)
        (job / rel).write_text(text)
    (tmp_path / ".uuid").write_text("run-1\n")
    reader = FileReader(tmp_path)
    result = PROJECT.parser.parse(ResultDir(path=str(tmp_path), rel_path=".",
                                            settings={"concurrency": 1, **(settings or {})},
                                            exit_code=exit_code), reader)
    return result, reader


def test_broken_result_files_are_problems_not_crashes(tmp_path: Path) -> None:
    result, reader = _result(tmp_path, {"artifacts/guidellm.json": '{"benchmarks": [{"metrics":'
                                        ' {"request_totals": "many"}}]}',
                                        "artifacts/load.json": "not json"})
    assert not result.measured
    assert any("not a GuideLLM result" in p.message for p in reader.problems)
    kpis = {k.name: k.value for k in compute_kpis(PROJECT.kpis, result, {})}
    assert "ttft_p95" not in kpis


def test_a_bottlenecked_measurement_keeps_its_kpis_and_is_invalid(tmp_path: Path) -> None:
    """GuideLLM's own warning (its request generation was the bottleneck): the KPIs are
    kept (stored marked invalid, never judged); a failed load step gives none."""
    dist = {"mean": 10.0, "median": 9.0, "percentiles": {"p50": 9.0, "p95": 20.0, "p99": 30.0}}
    by_status = {"successful": dist}
    bench = {"metrics": {"request_totals": {"successful": 40, "errored": 0},
                         **{name: by_status for name in (
                             "requests_per_second", "request_latency", "time_to_first_token_ms",
                             "inter_token_latency_ms", "time_per_output_token_ms",
                             "output_tokens_per_second")}},
             "warnings": [{"code": "generation_delay_ttft", "observed": 0.03,
                           "threshold": 0.01}]}
    result, _ = _result(tmp_path, {"artifacts/guidellm.json": json.dumps(
        {"benchmarks": [bench]})})
    assert result.measured and result.generation_delay_ratio == 0.03
    assert "ttft_p95" in {k.name for k in compute_kpis(PROJECT.kpis, result, {})}
    assert any("bottleneck" in r for r in PROJECT.validity(result))
    failed, _ = _result(tmp_path / "failed", {"artifacts/guidellm.json": json.dumps(
        {"benchmarks": [bench]})}, exit_code=3)
    names = {k.name for k in compute_kpis(PROJECT.kpis, failed, {})}
    assert not failed.measured and "ttft_p95" not in names and "error_rate" in names
    bench["warnings"] = []
    result, _ = _result(tmp_path, {"artifacts/guidellm.json": json.dumps(
        {"benchmarks": [bench]})})
    values = {k.name: k.value for k in compute_kpis(PROJECT.kpis, result, {})}
    assert values["ttft_p95"] == 20.0 and values["error_rate"] == 0.0


def test_server_counters_sum_over_labels_and_skip_garbage() -> None:
    text = ('# HELP x\nvllm:generation_tokens_total{engine="0",model_name="a"} 10.0\n'
            'vllm:generation_tokens_total{engine="1",model_name="a"} 5\n'
            'vllm:prompt_tokens_total NaN\nbroken line\n')
    assert counters(text) == {"vllm:generation_tokens_total": 15.0}
    assert all(math.isfinite(v) for v in counters(text).values())


def _gpu_manifests() -> list[dict]:
    config = resolve("llm_serving", presets=["gpu"], env={})
    test = config.model.tests.llm_serving
    out = []
    for cell in cells_of(config, "llm_serving"):
        objects = cell_manifests(cell.settings, namespace=test.namespace,
                                 block=test.kubernetes.model_dump(mode="json"),
                                 cell_index=cell.index,
                                 ready_timeout_s=test.kubernetes.ready_timeout_s)
        out += [objects[k] for k in ("namespace", "runtime", "isvc", "configmap", "job")]
    return out


@pytest.mark.parametrize("manifest", _gpu_manifests(),
                         ids=lambda m: f"{m['kind']}-{m['metadata']['name']}")
def test_gpu_manifests_are_valid(manifest: dict) -> None:
    upstream_validate(manifest)  # KServe's own CRDs (../shared/crds), built-ins strictly


def test_the_kserve_schemas_catch_mistakes() -> None:
    isvc = next(m for m in _gpu_manifests() if m["kind"] == "InferenceService")
    isvc["spec"]["predictor"]["model"]["storageURI"] = isvc["spec"]["predictor"]["model"].pop(
        "storageUri")
    with pytest.raises(jsonschema.ValidationError, match="storageURI"):
        upstream_validate(isvc)


def test_gpu_manifests_wire_the_model_the_gpu_and_the_load(tmp_path: Path) -> None:
    manifests = _gpu_manifests()
    isvc = next(m for m in manifests if m["kind"] == "InferenceService")
    runtime = next(m for m in manifests if m["kind"] == "ServingRuntime")
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["resources"]["limits"]["nvidia.com/gpu"] == 1
    config = json.loads(next(m for m in manifests if m["kind"] == "ConfigMap")["data"][
        "config.json"])
    assert config["target"].startswith(f"http://{isvc['metadata']['name']}-predictor.")
    assert config["concurrency"] in (1, 4, 16)


def test_plan_of_the_gpu_preset_writes_the_manifests(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "flows.llm_serving", "--preset", "gpu",
                           "--plan", "--artifact-dir", str(tmp_path / "plan")],
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    text = "\n".join(p.read_text() for p in (tmp_path / "plan").rglob("*.yaml"))
    assert "kind: InferenceService" in text and "kind: ServingRuntime" in text


def _recorded() -> dict:
    return json.loads((Path(__file__).resolve().parent.parent / "data" /
                       "guidellm_light.json").read_text())


def _judged(tmp_path: Path, data: dict, concurrency: int = 1) -> list[str]:
    """The load step's summary of a GuideLLM result, then the parse and its validity."""
    from projects.llm_serving.workload.load import _verdict

    result_file = tmp_path / "guidellm.json"
    result_file.write_text(json.dumps(data))
    code, summary = _verdict(str(result_file), ["generation_delay_ttft"])
    assert code == 0  # a warning never fails the workload: validity decides
    cell = tmp_path / "cell"
    result, _ = _result(cell, {"artifacts/guidellm.json": json.dumps(data),
                               "artifacts/load.json": json.dumps(summary)})
    result.settings["concurrency"] = concurrency
    return PROJECT.validity(result)


@pytest.mark.parametrize("code", ["generation_delay_ttft", "root_late"])
def test_only_the_listed_warnings_make_a_recorded_run_invalid(tmp_path: Path,
                                                              code: str) -> None:
    """Without GuideLLM's generation-delay summary (an older result) its listed warning
    decides: a bottlenecked load generator is an invalid measurement (exit 0, KPIs kept,
    not judged); other warnings are recorded only."""
    data = _recorded()
    del data["benchmarks"][0]["scheduler_metrics"]
    data["benchmarks"][0]["warnings"] = [{"code": code, "observed": 0.06, "threshold": 0.01}]
    reasons = _judged(tmp_path, data)
    if code == "generation_delay_ttft":
        assert len(reasons) == 1 and "bottleneck" in reasons[0] and "6.0%" in reasons[0]
    else:
        assert reasons == []


@pytest.mark.parametrize(("median_ms", "invalid"), [(0.2, False), (1.2, False), (3.0, True)])
def test_the_median_generation_delay_decides_not_the_startup(tmp_path: Path,
                                                              median_ms: float,
                                                              invalid: bool) -> None:
    """GuideLLM warns on the mean generation delay, warm-up included: one slow start of its
    data worker trips it. The median, against 1 % of the mean TTFT, decides here."""
    data = _recorded()
    bench = data["benchmarks"][0]
    ttft = bench["metrics"]["time_to_first_token_ms"]["successful"]["mean"]
    bench["metrics"]["time_to_first_token_ms"]["successful"]["mean"] = 200.0
    bench["scheduler_metrics"]["generation_delay"].update(median=median_ms / 1000,
                                                          mean=0.02, max=0.5)
    bench["warnings"] = [{"code": "generation_delay_ttft", "observed": 0.1,
                          "threshold": 0.01}]
    reasons = _judged(tmp_path, data)
    assert ttft > 0
    assert bool(reasons) == invalid, reasons
    if invalid:
        assert "median request generation delay was 1.5%" in reasons[0]


@given(errored=st.integers(0, 200), achieved=st.floats(0.0, 4.0), concurrency=st.integers(1, 4))
@settings(max_examples=40)
def test_errors_and_achieved_concurrency_decide_validity(errored: int, achieved: float,
                                                         concurrency: int) -> None:
    """More than 1 % errored requests, or under 75 % of the asked concurrency: invalid."""
    import tempfile

    data = _recorded()
    bench = data["benchmarks"][0]
    bench["warnings"] = []
    totals = bench["metrics"]["request_totals"]
    totals["errored"] = errored
    bench["metrics"]["request_concurrency"]["successful"]["mean"] = achieved
    with tempfile.TemporaryDirectory() as tmp:
        reasons = _judged(Path(tmp), data, concurrency)
    share = errored / (errored + totals["successful"])
    assert any("errored" in r for r in reasons) == (share > 0.01)
    assert any("concurrency" in r for r in reasons) == (achieved < 0.75 * concurrency)


@pytest.mark.parametrize("errored", [0, 2])
def test_a_window_in_which_no_request_finished_is_invalid_not_a_failed_server(
        tmp_path: Path, errored: int) -> None:
    """Every request still running when GuideLLM's window closed, none errored (a slow
    server on a loaded machine): the server failed nothing — the load step ends 0 and the
    measurement is invalid (re-run under enforce). With errors it is the server's failure."""
    from projects.llm_serving.workload.load import _verdict

    data = _recorded()
    bench = data["benchmarks"][0]
    bench["warnings"] = []
    bench["metrics"]["request_totals"].update(successful=0, errored=errored, incomplete=1,
                                              total=1 + errored)
    bench["requests"]["successful"] = []
    result_file = tmp_path / "guidellm.json"
    result_file.write_text(json.dumps(data))
    code, summary = _verdict(str(result_file), ["generation_delay_ttft"])
    if errored:
        assert code == 4  # the server refused or failed what it was sent: a failed cell
        return
    assert code == 0 and summary["incomplete"] == 1
    result, _ = _result(tmp_path / "cell", {"artifacts/guidellm.json": json.dumps(data),
                                            "artifacts/load.json": json.dumps(summary)})
    assert not result.measured and result.incomplete == 1
    reasons = PROJECT.validity(result)
    assert any(r.startswith("no request completed within the measured window (1 still "
                            "running, none errored)") for r in reasons), reasons
    kpis = {k.name: k.value for k in compute_kpis(PROJECT.kpis, result, {})}
    assert "ttft_p95" not in kpis or kpis["ttft_p95"] is None
    # the same window in one client of a fan-out: that client's load step ends 0 too
    files = {f"users/user-{u:03d}/{name}": text for u, recorded in enumerate((_recorded(), data))
             for name, text in (("guidellm.json", json.dumps(recorded)), ("exit_code", "0\n"))}
    fanned, _ = _result(tmp_path / "users", files)
    assert fanned.measured  # the other client measured the server
    assert any(r.startswith("1 of 2 user(s) completed no request within the window")
               for r in PROJECT.validity(fanned)), PROJECT.validity(fanned)


def test_multi_user_results_give_per_client_rows_and_first_success(tmp_path: Path) -> None:
    """The fan-out layout (users/user-NNN/) with results written by the real GuideLLM."""
    recorded = (Path(__file__).resolve().parent.parent / "data" / "guidellm_light.json")
    data = json.loads(recorded.read_text())
    bench = data["benchmarks"][0]
    first_end = min(r["request_end_time"] for r in bench["requests"]["successful"])
    files = {}
    for user in range(2):
        files[f"users/user-{user:03d}/guidellm.json"] = json.dumps(data)
        files[f"users/user-{user:03d}/exit_code"] = "0\n"
    files["users/user-002/exit_code"] = "4\n"  # a client whose requests all failed
    result, reader = _result(tmp_path, files)
    assert [u.index for u in result.users] == [0, 1, 2]
    assert result.measured and result.users[2].successful is None
    expected = first_end - bench["start_time"]
    assert result.users[0].time_to_first_success_s == pytest.approx(expected)
    kpis = {k.name: k.value for k in compute_kpis(PROJECT.kpis, result, {})}
    assert kpis["time_to_first_success_max"] == pytest.approx(expected)
    p50 = bench["metrics"]["time_to_first_token_ms"]["successful"]["percentiles"]["p50"]
    assert kpis["ttft_p50"] == pytest.approx(p50)
    rows = PROJECT.user_rows(result)
    assert len(rows) == 3 and rows[0]["ttft_ms_p50"] == pytest.approx(p50)


def test_a_failed_cell_says_why_in_its_own_words(tmp_path: Path) -> None:
    """The errors page shows the workload's own reason line, not only its exit code."""
    log = ("$ guidellm run ...\n{\"event\": \"summary\", \"successful\": 0}\n"
           "error: no request succeeded (771 errored): the server refused or failed every "
           "request\n")
    result, _ = _result(tmp_path, {"artifacts/pod.log": log}, exit_code=4)
    assert result.failure == ("error: no request succeeded (771 errored): the server "
                              "refused or failed every request")
    quiet, _ = _result(tmp_path / "q", {"artifacts/pod.log": "Traceback...\nKeyError: 'x'\n"},
                       exit_code=1)
    assert quiet.failure == "KeyError: 'x'"


@pytest.mark.parametrize("value", ["not json", '{"venv": [1]}', "[1, 2]", '{"venv": {}}'])
def test_a_malformed_serving_variable_is_refused_when_the_config_is_resolved(
        value: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The project's own environment settings are read with the config, before prepare: one
    line naming the variable, exit 2 — not a SettingsError traceback mid-run."""
    import subprocess
    import sys

    from core.errors import ConfigError
    from projects.config import resolve

    monkeypatch.setenv("TELLTALE_SERVING", value)
    with pytest.raises(ConfigError, match="environment variable TELLTALE_SERVING"):
        resolve("llm_serving", presets=["light"])
    proc = subprocess.run([sys.executable, "-m", "flows.llm_serving", "--preset", "light",
                           "--plan", "--artifact-dir", str(tmp_path / "p")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "TELLTALE_SERVING" in proc.stderr and "Traceback" not in proc.stderr


def _by_hand(data: dict, ttft_ms: float, itl_ms: float, latency_s: float) -> dict:
    """Goodput of a recorded result, computed straight off its JSON."""
    bench = data["benchmarks"][0]
    records = bench["requests"]["successful"]
    met = [r for r in records if r["time_to_first_token_ms"] <= ttft_ms
           and r["inter_token_latency_ms"] <= itl_ms and r["request_latency"] <= latency_s]
    totals = bench["metrics"]["request_totals"]
    share = len(met) / len(records)
    rates = bench["metrics"]
    return {
        "attainment": 100 * share * totals["successful"] / (totals["successful"]
                                                            + totals["errored"]),
        "rps": rates["requests_per_second"]["successful"]["mean"] * share,
        "tps": rates["output_tokens_per_second"]["successful"]["mean"]
        * sum(r["output_tokens"] for r in met) / sum(r["output_tokens"] for r in records),
        "met": len(met), "records": len(records)}


@pytest.mark.parametrize(("ttft_ms", "itl_ms", "latency_s"), [
    (1e6, 1e6, 1e4),      # every request meets it
    (200.0, 11.0, 1.0),   # some do
    (1.0, 1.0, 0.001),    # none does
])
def test_goodput_of_a_recorded_run_matches_the_hand_computed_figures(
        tmp_path: Path, ttft_ms: float, itl_ms: float, latency_s: float) -> None:
    from projects.llm_serving.kpis import KPIS

    data = _recorded()
    slo = {"ttft_ms": ttft_ms, "itl_ms": itl_ms, "request_latency_s": latency_s}
    result, _ = _result(tmp_path, {"artifacts/guidellm.json": json.dumps(data)},
                        settings={"slo": slo})
    expected = _by_hand(data, ttft_ms, itl_ms, latency_s)
    assert result.slo_attainment_pct == pytest.approx(expected["attainment"])
    assert result.goodput_requests_per_second == pytest.approx(expected["rps"])
    assert result.goodput_tokens_per_second == pytest.approx(expected["tps"])
    kpis = {k.name: k.compute(result) for k in KPIS}
    assert kpis["goodput_requests_per_second"] <= kpis["requests_per_second"] + 1e-9
    assert kpis["goodput_tokens_per_second"] <= kpis["output_tokens_per_second"] + 1e-9
    if ttft_ms == 1e6:
        assert kpis["goodput_requests_per_second"] == pytest.approx(kpis["requests_per_second"])
    if ttft_ms == 1.0:
        assert kpis["slo_attainment_pct"] == 0.0
    assert 0 < expected["met"] < expected["records"] or ttft_ms != 200.0  # a real split


def test_no_slo_gives_no_goodput_and_a_bad_one_is_a_problem_not_a_crash(
        tmp_path: Path) -> None:
    from projects.llm_serving.kpis import KPIS, labels

    data = json.dumps(_recorded())
    plain, _ = _result(tmp_path / "a", {"artifacts/guidellm.json": data})
    assert plain.goodput_requests_per_second is None
    assert {k.name: k.compute(plain) for k in KPIS}["slo_attainment_pct"] is None
    odd, reader = _result(tmp_path / "b", {"artifacts/guidellm.json": data},
                          settings={"slo": {"ttft_ms": "\x1b[2J", "evil": 1}})
    assert odd.goodput_requests_per_second is None
    assert any("slo" in p for p in map(str, reader.problems))
    set_one, _ = _result(tmp_path / "c", {"artifacts/guidellm.json": data},
                         settings={"slo": {"ttft_ms": 5000, "itl_ms": 500}})
    # another SLO, another history: the SLO is in the run's identity
    assert labels(set_one)["slo"] == "ttft_ms<=5000,itl_ms<=500" and labels(plain)["slo"] == ""


def test_the_engine_core_start_is_a_label_read_from_the_servers_record(
        tmp_path: Path) -> None:
    """A local server whose engine core came from the fork server is another history (its
    machine memory differs); a record without it (before it existed, a cluster's) or with a
    value that is none of ours reads as empty."""
    from projects.llm_serving.kpis import labels

    data = json.dumps(_recorded())
    records = {"forked": {"startup_s": 30.5, "engine_core_start": "forkserver"},
               "plain": {"startup_s": 41.0}, "odd": {"engine_core_start": "\x1b[2Jspawn"},
               "broken": "not a record"}
    seen = {}
    for name, record in records.items():
        result, _ = _result(tmp_path / name, {"artifacts/guidellm.json": data,
                                              "artifacts/service.json": json.dumps(record)})
        seen[name] = labels(result)["engine_core_start"]
    assert seen == {"forked": "forkserver", "plain": "", "odd": "", "broken": ""}


_times = st.one_of(st.none(), st.floats(0, 1e7), st.just(math.nan))


@settings(max_examples=200, deadline=None)
@given(records=st.lists(st.builds(
           RequestTimes, ttft_ms=_times, itl_ms=_times, tpot_ms=_times,
           request_latency_s=_times, output_tokens=st.one_of(st.none(), st.floats(0, 1e5))),
           max_size=40),
       bounds=st.fixed_dictionaries({}, optional={
           "ttft_ms": st.floats(1e-3, 1e7), "itl_ms": st.floats(1e-3, 1e7),
           "tpot_ms": st.floats(1e-3, 1e7), "request_latency_s": st.floats(1e-3, 8e4)}),
       successful=st.integers(0, 10_000), errored=st.integers(0, 10_000),
       rps=st.floats(0, 1e5), tps=st.one_of(st.none(), st.floats(0, 1e7)))
def test_goodput_is_bounded_on_any_sample_set(records: list, bounds: dict, successful: int,
                                              errored: int, rps: float,
                                              tps: float | None) -> None:
    found = goodput(records, ServingSlo(**bounds), successful=successful, errored=errored,
                    requests_per_second=rps, output_tokens_per_second=tps)
    if not bounds or successful + errored == 0 or (successful and not records):
        assert found is None
        return
    assert found is not None
    assert 0.0 <= found.slo_attainment_pct <= 100.0
    assert 0.0 <= found.goodput_requests_per_second <= rps
    assert found.goodput_tokens_per_second is None or (
        tps is not None and 0.0 <= found.goodput_tokens_per_second <= tps * (1 + 1e-12))
