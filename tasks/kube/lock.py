"""One run per cluster at a time: a Prefect global concurrency limit keyed by the cluster.

A second run against the same cluster queues (Prefect leases the slot) instead of colliding.
Global limits are polled, which suits a lock held for minutes or hours.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["cluster_lock", "lock_name"]


def lock_name(cluster: str) -> str:
    """The concurrency-limit name of a cluster (its API URL or kubeconfig identity)."""
    return "telltale-cluster-" + hashlib.sha256(cluster.encode()).hexdigest()[:12]


@contextmanager
def cluster_lock(cluster: str, *, timeout_s: float | None = None) -> Iterator[str]:
    """Hold the cluster's slot (limit 1, created when missing) for the block."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectNotFound

    name = lock_name(cluster)
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1))
            except Exception:  # created by a concurrent run meanwhile
                client.read_global_concurrency_limit_by_name(name)
    with concurrency(name, occupy=1, timeout_seconds=timeout_s, strict=True):
        yield name
