"""The llm_serving project's contract: a model behind vLLM, loaded by GuideLLM.

Registered under the ``telltale.projects`` entry point; the engine calls the hooks below.

- local: `check_local` builds (once) the serving venv and the tiny model; `local_service`
  is the vLLM OpenAI server on that model (the engine starts it once for every cell that
  serves the same model and stops it in every outcome); `local_workload` is one cell's load
  (``workload/load.py``: /metrics, GuideLLM, /metrics) against it, on the serving venv's
  Python so that it forks from a warm Python of that venv with GuideLLM imported
  (`core.warm_python`). The launch is recorded, not a label (`kpis.labels`): every KPI is
  measured over GuideLLM's load window, which opens after its start-up either way;
- kubernetes: `kube_workload` is KServe's vLLM ServingRuntime + InferenceService, then (once
  it is Ready) the load Job (`projects.llm_serving.manifests`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import platformdirs

from analysis.curve_spec import CurveSpec
from analysis.parsing import ParsedResult
from core.errors import ConfigError
from core.loopback import LOOPBACK_HOST
from projects.contract import (
    USER_RESULT_DIR,
    USERS_CONFIG_PATH,
    CellContext,
    KubeGate,
    KubeService,
    KubeUsers,
    KubeWorkload,
    LocalService,
    LocalWorkload,
    Project,
)
from projects.library.data import content_hash
from projects.library.kinds import MANAGE, Kind
from projects.library.runs import run_timestamps, run_uuid
from projects.llm_serving import install, validity
from projects.llm_serving.kpis import KPIS, as_serving, labels, results_summary, slo_bound
from projects.llm_serving.manifests import JOB_NAME_LABEL, LOAD_SCRIPT, cell_manifests
from projects.llm_serving.models import ServingSettings, ServingTest
from projects.llm_serving.parser import ENGINE_CORE_STARTS, LOAD_STEP, ServingParser
from projects.llm_serving.settings import serving_environment
from projects.llm_serving.workload.vllm_server import SERVER_PRELOAD

__all__ = ["PROJECT", "model_dir"]

logger = logging.getLogger("telltale.llm_serving")
FOLDER = Path(__file__).resolve().parent
CORPUS = FOLDER.parent / "fine_tuning" / "data" / "alpaca_mini.jsonl"
"""The tokenizer's training text: the fine-tuning project's dataset (shipped in the repo)."""
_BUILDER = "projects.llm_serving.workload.build_model"
LOAD_MODULE = "projects.llm_serving.workload.load"
# vLLM's OpenAI server, its engine core forked from a preloaded fork server, or the whole
# server forked from a warm Python that imported SERVER_PRELOAD (why: its docstring)
SERVER_MODULE = "projects.llm_serving.workload.vllm_server"
# GuideLLM's command line and its benchmark entry point: importing them imports torch,
# transformers and datasets (~9 s, ~560 MB); a warm Python of the serving venv does it once
# and the load script runs GuideLLM forked from itself (workload/load.py).
LOAD_PRELOAD = ("guidellm.cli", "guidellm.benchmark")
_CHECKOUT = Path(__file__).resolve().parents[2]  # the load module's root on the venv's path
_BUILDER_VERSION = "1"


def _settings(ctx: CellContext) -> ServingSettings:
    if not isinstance(ctx.settings, ServingSettings):
        raise TypeError("the cell's settings are not llm_serving ServingSettings")
    return ctx.settings


def _test(ctx: CellContext) -> ServingTest:
    if not isinstance(ctx.test, ServingTest):
        raise TypeError("tests.llm_serving is not a ServingTest")
    return ctx.test


def _venv(test: ServingTest) -> Path:
    return Path(test.local.venv).expanduser() if test.local.venv else install.default_venv()


@functools.cache
def _corpus_digest() -> str:
    """The tokenizer corpus's sha256, read once per process (every cell's hooks ask)."""
    return hashlib.sha256(CORPUS.read_bytes()).hexdigest()


def model_dir(test: ServingTest, settings: ServingSettings) -> Path:
    """Where the cell's tiny model lives: a cache dir named by everything that shapes it."""
    name = str(settings.model_name)
    spec = test.local.models[name].model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(
        [spec, settings.max_model_len, _BUILDER_VERSION, _corpus_digest()],
        sort_keys=True).encode())
    return Path(platformdirs.user_cache_dir("telltale")) / "llm_serving" / "models" / \
        f"{name}-{digest.hexdigest()[:12]}"


def _build_model(test: ServingTest, settings: ServingSettings) -> Path:
    target = model_dir(test, settings)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    spec = test.local.models[str(settings.model_name)].model_dump(mode="json")
    logger.info("building the tiny model %s in %s", settings.model_name, target)
    done = subprocess.run([sys.executable, "-m", _BUILDER, json.dumps(spec), str(CORPUS),
                           str(settings.max_model_len), str(target)],
                          capture_output=True, text=True, check=False,
                          cwd=str(FOLDER.parent.parent))
    if done.returncode != 0:
        raise ConfigError(f"building model {settings.model_name!r} failed: "
                          f"{done.stderr.strip()[-800:]}",
                          key="tests.llm_serving.local.models")
    return target


