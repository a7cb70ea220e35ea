"""No import of Telltale's code changes the environment a run's children inherit.

A run's workloads, servers and warm Pythons inherit its environment, and a warm Python's
key is a digest of it (`core.warm_key`): a variable set by an import between the run's
start (where the command line offers a warm Python) and its prepare (where the flow asks
for one) made two keys for one workload, so every run started a second warm Python
(threadpoolctl's ``KMP_DUPLICATE_LIB_OK``, through `analysis.blas`). Every module of the
code's packages is imported in a fresh interpreter, and the environment compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "analysis", "tasks", "blocks", "flows", "projects", "deployments")
PROBE = """
import importlib, json, os, sys
sys.path.insert(0, {root!r})
before = dict(os.environ)
failed = {{}}
for name in {modules!r}:
    try:
        importlib.import_module(name)
    except Exception as exc:  # reported: a module not imported is a module not checked
        failed[name] = repr(exc)[:200]
after = dict(os.environ)
print(json.dumps({{"changed": sorted(k for k in set(before) | set(after)
                                  if before.get(k) != after.get(k)),
                  "failed": failed}}))
"""


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "__main__" in parts or "tests" in parts or any(p.startswith(".") for p in parts):
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_importing_any_of_our_modules_leaves_the_environment_as_it_was() -> None:
    modules = _modules()
    assert "analysis.blas" in modules and "flows.fine_tuning" in modules
    # the variables an import was seen to set, removed first: the probe starts as a user's
    # shell does
    env = {k: v for k, v in os.environ.items() if k != "KMP_DUPLICATE_LIB_OK"}
    proc = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT), modules=modules)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
                          check=True)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["changed"] == [], seen
    # every module was imported (the serving venv's scripts import vLLM and GuideLLM only
    # inside their functions): none escaped the check
    assert seen["failed"] == {}, seen["failed"]
