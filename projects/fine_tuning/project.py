"""The fine_tuning project's contract: config, workload per platform, post-processing.

Registered under the ``telltale.projects`` entry point; the engine calls these hooks and
never imports anything else from this folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from analysis.parsing import ParsedResult
from core.errors import ConfigError
from projects.contract import (
    SCRATCH_DIR,
    USERS_CONFIG_PATH,
    CellContext,
    KubeUsers,
    KubeWorkload,
    LocalWorkload,
    Project,
    Staging,
)
from projects.fine_tuning import validity
from projects.fine_tuning.kpis import KPIS, labels, results_summary
from projects.fine_tuning.manifests import DATA_SOURCE_LABEL, cell_manifests
from projects.fine_tuning.models import FineTuningTest, TestSettings
from projects.fine_tuning.parser import FineTuningParser, FineTuningResult
from projects.fine_tuning.trainer import trainer_config
from projects.library.data import content_hash, data_file
from projects.library.kinds import MANAGE, Kind
from projects.library.runs import run_timestamps, run_uuid

__all__ = ["PROJECT", "WORKLOAD_MODULE"]

WORKLOAD_MODULE = "projects.fine_tuning.workload.train_local"
# What the trainer imports that takes seconds (torch, the Trainer and its integrations, the
# Llama model, peft, tokenizers): a warm Python imports them once (core.warm_python).
PRELOAD = ("torch", "transformers", "transformers.trainer", "transformers.data.data_collator",
           "transformers.models.llama.modeling_llama", "tokenizers", "peft")
_LOCAL_EXTRA = ("torch", "transformers", "peft", "accelerate", "tokenizers")
_FOLDER = Path(__file__).resolve().parent
DATASET_KEY = "tests.fine_tuning.test_settings.dataset_name"


def _as_ft(result: ParsedResult) -> FineTuningResult:
    if not isinstance(result, FineTuningResult):
        raise TypeError(f"expected a FineTuningResult, got {type(result).__name__}")
    return result


def _loss_curve(result: ParsedResult) -> list[dict[str, float]]:
    losses = _as_ft(result).progress.loss
    return [{"step": step, "loss": loss} for step, loss in enumerate(losses, start=1)
            if loss is not None]


def _user_rows(result: ParsedResult) -> list[dict[str, object]]:
    return [user.model_dump() for user in _as_ft(result).users]


def _test(ctx: CellContext) -> FineTuningTest:
    if not isinstance(ctx.test, FineTuningTest):
        raise TypeError("tests.fine_tuning is not a FineTuningTest")
    return ctx.test


def _settings(ctx: CellContext) -> TestSettings:
    """The cell's typed settings (the object the plan validated)."""
    if not isinstance(ctx.settings, TestSettings):
        raise TypeError("the cell's settings are not fine_tuning's TestSettings")
    return ctx.settings


def local_workload(ctx: CellContext) -> LocalWorkload:
    """The trainer stack in miniature: its config file and ``python -m`` command."""
    settings, test = _settings(ctx), _test(ctx)
    spec = test.local_models[settings.model_name]
    dataset = data_file(ctx.data_dir, settings.dataset_name, key=DATASET_KEY,
                        what="dataset")
    config = trainer_config(settings, str(dataset),
                            str(ctx.workdir / SCRATCH_DIR / "output"),
                            local_model=spec, logging_steps=10)
    config_file = ctx.workdir / "src" / "config_final.json"
    return LocalWorkload(argv=[sys.executable, "-m", WORKLOAD_MODULE, str(config_file)],
                         env={"PYTHONUNBUFFERED": "1"},
                         files={"src/config_final.json": config.file_text()},
                         preload=PRELOAD)


def _check_gpus(wanted: int) -> None:
    """Fail before anything runs when a cell asks for more GPUs than NVML sees here.

    NVML answers in milliseconds (torch would take seconds to import); the trainer checks
    again with torch, which is what trains.
    """
    if wanted < 1:
        return
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            seen = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no library, no driver: no GPU here
        seen, why = 0, f" (NVML: {str(exc)[:120]})"
    else:
        why = ""
    if seen < wanted:
        raise ConfigError(f"a cell asks for gpu: {wanted}, this machine has {seen} NVIDIA "
                          f"GPU(s){why}; set gpu: 0 to train on the CPU",
                          key="tests.fine_tuning.test_settings.gpu")


