"""Check that what a flow asked of the test API server is what the generated RBAC grants."""

from __future__ import annotations

from deployments.rbac import grants, rbac_documents
from tests.servers.kubernetes import KubeState, authorization_attributes


def ungranted(state: KubeState) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every request the runner's ClusterRole would refuse."""
    rules = rbac_documents()[1]["rules"]
    asked = {authorization_attributes(method, path) for method, path, _ in state.requests}
    return {a for a in asked if a is not None and not grants(rules, *a)}


def assert_rbac_grants(state: KubeState) -> None:
    """Fail with the refused requests when the generated RBAC misses any of them."""
    missing = ungranted(state)
    assert not missing, f"the generated RBAC refuses: {sorted(missing)}"
