"""fine_tuning KPIs and labels (DESIGN §6)."""

from __future__ import annotations

from typing import Any

from analysis.kpi import KpiDefinition
from projects.fine_tuning.parser import FineTuningResult
from projects.library.cost import cost_per_million_tokens, declared_cost
from projects.library.energy import energy_kpis
from projects.library.resources import resource_kpis
from projects.library.runs import launch_label

__all__ = ["KPIS", "LTS_VERSION", "labels", "num_gpus", "results_summary"]

LTS_VERSION = "1.0"


def _window_tokens(result: FineTuningResult) -> float | None:
    """Tokens trained over the training window: the trainer's rate times its runtime."""
    rate, runtime = _train_tps(result), _summary(result, "train_runtime")
    return rate * runtime if rate and runtime else None


def num_gpus(result: FineTuningResult) -> int:
    """GPUs per pod; 0 (the local platform, CPU) counts as 1."""
    try:
        value = int(result.settings.get("gpu") or 0)
    except (TypeError, ValueError):
        value = 0
    return value if value > 0 else 1


def _summary(result: FineTuningResult, key: str) -> float | None:
    return getattr(result.summary, key) if result.summary is not None else None


def _dataset_tps(result: FineTuningResult) -> float | None:
    runtime = _summary(result, "train_runtime")
    total = result.dataset_stats.total_tokens if result.dataset_stats else None
    if not runtime or total is None:
        return None
    return total / runtime


def _has_gpus(result: FineTuningResult) -> bool:
    """Whether the run asked for GPUs: a CPU-only run has no per-GPU KPI (not a fake 1 GPU)."""
    try:
        return int(result.settings.get("gpu") or 0) > 0
    except (TypeError, ValueError):
        return False


def _per_gpu(value: float | None, result: FineTuningResult) -> float | None:
    return None if value is None or not _has_gpus(result) else value / num_gpus(result)


def _train_tps(result: FineTuningResult) -> float | None:
    value = _summary(result, "train_tokens_per_second")
    return None if value is None else value * num_gpus(result)


def _gpu_hours_per_mtok(result: FineTuningResult) -> float | None:
    tps = _dataset_tps(result)
    if not tps or not _has_gpus(result):
        return None
    return 1e6 / tps / 3600 * num_gpus(result)


def _cost_per_mtok(result: FineTuningResult) -> float | None:
    """Declared price of a million dataset tokens (`projects.library.cost`)."""
    try:
        pods = int(result.settings.get("pod_count") or 1)
    except (TypeError, ValueError):
        pods = 1
    gpus = num_gpus(result) * pods if _has_gpus(result) else 0
    return cost_per_million_tokens(declared_cost(result.settings), _dataset_tps(result),
                                   gpus=gpus, nodes=pods)


def _user_values(result: FineTuningResult, field: str, *, succeeded: bool = True) -> list[float]:
    return [getattr(u, field) for u in result.users if getattr(u, field) is not None
            and (not succeeded or u.exit_code == 0)]


def _user_stat(field: str, stat: str) -> Any:
    def compute(result: FineTuningResult) -> float | None:
        values = _user_values(result, field)
        if not values:
            return None
        if stat == "max":
            return max(values)
        import numpy as np  # here: the project's declaration is imported by every command line

        return float(np.percentile(values, {"p50": 50, "p90": 90}[stat]))

    return compute


def _success_ratio(result: FineTuningResult) -> float | None:
    if not result.users:
        return None
    return sum(u.exit_code == 0 for u in result.users) / len(result.users)


_USER_KPIS = [
    KpiDefinition("users_success_ratio", "Share of users whose workload succeeded", "ratio",
                  False, _success_ratio, format="{:.0%}"),
    *[KpiDefinition(f"user_time_to_start_{stat}", f"User time to start ({stat}): launch to "
                    "workload start, barrier and stagger included", "s", True,
                    _user_stat("time_to_start_s", stat), format="{:.2f}")
      for stat in ("p50", "p90", "max")],
    *[KpiDefinition(f"user_runtime_{stat}", f"User workload runtime ({stat})", "s", True,
                    _user_stat("runtime_s", stat), format="{:.2f}")
      for stat in ("p50", "p90", "max")],
    KpiDefinition("user_train_tokens_per_second_p50", "Per-user training throughput (p50)",
                  "tokens/s", False, _user_stat("train_tokens_per_second", "p50"),
                  format="{:,.1f}"),
    KpiDefinition("users_train_tokens_per_second_total", "Training throughput of all users "
                  "together", "tokens/s", False,
                  lambda r: sum(_user_values(r, "train_tokens_per_second")) or None,
                  format="{:,.1f}"),
]

