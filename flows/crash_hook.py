"""The crash hook: a run that dies (cancelled, crashed) still releases what it held.

Prefect calls `cleanup_hook` on a flow run's Cancelled or Crashed state, in a process that
may not be the run's own. It reads each of the run's artifact dirs (``cluster.json``,
``lease.json``) with the run's *saved* ``config.yaml`` and tears down the cluster and the
lease; what it did, and what is left (with the command that finishes it), goes to
``crash_cleanup.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.safeio import write_text
from core.yamlio import load_yaml
from flows.cli import (
    runs_root,
)
from flows.log_bridge import logger
from projects.library import ClustersBlock, SecretsBlock
from tasks.artifacts import use_artifact_dir
from tasks.kube.api import owned_clients
from tasks.lab import provision
from tasks.platforms.local import cleanup_local


def _leftover(error: BaseException, root: Path, project: str) -> str:
    """One line: what may still be active after a failed teardown, and how to remove it."""
    text = str(error)
    command = f"python -m flows.cleanup --quads --project {project}"
    if "python -m flows.cleanup --quads" in text:
        return text.replace("python -m flows.cleanup --quads", command, 1)
    return f"{text}; it may still be active: remove it with `{command} --artifact-dir {root}`"


CRASH_CLEANUP_FILE = "crash_cleanup.json"


def cleanup_hook(project_name: str) -> Callable[..., None]:
    """A crash/cancellation hook for a project's flow (Prefect runs it in another process).

    Prefect calls hooks two ways: its flow engine positionally, ``hook(flow, flow_run,
    state)``; a worker's or ``serve()``'s runner by keyword, ``hook(flow=..., flow_run=...,
    state=...)`` (a deployed run that crashes or is cancelled). The parameters carry exactly
    those names so both work (`tests/flows/test_hooks.py` checks every flow's hooks both ways).

    It finds the run's artifact dir from the flow run's parameters (or the default name),
    stops local leftovers, and destroys the cluster / releases the lease the run recorded
    (``cluster.json``, ``lease.json``) with the run's *saved* ``config.yaml``. What it did
    (or could not do) is written to ``crash_cleanup.json`` in the run's dir.
    """

    def hook(flow: Any, flow_run: Any, state: Any) -> None:
        del flow  # part of Prefect's hook signature; the run is found by its id
        params = getattr(flow_run, "parameters", {}) or {}
        target = params.get("artifact_dir")
        deployed = getattr(flow_run, "deployment_id", None) is not None
        roots = [Path(target)] if target else sorted(
            runs_root(deployed=deployed).glob(f"*-{project_name}-{str(flow_run.id)[:8]}"))
        for root in roots:
            if not root.is_dir():
                continue
            record: dict[str, Any] = {"state": getattr(state, "name", str(state)),
                                      "at": datetime.now(UTC).isoformat(),
                                      "local": cleanup_local(root), "errors": []}
            if (root / "cluster.json").is_file() or (root / "lease.json").is_file():
                try:
                    # only the blocks the teardown needs: the rest of a saved config (its
                    # values masked at save) must not keep a lease from being released
                    saved, _ = load_yaml(root / "config.yaml")
                    clusters = ClustersBlock.model_validate(saved.get("clusters") or {})
                    secrets = SecretsBlock.model_validate(saved.get("secrets") or {})
                    with use_artifact_dir(root), owned_clients():
                        provision.teardown.fn(str(root), clusters.keep, secrets,
                                              clusters.kubeconfig)
                    record["teardown"] = "done"
                except Exception as exc:  # a hook must not raise; say what is left
                    logger.error("crash cleanup of %s incomplete: %s", root, exc)
                    record["errors"].append(_leftover(exc, root, project_name))
            try:
                write_text(root / CRASH_CLEANUP_FILE, json.dumps(record, indent=2, default=str))
            except OSError as exc:
                logger.error("could not write %s/%s: %s", root, CRASH_CLEANUP_FILE, exc)

    return hook