def check_local(cells: Sequence[CellContext]) -> dict[str, Any]:
    """Fail before anything runs when a dataset, a model spec or a library is missing."""
    missing = [name for name in _LOCAL_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"the local workload needs {', '.join(missing)}: "
                          "pip install torch==2.13.0 && pip install -e '.[local]'")
    settings = [_settings(c) for c in cells]
    _check_gpus(max(int(s.gpu) for s in settings) if settings else 0)  # type: ignore[arg-type]
    datasets = sorted({s.dataset_name for s in settings})
    data_dir = _FOLDER / "data"
    hashes = {name: content_hash(data_file(data_dir, name, key=DATASET_KEY, what="dataset"))
              for name in datasets}
    models = sorted({s.model_name for s in settings})
    local_models = _test(cells[0]).local_models if cells else {}
    for name in models:
        if name not in local_models:
            raise ConfigError(f"model {name!r} has no local spec; defined: "
                              f"{', '.join(sorted(local_models)) or '(none)'}",
                              key="tests.fine_tuning.test_settings.model_name")
    versions = {}
    for name in _LOCAL_EXTRA:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    for name in models:
        spec = json.dumps(local_models[name].model_dump(), sort_keys=True, default=str)
        hashes[f"model:{name}"] = hashlib.sha256(spec.encode()).hexdigest()[:16]
    return {"datasets": datasets, "models": models, "versions": versions, "data": hashes}


def kube_workload(ctx: CellContext) -> KubeWorkload:
    """A PyTorchJob (Master + Workers) with its config, after staging data on a PVC."""
    test = _test(ctx)
    namespace_obj, pvc, staging, configmap, pytorchjob = cell_manifests(
        _settings(ctx), namespace=test.namespace, block=test.kubernetes,
        cell_index=ctx.index)
    name = pytorchjob["metadata"]["name"]
    return KubeWorkload(
        shared=[namespace_obj], manifests=[configmap, pytorchjob],
        pod=f"{name}-master-0",  # the training operator's naming
        staging=Staging(volume=pvc, job=staging, label=DATA_SOURCE_LABEL),
        files={"src/config_final.json": configmap["data"]["config.json"] + "\n"},
        capture=[("kubeflow.org/v1", "PyTorchJob", name, "pytorchjob.json")])


def kube_users(ctx: CellContext) -> KubeUsers:
    """Each user pod runs the fms-hf-tuning trainer on the frozen config."""
    settings = _settings(ctx)
    name = f"{settings.name[:40]}-users-{ctx.index:03d}"
    config = trainer_config(settings, f"/mnt/storage/dataset/{settings.dataset_name}",
                            "/tmp/output")
    return KubeUsers(name=name, image=str(settings.container_image),
                     command=["python3", "-m", "tuning.sft_trainer"],
                     config=config.model_dump(mode="json", exclude_unset=True),
                     env={"SFT_TRAINER_CONFIG_JSON_PATH": USERS_CONFIG_PATH},
                     gpus=int(settings.gpu))  # type: ignore[arg-type]


PROJECT = Project(
    name="fine_tuning",
    parser=FineTuningParser(),
    kpis=KPIS,
    labels=lambda r: labels(_as_ft(r)),
    results_summary=lambda r: results_summary(_as_ft(r)),
    run_uuid=run_uuid,
    timestamps=run_timestamps,
    plots_file=_FOLDER / "plots.yaml",
    loss_curve=_loss_curve,
    user_rows=_user_rows,
    bulky=("progress",),
    validity=validity.validity_reasons,
    measured_window=validity.measured_window,
    min_window_s=validity.MIN_WINDOW_S,
    # read by the KPIs, labels and LTS results only (the report draws users for every run)
    analysis_only=("platform", "trainer_config", "dataset_stats", "summary", "workload",
                   "first_loss", "last_loss"),
    folder=_FOLDER,
    flow_name="fine-tuning",
    test_model=FineTuningTest,
    workload_step="run_fine_tuning_job",
    local=local_workload,
    kubernetes=kube_workload,
    kube_users=kube_users,
    check_local=check_local,
    # the Kubeflow training operator's job, deleted first at cleanup (its pods go with it)
    kube_kinds=(Kind("kubeflow.org/v1", "PyTorchJob", "pytorchjobs", True, MANAGE,
                     cleanup=10),),
)
