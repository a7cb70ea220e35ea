"""Telltale's image built from the PR under test, in the cluster.

Against the Kubernetes API test server with OpenShift's build API (``instantiate``) and a
build controller; what Telltale applies validates against OpenShift's OpenAPI
(../shared/crds/upstream/openshift/openapi.json).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import ConfigError, StepError
from projects.library.clusters import ImageBuildBlock
from tasks.kube.api import Kube, api_client
from tasks.kube.images import (
    CONTAINERFILE,
    build_manifests,
    cut_at_target,
    git_url_of,
    pr_from_env,
    run_builds,
)
from tasks.kube.placement import Placement, shape
from tasks.kube.workload import cleanup_cluster
from tests.servers.fake_openshift import BuildController
from tests.servers.kubernetes import KubeState, kube_server, write_kubeconfig
from tests.upstream_schemas import validate

NS = "telltale-testing"
BLOCK = ImageBuildBlock(pr=12, git_url="https://github.com/org/telltale")
IST = "image.openshift.io/v1"


@contextmanager
def cluster(tmp_path: Path, scenario: str = "success") -> Iterator[tuple[str, KubeState]]:
    with kube_server() as (url, state):
        controller = BuildController(state, scenario)  # type: ignore[arg-type]
        controller.start()
        try:
            yield write_kubeconfig(tmp_path / "kc", url), state
        finally:
            controller.stop()


def test_each_target_is_built_from_the_pr_and_pinned_by_digest(tmp_path: Path) -> None:
    with cluster(tmp_path) as (kubeconfig, state):
        api = api_client(kubeconfig)
        images = run_builds(Kube(api, "run-1"), Kube(api), BLOCK, NS, run_id="run-1",
                            here=tmp_path / "logs")
        assert set(images) == {"telltale", "user-pod"}
        for image in images.values():
            assert re.fullmatch(r"image-registry\.openshift-image-registry\.svc:5000/"
                                rf"{NS}/telltale@sha256:[0-9a-f]{{64}}", image), image
        configs = state.list("build.openshift.io/v1", "BuildConfig")
        assert len(configs) == 2
        for config in configs:
            git = config["spec"]["source"]["git"]
            assert git == {"uri": "https://github.com/org/telltale", "ref": "refs/pull/12/head"}
            assert config["metadata"]["labels"]["telltale.io/run-id"] == "run-1"
            validate({k: config[k] for k in ("apiVersion", "kind", "spec")} |
                     {"metadata": {"name": config["metadata"]["name"], "namespace": NS}})
        builds = state.list("build.openshift.io/v1", "Build")
        assert {b["status"]["phase"] for b in builds} == {"Complete"}
        assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == sorted(
            f"{b['metadata']['name']}.log" for b in builds)
        # a manifest naming Telltale's image runs the build's digest
        pod = shape({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "spec": {"containers": [{"name": "u", "image": "telltale:user-pod"}]}},
                    Placement(), images)
        assert pod["spec"]["containers"][0]["image"] == images["user-pod"]
        # cleanup: configs, builds and the ImageStreamTags they wrote; the stream stays
        assert len(state.list(IST, "ImageStreamTag")) == 2
        removed = cleanup_cluster(kubeconfig, "run-1")
        assert sum("BuildConfig/" in line for line in removed) == 2
        assert not state.list("build.openshift.io/v1", "BuildConfig")
        assert not state.list("build.openshift.io/v1", "Build")
        assert not state.list(IST, "ImageStreamTag")
        assert state.get(IST, "ImageStream", "telltale", NS)


def test_a_failed_build_fails_fast_with_its_reason_and_keeps_its_log(tmp_path: Path) -> None:
    block = BLOCK.model_copy(update={"targets": ["user-pod"], "deadline_minutes": 24 * 60})
    with cluster(tmp_path, "fail") as (kubeconfig, _):
        api = api_client(kubeconfig)
        with pytest.raises(StepError, match="DockerBuildFailed") as info:
            run_builds(Kube(api, "run-2"), Kube(api), block, NS, run_id="run-2",
                       here=tmp_path / "logs")
        assert "not ready after" not in str(info.value)  # the phase, not a deadline
        log = next((tmp_path / "logs").glob("*.log")).read_text()
        assert "No matching distribution found for torch" in log


def test_the_janitor_deletes_a_dead_runs_builds_and_tags(tmp_path: Path,
                                                         prefect_harness) -> None:
    from flows.cleanup import janitor

    with cluster(tmp_path) as (kubeconfig, state):
        api = api_client(kubeconfig)
        run_builds(Kube(api, "dead"), Kube(api), BLOCK, NS, run_id="dead",
                   here=tmp_path / "logs")
        # a hand refresh (--rebuild-image) carries no run: the janitor leaves it
        run_builds(Kube(api), Kube(api), BLOCK, NS, run_id=None, here=tmp_path / "hand")
        assert len(state.list(IST, "ImageStreamTag")) == 4
        janitor.fn(older_than="0s", dry_run=False, kubeconfig=kubeconfig)
        tags = sorted(t["metadata"]["name"] for t in state.list(IST, "ImageStreamTag"))
        assert tags == ["telltale:telltale-pr12", "telltale:user-pod-pr12"]
        assert len(state.list("build.openshift.io/v1", "BuildConfig")) == 2


def test_the_containerfile_is_cut_at_each_target() -> None:
    text = CONTAINERFILE.read_text()
    for target in ("telltale", "user-pod"):
        cut = cut_at_target(text, target)
        stages = re.findall(r"(?im)^FROM\s+\S+\s+AS\s+(\S+)", cut)
        assert stages[-1] == target and text.startswith(cut.rstrip("\n").split("\n")[0])
    assert "AS telltale" not in cut_at_target(text, "user-pod")
    with pytest.raises(ConfigError, match="no stage named 'gpu'"):
        cut_at_target(text, "gpu")


@given(stages=st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True), min_size=1,
                       max_size=6, unique=True), pick=st.integers(0, 5))
def test_cutting_keeps_the_stages_up_to_the_target(stages: list[str], pick: int) -> None:
    text = "ARG BASE=x\n" + "".join(f"FROM img{i} AS {name}\nRUN echo {name}\n"
                                     for i, name in enumerate(stages))
    target = stages[pick % len(stages)]
    cut = cut_at_target(text, target)
    kept = re.findall(r"(?m)^FROM \S+ AS (\S+)$", cut)
    assert kept == stages[:stages.index(target) + 1]
    assert cut.endswith(f"RUN echo {target}\n")


def test_the_pr_comes_from_the_ci_only_when_it_says_so() -> None:
    assert pr_from_env({"PULL_NUMBER": "12"}) is None  # not the field's CI
    assert pr_from_env({"PULL_NUMBER": "12", "HOMELAB_CI": "true"}) == 12
    assert pr_from_env({"HOMELAB_CI": "true"}) is None
    for bad in ("12; rm -rf /", "-1", "0", "1e3", "$(id)"):
        with pytest.raises(ConfigError, match="not a PR number"):
            pr_from_env({"PULL_NUMBER": bad, "HOMELAB_CI": "true"})
    assert git_url_of(ImageBuildBlock(pr=1), {"REPO_OWNER": "org", "REPO_NAME": "telltale"}) \
        == "https://github.com/org/telltale"
    for owner in ("org/../x", "a b", ""):
        with pytest.raises(ConfigError, match="git_url"):
            git_url_of(ImageBuildBlock(pr=1), {"REPO_OWNER": owner, "REPO_NAME": "t"})
    with pytest.raises(ConfigError, match="no PR"):
        build_manifests(ImageBuildBlock(), NS, run_id=None, git_url="https://x/y",
                        containerfile=CONTAINERFILE.read_text())


def test_a_cluster_without_the_build_api_is_a_user_error_naming_the_key(
        tmp_path: Path) -> None:
    with kube_server() as (url, state):
        state.unserved.add("build.openshift.io")
        api = api_client(write_kubeconfig(tmp_path / "kc", url))
        with pytest.raises(ConfigError, match="does not serve") as info:
            run_builds(Kube(api, "run-3"), Kube(api), BLOCK, NS, run_id="run-3",
                       here=tmp_path / "logs")
        assert info.value.key == "clusters.image_build.pr"
        assert not state.list("image.openshift.io/v1", "ImageStream")  # nothing applied


@given(ref=st.text(alphabet="ab/.-_{}pr0", min_size=1, max_size=30), pr=st.integers(1, 10**7))
def test_a_ref_is_refused_by_the_model_or_built_without_a_brace(ref: str, pr: int) -> None:
    """The ref is never a format string: a brace other than ``{pr}`` is a config error (exit
    2), never a KeyError or ValueError from formatting; ``{pr}`` becomes the number."""
    from pydantic import ValidationError

    try:
        block = ImageBuildBlock(pr=pr, git_url="https://github.com/org/t", ref=ref)
    except ValidationError:
        return
    built = build_manifests(block, NS, run_id=None, git_url=block.git_url or "",
                            containerfile=CONTAINERFILE.read_text())[1]
    git_ref = built["spec"]["source"]["git"]["ref"]
    assert "{" not in git_ref and "}" not in git_ref
    assert git_ref == ref.replace("{pr}", str(pr))