KPIS: list[KpiDefinition] = [
    KpiDefinition("train_tokens_per_second", "Training throughput reported by the trainer, "
                  "all GPUs of the pod", "tokens/s", False, _train_tps, format="{:,.1f}"),
    KpiDefinition("dataset_tokens_per_second", "Dataset tokens divided by the training runtime",
                  "tokens/s", False, _dataset_tps, format="{:,.1f}"),
    KpiDefinition("dataset_tokens_per_second_per_gpu", "Dataset throughput per GPU",
                  "tokens/s", False, lambda r: _per_gpu(_dataset_tps(r), r), format="{:,.1f}"),
    KpiDefinition("train_tokens_per_gpu_per_second", "Trainer throughput per GPU",
                  "tokens/s", False, lambda r: _per_gpu(_train_tps(r), r), format="{:,.1f}"),
    KpiDefinition("gpu_hours_per_million_tokens", "GPU-hours needed to train one million "
                  "dataset tokens", "h/Mtok", True, _gpu_hours_per_mtok, format="{:.4f}"),
    KpiDefinition("cost_per_million_tokens", "Price of training one million dataset tokens, "
                  "from the prices declared in test_settings.cost (per GPU-hour, or per "
                  "node-hour without GPUs; in its currency): declared, not measured",
                  "currency/Mtok", True, _cost_per_mtok, format="{:.4g}"),
    KpiDefinition("train_samples_per_second", "Samples trained per second", "samples/s", False,
                  lambda r: _summary(r, "train_samples_per_second")),
    KpiDefinition("train_steps_per_second", "Optimizer steps per second", "steps/s", False,
                  lambda r: _summary(r, "train_steps_per_second")),
    KpiDefinition("train_runtime", "Training wall time", "s", True,
                  lambda r: _summary(r, "train_runtime"), format="{:.2f}"),
    KpiDefinition("avg_tokens_per_sample", "Average tokens per dataset sample", "tokens", False,
                  lambda r: r.dataset_stats.avg_tokens_per_sample if r.dataset_stats else None,
                  ignored_for_regression=True, format="{:.1f}"),
    *_USER_KPIS,
    *resource_kpis(lambda r: r.resources, _train_tps),
    *energy_kpis(lambda r: r.energy, _window_tokens, "the tokens the trainer reports over "
                 "its training steps"),
]


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def labels(result: FineTuningResult) -> dict[str, str]:
    """The run's identity: what must match for two runs to be compared."""
    settings = result.settings
    hp = settings.get("hyper_parameters") or {}
    peft = str(hp.get("peft_method") or "none").lower()
    lora = peft == "lora"
    per_device = hp.get("per_device_train_batch_size")
    accumulation = hp.get("gradient_accumulation_steps") or 1
    replicas = settings.get("pod_count") or 1
    gpus = int(settings.get("gpu") or 0)
    try:
        global_batch: Any = int(per_device) * int(accumulation) * int(replicas) * max(gpus, 1)
    except (TypeError, ValueError):
        global_batch = None
    facts = result.platform
    return {k: _text(v) for k, v in {
        "lts_version": LTS_VERSION,
        "platform": facts.platform,
        "ocp_version": facts.ocp_version,
        "rhoai_version": facts.rhoai_version,
        "os_version": facts.os_version,
        "python_version": facts.python_version,
        "torch_version": facts.torch_version,
        "transformers_version": facts.transformers_version,
        "cpu_model": facts.cpu_model,
        "instance_type": facts.instance_type,
        "accelerator_type": facts.accelerator_type or ("cpu" if gpus == 0 else None),
        "accelerator_count": gpus,
        "model_name": settings.get("model_name"),
        "tuning_method": "lora" if lora else ("full" if peft in ("none", "full") else peft),
        "per_device_batch_size": per_device,
        "global_batch_size": global_batch,
        "max_seq_length": hp.get("max_seq_length"),
        # a sweep over the learning rate is several configurations, not one noisy history
        "learning_rate": hp.get("learning_rate"),
        "gradient_accumulation_steps": accumulation,
        "num_epochs": hp.get("num_train_epochs"),
        "max_steps": settings.get("max_steps"),
        "container_image": settings.get("container_image") if facts.platform != "local" else "",
        "telltale_image": facts.telltale_image,
        "replicas": replicas,
        # forked from a warm Python or fresh: other resource KPIs, another configuration
        "launch": launch_label(result.workload.launch),
        "user_count": len(result.users) or 1,
        "accelerators_per_replica": gpus,
        "lora_rank": hp.get("r") if lora else None,
        "lora_alpha": hp.get("lora_alpha") if lora else None,
        "lora_dropout": hp.get("lora_dropout") if lora else None,
        "lora_modules": hp.get("target_modules") if lora else None,
        "dataset_name": settings.get("dataset_name"),
        "dataset_replication": settings.get("dataset_replication"),
        "ci_engine": settings.get("ci_engine"),
        "run_id": settings.get("run_id"),
        "test_path": result.rel_path,
        "urls": settings.get("urls"),
    }.items()}


def results_summary(result: FineTuningResult) -> dict[str, Any]:
    """Flat parsed values for the LTS ``results`` block."""
    out: dict[str, Any] = {}
    if result.summary is not None:
        out.update(result.summary.model_dump(exclude_none=True))
    if result.dataset_stats is not None:
        out.update({f"dataset_{k}": v for k, v in
                    result.dataset_stats.model_dump(exclude_none=True).items()})
    # from the parser's ends of the curve: an older run's curve is not read (bulky)
    out["first_loss"], out["last_loss"] = result.first_loss, result.last_loss
    if result.users:
        out["user_count"] = len(result.users)
        out["users_succeeded"] = sum(u.exit_code == 0 for u in result.users)
    out["workload_exit_code"] = result.workload.exit_code
    out["workload_finish_reason"] = result.workload.finish_reason
    return {k: v for k, v in out.items() if v is not None}
