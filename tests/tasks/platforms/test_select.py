from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from tasks.platforms.select import find_kubeconfig, select_platform


def test_auto_prefers_a_kubeconfig(tmp_path: Path) -> None:
    kc = tmp_path / "kc"
    kc.write_text("apiVersion: v1\n")
    assert select_platform("auto", env={"KUBECONFIG": f"/nonexistent:{kc}"}) == \
        ("kubernetes", str(kc))
    assert select_platform("auto", env={"HOME": str(tmp_path)}) == ("local", None) or \
        find_kubeconfig({}) is not None


def test_home_kube_config(tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("apiVersion: v1\n")
    assert find_kubeconfig({}, home=tmp_path) == str(tmp_path / ".kube" / "config")


def test_explicit_choices(tmp_path: Path) -> None:
    assert select_platform("local", env={"KUBECONFIG": "/x"}) == ("local", None)
    with pytest.raises(ConfigError, match="kubeconfig not found"):
        select_platform("kubernetes", str(tmp_path / "missing"), env={})
    with pytest.raises(ConfigError, match="unknown platform"):
        select_platform("moon", env={})
    assert select_platform("kubernetes", env={}, creates_cluster=True) == ("kubernetes", None)
