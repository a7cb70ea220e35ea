"""Notifications through Prefect's real automation path, to a local webhook receiver.

A real ``prefect server start`` (its triggers and actions services), the automations of
`deployments.automations`, flow runs in another process that emit the run's events
(`flows.events`) or fail, and a deployment that never runs: each must reach the receiver as
the HTTP request the block sends (Slack-style JSON, generic JSON, GitHub's comment API).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from deployments.automations import (
    apply_automations,
    github_block,
    telltale_automations,
    webhook_block,
)
from tests.servers import serve
from tests.servers.prefect_server import api_call, clean_env, prefect_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "ghp_test_token_not_real"  # noqa: S105 - a test value, checked to stay out of logs


class Receiver:
    """What the webhook receiver got: (path, headers, JSON body), with a wait on arrival."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.arrived = threading.Condition()

    def wait_for(self, predicate: Callable[[str, Any], bool], timeout: float = 600) -> Any:
        """The first request matching ``predicate(path, body)``; waits on arrivals."""
        with self.arrived:
            found = self.arrived.wait_for(lambda: next(
                (r for r in self.requests if predicate(r[0], r[2])), None), timeout=timeout)
        assert found, f"nothing matched; received: {self.requests}"
        return found


@contextmanager
def receiver() -> Iterator[tuple[str, Receiver]]:
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(201)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            with got.arrived:
                got.requests.append((self.path, dict(self.headers), json.loads(body or b"{}")))
                got.arrived.notify_all()

    with serve(Handler) as port:
        yield f"http://127.0.0.1:{port}", got


_FLOWS = '''
import sys
from prefect import flow, tags
from flows.events import emit_run_events
from flows.orchestration import RunOutcome
from projects.library.notify import NotifyBlock

@flow(name="judged")
def judged() -> list:
    outcome = RunOutcome(artifact_dir="/runs/20261123-fine_tuning-abcd1234", exit_code=1,
                         platform="local", verdict_counts={"regression": 1, "no_change": 5},
                         failures=["regression gate: train_tokens_per_second"],
                         report="/runs/x/report/index.html",
                         regressions=["train_tokens_per_second (base): -12.5 % — below the "
                                      "history's range"])
    return emit_run_events("fine_tuning", outcome,
                           NotifyBlock(github_repository="org/repo", pull_request=12), None)

@flow(name="nightly-probe")
def broken() -> None:
    raise ValueError("the workload exploded")

if sys.argv[1] == "judged":
    print(judged())
else:
    with tags("nightly"):
        try:
            broken()
        except ValueError:
            pass
'''


def _run_flows(tmp_path: Path, api: str, which: str) -> str:
    script = tmp_path / "flows_script.py"
    script.write_text(_FLOWS)
    done = subprocess.run([sys.executable, str(script), which], cwd=ROOT, timeout=600,
                          env=clean_env(tmp_path / f"client-{which}", PREFECT_API_URL=api,
                                        PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert TOKEN not in done.stdout + done.stderr
    return done.stdout


def test_automations_fire_on_regression_failure_and_missing_run(tmp_path: Path) -> None:
    from prefect import flow
    from prefect.schedules import Cron
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with receiver() as (base, got), prefect_server(tmp_path / "server") as api, \
            temporary_settings(updates={PREFECT_API_URL: api}):
        notify = webhook_block(f"{base}/notify", allow_private_urls=True)
        notify_id = notify.save("telltale-webhook", overwrite=True)
        gh = github_block(TOKEN, api_url=f"{base}/github", allow_private_urls=True)
        gh_id = gh.save("telltale-github", overwrite=True)

        @flow(name="nightly-never-runs")
        def never() -> None:
            pass

        # a yearly schedule: scheduled runs exist (and go late), none ever starts
        deployment_id = never.to_deployment(
            name="nightly", tags=["nightly"], schedules=[Cron("0 0 1 1 *")]).apply()
        automations = telltale_automations(
            notify_id, github_block_id=gh_id, scheduled=[("never/nightly", deployment_id)],
            missing_after=timedelta(seconds=10))
        ids = apply_automations(automations)
        assert len(ids) == 4
        assert len(apply_automations(automations)) == 4  # re-applied: replaced, not doubled

        # a regression verdict, from a run that came from PR org/repo#12
        assert "telltale.run.regression" in _run_flows(tmp_path, api, "judged")
        _, _, body = got.wait_for(lambda path, body: path == "/notify"
                                  and "regression" in body.get("subject", ""))
        assert body["subject"] == "Telltale: regression in fine_tuning"
        assert "train_tokens_per_second (base): -12.5 %" in body["body"]
        assert "Report: /runs/x/report/index.html" in body["body"]
        path, headers, comment = got.wait_for(lambda path, body: path.startswith("/github"))
        assert path == "/github/repos/org/repo/issues/12/comments"
        assert headers["Authorization"] == f"Bearer {TOKEN}"
        assert "failed (exit 1)" in comment["body"] and "regression 1" in comment["body"]

        # a nightly run that fails
        _run_flows(tmp_path, api, "failed")
        _, _, body = got.wait_for(lambda path, body: "nightly run failed" in
                                  body.get("subject", ""))
        assert "ended Failed" in body["body"]

        # the nightly deployment that never ran
        _, _, body = got.wait_for(lambda path, body: body.get("subject") ==
                                  "Telltale: never/nightly did not run")
        assert "No run of deployment never/nightly" in body["body"]
    assert not any(TOKEN in json.dumps(r[2]) for r in got.requests)


def test_the_scheduled_deployments_of_a_tag_are_all_found_past_one_page(
        prefect_harness: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deployments a missing-run automation watches: every active scheduled one of the
    tag, named flow/deployment, past the API's one page (its default limit), none other."""
    import uuid

    import deployments.automations as automations

    monkeypatch.setattr(automations, "PAGE", 3)  # pages of 3: the paging is what is tested
    tag = f"nightly-{uuid.uuid4().hex[:8]}"

    def post(path: str, body: dict[str, object]) -> str:
        return str(api_call(prefect_harness, "POST", path, body)["id"])

    every = {}
    for i in range(7):
        flow = f"flow-{tag}-{i % 2}"
        flow_id = post("/flows/", {"name": flow})
        active = i != 5
        deployment = post("/deployments/", {
            "name": f"d{i}", "flow_id": flow_id, "tags": [tag] if i != 6 else ["other"],
            "schedules": [{"schedule": {"interval": 86400}, "active": active}]})
        if active and i != 6:
            every[f"{flow}/d{i}"] = deployment
    found = automations._scheduled_deployments(tag)
    assert {name: str(d) for name, d in found} == every
