"""Where cells run: the `Platform` seam and its implementations (local, Kubernetes)."""

from tasks.platforms.base import CellResult, Platform, RunContext
from tasks.platforms.select import find_kubeconfig, make_platform, select_platform

__all__ = ["CellResult", "Platform", "RunContext", "find_kubeconfig", "make_platform",
           "select_platform"]