def check_local(cells: Sequence[CellContext]) -> dict[str, Any]:
    """Before anything runs: the serving venv (built on first use) and each cell's model."""
    if not cells:
        return {}
    test = _test(cells[0])
    for ctx in cells:
        name = str(_settings(ctx).model_name)
        if name not in test.local.models:
            raise ConfigError(f"model {name!r} has no local spec; defined: "
                              f"{', '.join(sorted(test.local.models)) or '(none)'}",
                              key="tests.llm_serving.test_settings.model_name")
    venv = _venv(test)
    versions = install.installed(venv)
    if versions is None:
        if not test.local.auto_install:
            raise ConfigError(f"no serving venv in {venv}: python -m projects.llm_serving."
                              "install (or set tests.llm_serving.local.auto_install: true)",
                              key="tests.llm_serving.local.venv")
        try:
            versions = install.install(venv, say=logger.info)
        except RuntimeError as exc:
            raise ConfigError(f"building the serving venv failed: {exc}",
                              key="tests.llm_serving.local.venv") from None
    models = {str(_settings(c).model_name): str(_build_model(test, _settings(c)))
              for c in cells}
    return {"venv": str(venv), "versions": versions, "models": models,
            "data": {f"model:{name}": content_hash(Path(path)) for name, path in models.items()}}


def local_service(ctx: CellContext) -> LocalService:
    """The vLLM OpenAI server (CPU build) on the cell's tiny model."""
    settings, test = _settings(ctx), _test(ctx)
    model = model_dir(test, settings)
    python = install.venv_python(_venv(test))
    return LocalService(
        key=f"vllm-{settings.model_name}-{settings.max_model_len}"
            f"{'-eager' if test.local.enforce_eager else ''}",
        argv=[str(python), "-m", SERVER_MODULE, "--model", str(model),
              "--host", LOOPBACK_HOST, "--port", "{port}",
              "--max-model-len", str(settings.max_model_len),
              "--served-model-name", str(settings.model_name),
              *(["--enforce-eager"] if test.local.enforce_eager else [])],
        env={"VLLM_CPU_KVCACHE_SPACE": str(test.local.kv_cache_gb),
             "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
             "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
             "PYTHONPATH": str(_CHECKOUT)},
        health_path="/health", ready_timeout_s=float(test.local.ready_timeout_s),
        facts={"runtime": "vllm", "model_name": str(settings.model_name),
               "model_dir": str(model), "engine_core_start": ENGINE_CORE_STARTS[0]},
        needs=(str(model / "config.json"),), preload=SERVER_PRELOAD,
        forked_facts={"engine_core_start": ENGINE_CORE_STARTS[1]})


def _load_config(ctx: CellContext) -> dict[str, Any]:
    settings, test = _settings(ctx), _test(ctx)
    venv = _venv(test)
    return {"guidellm": [str(venv / "bin" / "guidellm")], "model": str(settings.model_name),
            "tokenizer": str(model_dir(test, settings)),
            "concurrency": settings.concurrency, "prompt_tokens": settings.prompt_tokens,
            "output_tokens": settings.output_tokens, "duration_s": settings.duration_s,
            "warmup_s": settings.warmup_s, "request_format": settings.request_format,
            "invalid_on_warnings": list(test.invalid_on_warnings)}


def local_workload(ctx: CellContext) -> LocalWorkload:
    """One cell's load against the server the engine started (``TELLTALE_SERVICE_URL``).

    The load script runs on the serving venv's Python (it is standard library only; its
    GuideLLM is that venv's), as a module of this checkout, so a warm Python of that venv
    with GuideLLM imported (`LOAD_PRELOAD`) can fork it (`core.warm_python`).
    """
    out = USER_RESULT_DIR if ctx.test.multi_user.enabled else str(ctx.workdir / "artifacts")
    config = ctx.workdir / "src" / "load.json"
    return LocalWorkload(
        argv=[str(install.venv_python(_venv(_test(ctx)))), "-m", LOAD_MODULE, str(config),
              "--out", out],
        env={"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1",
             "PYTHONPATH": str(_CHECKOUT)},
        files={"src/load.json": json.dumps(_load_config(ctx), indent=2) + "\n"},
        preload=LOAD_PRELOAD)


def _cluster_objects(ctx: CellContext) -> dict[str, Any]:
    """A cell's manifests by role (`manifests.cell_manifests`), its model checked first."""
    settings, test = _settings(ctx), _test(ctx)
    if str(settings.model_name) not in test.kubernetes.models:
        raise ConfigError(f"model {settings.model_name!r} is not in tests.llm_serving."
                          f"kubernetes.models ({', '.join(sorted(test.kubernetes.models))})",
                          key="tests.llm_serving.test_settings.model_name")
    return cell_manifests(settings.model_dump(mode="json"), namespace=test.namespace,
                          block=test.kubernetes.model_dump(mode="json"),
                          cell_index=ctx.index,
                          ready_timeout_s=test.kubernetes.ready_timeout_s,
                          invalid_on_warnings=list(test.invalid_on_warnings))


