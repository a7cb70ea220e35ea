"""Every state hook of every Telltale flow can be called the two ways Prefect calls hooks.

Prefect's flow engine calls ``hook(flow, flow_run, state)``; a worker's or ``serve()``'s
runner (a deployed run that crashes or is cancelled) calls ``hook(flow=..., flow_run=...,
state=...)``. A hook whose parameters are named otherwise works in the tests that call it
directly and raises TypeError on the deployed path — the lease it should release stays
active. This audit binds every hook of every flow object found in ``flows`` both ways.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from prefect import Flow

import flows

HOOK_KINDS = ("on_completion_hooks", "on_failure_hooks", "on_cancellation_hooks",
              "on_crashed_hooks", "on_running_hooks")


def _flows() -> list[tuple[str, Flow]]:
    found: dict[int, tuple[str, Flow]] = {}
    for info in pkgutil.walk_packages(flows.__path__, prefix="flows."):
        if info.name.endswith("__main__") or ".scaffold" in info.name:
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, Flow):
                found.setdefault(id(value), (f"{info.name}.{name}", value))
    return sorted(found.values(), key=lambda item: item[0])


def test_the_audit_sees_the_project_flows_and_their_hooks() -> None:
    names = [name for name, _ in _flows()]
    assert any(name.startswith("flows.fine_tuning") for name in names), names
    hooked = [f for _, f in _flows() if f.on_crashed_hooks and f.on_cancellation_hooks]
    assert len(hooked) >= 2  # both projects register crash and cancellation cleanup


@pytest.mark.parametrize(("name", "flow_obj"), _flows(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_every_hook_binds_positionally_and_by_keyword(name: str, flow_obj: Flow) -> None:
    for kind in HOOK_KINDS:
        for hook in getattr(flow_obj, kind, None) or []:
            signature = inspect.signature(hook)
            signature.bind(flow_obj, object(), object())  # the flow engine's call
            signature.bind(flow=flow_obj, flow_run=object(), state=object())  # the runner's
