"""Cluster fan-out: N users as one Indexed Job, a start barrier through S3, per-user results.

- `user_job_manifests`: a ConfigMap with the user program (`tasks.kube.user_pod_script`, standard
  library only) and the frozen config, and a ``batch/v1`` Job with
  ``completionMode: Indexed``, ``completions = parallelism = N``, ``backoffLimit: 0`` and a
  deadline. Each pod learns its index from ``JOB_COMPLETION_INDEX``.
- Barrier and stagger happen inside the pods (see the user program): no user starts its
  workload before all N have announced themselves in S3.
- `follow_users` watches the Job's counters (pending/running/succeeded/failed, published as a
  progress artifact) until every index ended or the deadline passed; with
  ``abort_on_failure`` the first failure deletes the Job (and its pods).
- `collect_users` downloads ``user-<index>/`` from S3 for a batch of indices: the flow maps it
  over batches (never one Prefect task per user) into the local fan-out's layout, so the same
  parser reads both.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from core.errors import StepError
from projects.contract import USERS_CONFIG_PATH
from tasks.kube.api import Kube

__all__ = ["S3_SERVICE", "UsersJobStatus", "collect_users", "deploy_in_cluster_s3",
           "follow_users", "in_cluster_s3_manifests", "user_job_manifests"]

if TYPE_CHECKING:  # the block imports Prefect: only where a collection really runs
    from blocks.s3 import S3Target

logger = logging.getLogger("telltale.users")
SCRIPT = Path(__file__).with_name("user_pod_script.py")
PROGRAM_IN_IMAGE = "/opt/telltale/user.py"
"""Where the Containerfile's ``user-pod`` target puts the user program."""
PROGRAM_DIR = "/opt/telltale-program"


class UsersJobStatus(BaseModel):
    """Counts of an Indexed Job's users."""

    users: int
    pending: int
    running: int
    succeeded: int
    failed: int
    aborted: bool = False

    @property
    def done(self) -> bool:
        """Every user ended (or the job was aborted)."""
        return self.aborted or self.succeeded + self.failed >= self.users


def user_job_manifests(name: str, namespace: str, *, users: int, image: str,
                       command: Sequence[str], config: dict[str, Any], batch_size: int,
                       sleep_factor: float, deadline_s: int, s3_endpoint: str, bucket: str,
                       prefix: str, barrier_timeout_s: int = 600,
                       gpus: int = 0, env: Mapping[str, str] | None = None,
                       files: Mapping[str, str] | None = None,
                       init_containers: Sequence[dict[str, Any]] = (),
                       volumes: Sequence[dict[str, Any]] = (),
                       mounts: Sequence[dict[str, Any]] = (),
                       program_image: str | None = None) -> list[dict[str, Any]]:
    """The ConfigMap (user program + frozen config) and the Indexed Job of a fan-out.

    The config is mounted at `projects.contract.USERS_CONFIG_PATH`, ``files`` beside it;
    ``env`` adds the project's variables (e.g. where its trainer reads that config);
    ``init_containers``, ``volumes`` and ``mounts`` extend every user pod (`KubeUsers`).
    With ``program_image`` (Telltale's ``user-pod`` image, built from the PR under test),
    the user program comes from that image — copied by an init container into the pod —
    instead of the ConfigMap, so the pods run exactly the PR's code, by digest.

    Raises:
        StepError: A project file would replace the user program or the config.
    """
    clash = sorted(set(files or {}) & {"user.py", "config.json"})
    if clash:
        raise StepError(f"KubeUsers.files may not replace {', '.join(clash)}")
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": f"{name}-users", "namespace": namespace},
                 "data": {"user.py": SCRIPT.read_text(encoding="utf-8"),
                          "config.json": json.dumps(config, indent=2), **dict(files or {})}}
    mount = str(Path(USERS_CONFIG_PATH).parent)
    variables = {"TELLTALE_USERS": str(users), "TELLTALE_BATCH_SIZE": str(batch_size),
           "TELLTALE_SLEEP_FACTOR": str(sleep_factor),
           "TELLTALE_BARRIER_TIMEOUT": str(barrier_timeout_s),
           "TELLTALE_S3_ENDPOINT": s3_endpoint, "TELLTALE_S3_BUCKET": bucket,
           "TELLTALE_S3_PREFIX": prefix, "TELLTALE_LAUNCHED_AT": str(time.time()),
           "TELLTALE_COMMAND": json.dumps(list(command)), **dict(env or {})}
    program = f"{mount}/user.py"
    own: list[dict[str, Any]] = []
    own_volumes: list[dict[str, Any]] = []
    own_mounts: list[dict[str, Any]] = []
    if program_image is not None:
        program = f"{PROGRAM_DIR}/user.py"
        own = [{"name": "telltale-program", "image": program_image,
                "command": ["cp", PROGRAM_IN_IMAGE, program],
                "volumeMounts": [{"name": "telltale-program", "mountPath": PROGRAM_DIR}]}]
        own_volumes = [{"name": "telltale-program", "emptyDir": {}}]
        own_mounts = [{"name": "telltale-program", "mountPath": PROGRAM_DIR}]
    container: dict[str, Any] = {
        "name": "user", "image": image, "command": ["python3", program],
        "env": [{"name": k, "value": v} for k, v in variables.items()],
        "volumeMounts": [{"name": "users", "mountPath": mount}, *own_mounts, *mounts]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"completionMode": "Indexed", "completions": users, "parallelism": users,
                    "backoffLimit": 0, "activeDeadlineSeconds": deadline_s,
                    "template": {"spec": {
                        "restartPolicy": "Never", "containers": [container],
                        **({"initContainers": [*own, *init_containers]}
                           if own or init_containers else {}),
                        "volumes": [{"name": "users", "configMap": {"name": f"{name}-users"}},
                                    *own_volumes, *volumes]}}}}
    return [configmap, job]