def _model_gate(ctx: CellContext, isvc: str) -> KubeGate:
    # the load starts once KServe says the model is Ready; a predictor pod that cannot pull
    # or keeps crashing fails the cell at once, with the kubelet's reason
    return KubeGate("serving.kserve.io/v1beta1", "InferenceService", isvc,
                    pods=f"serving.kserve.io/inferenceservice={isvc}",
                    deadline_s=float(_test(ctx).kubernetes.ready_timeout_s))


def kube_workload(ctx: CellContext) -> KubeWorkload:
    """KServe's vLLM runtime and InferenceService, then the load Pod (see manifests)."""
    objects = _cluster_objects(ctx)
    isvc, job = objects["isvc"]["metadata"]["name"], objects["job"]["metadata"]["name"]
    return KubeWorkload(
        shared=[objects["namespace"]],
        manifests=[objects["runtime"], objects["isvc"]],
        gates=[_model_gate(ctx, isvc)],
        after=[objects["configmap"], objects["job"]],
        pod="", pod_selector=f"{JOB_NAME_LABEL}={job}",
        files={"src/load.json": json.dumps(objects["load_config"], indent=2) + "\n"},
        capture=[("serving.kserve.io/v1beta1", "InferenceService", isvc,
                  "inferenceservice.json"), ("batch/v1", "Job", job, "job.json")])


def kube_users(ctx: CellContext) -> KubeUsers:
    """``multi_user`` on a cluster: N load clients (GuideLLM) against one model server.

    The runtime and InferenceService are the users' shared service, Ready before any
    user starts; each user pod fetches the tokenizer with the model (the load Job's init
    container), runs the load step with the cell's load config and leaves its GuideLLM
    result in its result dir (``users/user-NNN/guidellm.json``, as the local fan-out).
    """
    objects = _cluster_objects(ctx)
    isvc = objects["isvc"]["metadata"]["name"]
    tokenizer = objects["tokenizer"]
    folder = Path(USERS_CONFIG_PATH).parent
    return KubeUsers(
        name=f"{isvc}-clients", image=str(_settings(ctx).loadgen_image),
        command=["python3", str(folder / "load.py"), USERS_CONFIG_PATH, "--out",
                 USER_RESULT_DIR],
        config=objects["load_config"], files={"load.py": LOAD_SCRIPT.read_text("utf-8")},
        service=KubeService(shared=[objects["namespace"]],
                            manifests=[objects["runtime"], objects["isvc"]],
                            gates=[_model_gate(ctx, isvc)]),
        init_containers=[tokenizer["init"]], volumes=[tokenizer["volume"]],
        mounts=[tokenizer["mount"]], role="driver")


def _user_rows(result: ParsedResult) -> list[dict[str, object]]:
    return [user.model_dump() for user in as_serving(result).users]


PROJECT = Project(
    name="llm_serving",
    parser=ServingParser(),
    kpis=KPIS,
    labels=labels,
    results_summary=results_summary,
    run_uuid=run_uuid,
    timestamps=run_timestamps,
    plots_file=FOLDER / "plots.yaml",
    user_rows=_user_rows,
    samples=lambda r: as_serving(r).samples,
    bulky=("samples",),
    validity=validity.validity_reasons,
    measured_window=validity.measured_window,
    min_window_s=validity.MIN_WINDOW_S,
    # a sweep over concurrency is one curve: TTFT p95 against generated tokens/s, its knee
    # where the SLO stops being met, its frontier up to the SLO's TTFT bound
    curve=CurveSpec(load="concurrency", throughput="output_tokens_per_second",
                    latency="ttft_p95", meets="slo_met",
                    latency_cap=lambda labels: slo_bound(labels, "ttft_ms")),
    # read by the KPIs, labels and LTS results only (the report draws users for every run)
    analysis_only=("ttft_ms", "itl_ms", "tpot_ms", "request_latency_s", "server_counters"),
    folder=FOLDER,
    flow_name="llm-serving",
    test_model=ServingTest,
    workload_step=LOAD_STEP,
    local=local_workload,
    kubernetes=kube_workload,
    kube_users=kube_users,
    check_local=check_local,
    local_service=local_service,
    environment=serving_environment,
    # KServe: the model server, then the runtime it uses (after the load Job and its pods)
    kube_kinds=(Kind("serving.kserve.io/v1beta1", "InferenceService", "inferenceservices",
                     True, MANAGE, cleanup=50),
                Kind("serving.kserve.io/v1alpha1", "ServingRuntime", "servingruntimes", True,
                     MANAGE, cleanup=60)),
)
