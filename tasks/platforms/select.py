"""Platform selection: the local machine or a Kubernetes cluster."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from core.errors import ConfigError
from tasks.platforms.base import Platform

__all__ = ["platform_type", "PlatformName", "find_kubeconfig", "make_platform", "select_platform"]

PlatformName = Literal["local", "kubernetes"]


def find_kubeconfig(env: Mapping[str, str] | None = None, home: Path | None = None) -> str | None:
    """Return how to reach a cluster: a kubeconfig path, ``"in-cluster"``, or None.

    Order: ``$KUBECONFIG`` (first existing entry), ``~/.kube/config``, the in-cluster service
    account (``KUBERNETES_SERVICE_HOST`` set and a token mounted).
    """
    env = os.environ if env is None else env
    for entry in env.get("KUBECONFIG", "").split(os.pathsep):
        if entry and Path(entry).expanduser().is_file():
            return str(Path(entry).expanduser())
    default = (home or Path.home()) / ".kube" / "config"
    if default.is_file():
        return str(default)
    token = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    if env.get("KUBERNETES_SERVICE_HOST") and token.is_file():
        return "in-cluster"
    return None


def select_platform(requested: str, kubeconfig: str | None = None,
                    env: Mapping[str, str] | None = None, *,
                    creates_cluster: bool = False) -> tuple[PlatformName, str | None]:
    """Pick the platform: ``auto`` means kubernetes when a kubeconfig is found, else local.

    Args:
        requested: ``auto``, ``local`` or ``kubernetes``.
        kubeconfig: An explicit kubeconfig path (config ``clusters.kubeconfig``).
        env: Environment to look in (default ``os.environ``).
        creates_cluster: The run creates its cluster (``clusters.create.type``): kubernetes
            needs no kubeconfig up front, the creation step provides it.

    Returns:
        The platform and the kubeconfig to use (None on local).

    Raises:
        ConfigError: Unknown platform, or kubernetes requested with no kubeconfig anywhere.
    """
    if requested not in ("auto", "local", "kubernetes"):
        raise ConfigError(f"unknown platform {requested!r}; choose auto, local or kubernetes")
    if requested == "local":
        return "local", None
    if requested == "kubernetes" and creates_cluster and not kubeconfig:
        return "kubernetes", None
    found = kubeconfig if kubeconfig else find_kubeconfig(env)
    if kubeconfig and not Path(kubeconfig).expanduser().is_file():
        raise ConfigError(f"kubeconfig not found: {kubeconfig}", key="clusters.kubeconfig")
    if found:
        return "kubernetes", found
    if requested == "kubernetes":
        raise ConfigError("platform kubernetes needs a kubeconfig: set KUBECONFIG, "
                          "~/.kube/config or clusters.kubeconfig")
    return "local", None


def platform_type(name: str) -> type[Platform]:
    """The `Platform` class of a selected platform name (imported only when chosen)."""
    if name == "local":
        from tasks.platforms.local import LocalPlatform

        return LocalPlatform
    if name == "kubernetes":
        from tasks.platforms.kubernetes import KubernetesPlatform

        return KubernetesPlatform
    raise ConfigError(f"unknown platform {name!r}; choose local or kubernetes")


def make_platform(name: str) -> Platform:
    """The `Platform` implementation of a selected platform name."""
    return platform_type(name)()