def _status(job: dict[str, Any] | None, users: int) -> UsersJobStatus:
    status = (job or {}).get("status") or {}
    succeeded, failed = int(status.get("succeeded", 0)), int(status.get("failed", 0))
    running = int(status.get("active", 0))
    return UsersJobStatus(users=users, pending=max(0, users - running - succeeded - failed),
                          running=running, succeeded=succeeded, failed=failed)


def follow_users(kube: Kube, name: str, namespace: str, users: int, *, deadline_s: float,
                 abort_on_failure: bool = False,
                 progress: Callable[[UsersJobStatus], None] | None = None) -> UsersJobStatus:
    """Follow the Indexed Job until every user ended; abort on the first failure if asked."""
    last: UsersJobStatus | None = None

    def observe(job: dict[str, Any]) -> None:
        nonlocal last
        current = _status(job, users)
        if current != last and progress is not None:
            progress(current)
        last = current

    def failed_and_aborting(job: dict[str, Any]) -> str | None:
        if abort_on_failure and _status(job, users).failed:
            return "a user failed (abort_on_failure)"
        return None

    try:
        job = kube.wait("batch/v1", "Job", name, namespace, deadline_s=deadline_s,
                        ready=lambda o: _status(o, users).done, fail=failed_and_aborting,
                        progress=observe, what=f"{users} users of {name}")
    except StepError as exc:
        if "abort_on_failure" not in str(exc):
            raise
        kube.delete("batch/v1", "Job", name, namespace)
        aborted = (last or _status(None, users)).model_copy(update={"aborted": True})
        logger.warning("aborted %s after a user failed", name)
        return aborted
    return _status(job, users)


def collect_users(indices: Sequence[int], url: str, dest: str, target: S3Target) -> list[int]:
    """Download ``user-<index>/`` for a batch of indices into ``dest/users/``.

    Returns:
        The indices that had results.
    """
    from tasks.publish.s3 import map_s3_error, safe_target  # boto3 and the block: lazily

    bucket, _, prefix = url[len("s3://"):].partition("/")
    root = Path(dest) / "users"
    found = []
    with target.client() as client:
        for index in indices:
            user = f"user-{index:03d}"
            key_prefix = f"{prefix.strip('/')}/{user}/"
            try:
                listing = client.list_objects_v2(Bucket=bucket, Prefix=key_prefix)
            except Exception as exc:
                raise map_s3_error(exc, f"list {user}") from exc
            keys = [o["Key"] for o in listing.get("Contents", [])]
            for key in keys:
                path = safe_target(root, f"{user}/{key[len(key_prefix):]}")
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    client.download_file(bucket, key, str(path))
                except Exception as exc:
                    raise map_s3_error(exc, f"download {key}") from exc
            if keys:
                found.append(index)
    return found


S3_SERVICE = "telltale-s3"


def in_cluster_s3_manifests(namespace: str, bucket: str, *,
                            image: str = "quay.io/minio/minio:latest",
                            client_image: str = "quay.io/minio/mc:latest") -> list[dict[str, Any]]:
    """An S3 server (MinIO) for the fan-out, and a Job creating its bucket with anonymous access.

    The root credentials live in a Secret named ``telltale-s3`` that ``prepare`` fills with a
    random password (never logged); the bucket allows anonymous access so the user program
    needs no credentials, which is why the server only answers inside the cluster (a
    ClusterIP Service in the test namespace).
    """
    labels = {"app": S3_SERVICE}
    env_from = [{"secretRef": {"name": S3_SERVICE}}]
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": S3_SERVICE, "namespace": namespace, "labels": labels},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                      "name": "minio", "image": image, "args": ["server", "/data"],
                      "envFrom": env_from, "ports": [{"containerPort": 9000}],
                      "readinessProbe": {"httpGet": {"path": "/minio/health/ready",
                                                     "port": 9000}},
                      "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                      "volumes": [{"name": "data", "emptyDir": {}}]}}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": S3_SERVICE, "namespace": namespace, "labels": labels},
         "spec": {"selector": labels, "ports": [{"port": 9000, "targetPort": 9000}]}},
        {"apiVersion": "batch/v1", "kind": "Job",
         "metadata": {"name": f"{S3_SERVICE}-bucket", "namespace": namespace},
         "spec": {"backoffLimit": 6, "template": {"spec": {
             "restartPolicy": "OnFailure",
             # values reach the script as environment variables, never as shell text
             "containers": [{"name": "mc", "image": client_image, "envFrom": env_from,
                             "env": [{"name": "BUCKET", "value": bucket}],
                             "command": ["sh", "-c",
                                         f"mc alias set s3 http://{S3_SERVICE}:9000 "
                                         '"$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" && '
                                         'mc mb --ignore-existing "s3/$BUCKET" && '
                                         'mc anonymous set public "s3/$BUCKET"']}]}}}},
    ]


def deploy_in_cluster_s3(kube: Kube, namespace: str, bucket: str) -> str:
    """Deploy the fan-out's S3 server (idempotent); returns its in-cluster endpoint."""
    import secrets

    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    if kube.get("v1", "Secret", S3_SERVICE, namespace) is None:
        kube.apply({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": S3_SERVICE, "namespace": namespace},
                    "stringData": {"MINIO_ROOT_USER": "telltale",
                                   "MINIO_ROOT_PASSWORD": secrets.token_urlsafe(24)}})
    for manifest in in_cluster_s3_manifests(namespace, bucket):
        kube.apply(manifest)
    return f"http://{S3_SERVICE}.{namespace}.svc:9000"
