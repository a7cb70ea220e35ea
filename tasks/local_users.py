"""Multi-user fan-out of the fine-tuning workload on the local platform (the scale test).

One Prefect task launches the whole fan-out (``python -m tasks.fanout`` in its own process);
it follows the users through their files and keeps a progress artifact with the pending,
running, succeeded and failed counts. Per-user results land in ``users/user-<index>/``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from analysis.errors import StepError
from projects.fine_tuning.trainer import trainer_config
from tasks.artifacts import artifact_dir, step
from tasks.local_platform import WORKLOAD_MODULE

__all__ = ["UsersOutcome", "count_users", "run_fine_tuning_job"]

logger = logging.getLogger("telltale.users")


class UsersOutcome(BaseModel):
    """How a fan-out ended."""

    exit_code: int
    finish_reason: str
    success_count: int
    user_count: int
    duration_s: float


def count_users(root: Path, users: int) -> dict[str, int]:
    """Pending / running / succeeded / failed counts from the users' files."""
    counts = {"pending": 0, "running": 0, "succeeded": 0, "failed": 0}
    for index in range(users):
        directory = root / f"user-{index:03d}"
        code_file = directory / "exit_code"
        if code_file.exists():
            try:
                code = int(code_file.read_text().strip())
            except ValueError:
                code = 1
            counts["succeeded" if code == 0 else "failed"] += 1
        elif (directory / "pod.log").exists():
            counts["running"] += 1
        else:
            counts["pending"] += 1
    return counts


def _progress(artifact_id: Any, counts: dict[str, int], users: int) -> None:
    if artifact_id is None:
        return
    from prefect.artifacts import update_progress_artifact

    done = counts["succeeded"] + counts["failed"]
    update_progress_artifact(artifact_id=artifact_id, progress=round(100 * done / users, 1),
                             description=", ".join(f"{k}: {v}" for k, v in counts.items()))


@step("fine_tuning")
def run_fine_tuning_job(job_name: str, settings: dict[str, Any], timeout_minutes: int,
                        local_models: dict[str, dict[str, Any]], data_dir: str,
                        multi_user: dict[str, Any], logging_steps: int = 10) -> UsersOutcome:
    """Run ``multi_user.user_count`` concurrent users of the workload behind a start barrier.

    Args:
        job_name: Name of the job.
        settings: The cell's settings.
        timeout_minutes: Deadline of the whole fan-out.
        local_models: Tiny model specs by name.
        data_dir: Directory holding the datasets.
        multi_user: ``tests.fine_tuning.multi_user`` (count, batch size, sleep factor,
            abort_on_failure, need_all_success).
        logging_steps: Trainer logging period.

    Returns:
        The `UsersOutcome`: exit code 0 when enough users succeeded (all of them with
        ``need_all_success``, else at least one).
    """
    here = artifact_dir()
    (here / "src").mkdir(exist_ok=True)
    model = settings["model_name"]
    if model not in local_models:
        raise StepError(f"model {model!r} has no local spec")
    config = trainer_config(settings, str(Path(data_dir) / settings["dataset_name"]),
                            str(here / "scratch" / "output"), local_model=local_models[model],
                            logging_steps=logging_steps)
    config_file = here / "src" / "config_final.json"
    config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    users = int(multi_user["user_count"])
    root = here / "users"
    argv = [sys.executable, "-m", "tasks.fanout", "--users", str(users), "--root", str(root),
            "--batch-size", str(multi_user["batch_size"]),
            "--sleep-factor", str(multi_user["sleep_factor"])]
    if multi_user.get("abort_on_failure"):
        argv.append("--abort-on-failure")
    argv += ["--", sys.executable, "-m", WORKLOAD_MODULE, str(config_file)]
    try:
        from prefect.artifacts import create_progress_artifact

        artifact_id = create_progress_artifact(progress=0.0,
                                               description=f"{users} users pending")
    except Exception:  # outside a flow run there is nowhere to report progress
        artifact_id = None
    started = time.monotonic()
    deadline = started + timeout_minutes * 60
    logger.info("starting %d users of %s", users, job_name)
    with open(here / "launcher.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        last: dict[str, int] = {}
        while process.poll() is None:
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise StepError(f"{users} users not done after {timeout_minutes} min")
            counts = count_users(root, users)
            if counts != last:
                _progress(artifact_id, counts, users)
                last = counts
            time.sleep(0.5)
    counts = count_users(root, users)
    _progress(artifact_id, counts, users)
    success = counts["succeeded"]
    need = users if multi_user.get("need_all_success") else 1
    code = 0 if success >= need else 1
    reason = f"{success}/{users} users succeeded"
    logger.info("%s (%s)", reason, counts)
    return UsersOutcome(exit_code=code, finish_reason=reason, success_count=success,
                        user_count=users, duration_s=time.monotonic() - started)
