"""Kubernetes kinds as Telltale uses them: where, what for, and when cleanup removes them.

One declaration per kind feeds three things: the API client's REST mapping
(`tasks.kube.api`), the run cleanup and leak janitor order (``cleanup``), and the RBAC the
runner's service account gets (``verbs``; ``python -m deployments.rbac`` writes
``deployments/kubernetes-rbac.yaml`` from them). The engine declares the kinds it uses
itself (`tasks.kube.kinds`); a project declares the kinds it brings (`Project.kube_kinds`).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import StepError

__all__ = ["APPLY", "MANAGE", "READ", "Kind"]

READ: tuple[str, ...] = ("get", "list", "watch")
"""Looked at: read, listed by label, followed through a watch."""
APPLY: tuple[str, ...] = (*READ, "create", "patch")
"""Applied (`Kube.apply`: read, then create or merge-patch), never deleted by Telltale."""
MANAGE: tuple[str, ...] = (*APPLY, "delete")
"""Applied and deleted (run objects: cleanup and the janitor)."""


@dataclass(frozen=True)
class Kind:
    """One kind: its REST mapping and what Telltale does with it.

    Attributes:
        api_version: ``group/version`` (``v1`` for the core group).
        kind: The kind's name.
        plural: Its resource name in URLs.
        namespaced: Namespaced or cluster-scoped.
        verbs: The API verbs Telltale uses on it (the RBAC grants exactly these).
        cleanup: Its place in a run's cleanup, lower first (dependents before what they
            use); None for a kind a run never creates with its run label.
        subresources: ``(subresource, verbs)`` pairs used (``("log", ("get",))`` for pods).
    """

    api_version: str
    kind: str
    plural: str
    namespaced: bool
    verbs: tuple[str, ...] = READ
    cleanup: int | None = None
    subresources: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        if self.cleanup is not None and "delete" not in self.verbs:
            raise ValueError(f"{self.kind}: a kind cleaned up by run needs the delete verb")

    @property
    def group(self) -> str:
        """The API group ("" for the core group)."""
        return self.api_version.rsplit("/", 1)[0] if "/" in self.api_version else ""

    def path(self, namespace: str | None = None, name: str | None = None,
             sub: str | None = None) -> str:
        """The resource URL path."""
        group_version = self.api_version
        base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        if self.namespaced:
            if not namespace:
                raise StepError(f"{self.kind} is namespaced: a namespace is required")
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base

    def all_namespaces_path(self) -> str:
        """The collection across namespaces (or the cluster-scoped collection)."""
        prefix = "/apis" if "/" in self.api_version else "/api"
        return f"{prefix}/{self.api_version}/{self.plural}"
