"""Telltale's image built from the PR under test, in the cluster (OpenShift builds).

One ``BuildConfig`` per Containerfile target: Git source at the PR's head ref, the docker
strategy with the Containerfile cut at that target's stage given inline (OpenShift's docker
strategy has no ``target``: the stages after it are dropped, which ends the build there),
output to the ``ImageStreamTag`` ``<image stream>:<target>-pr<N>[-<run>]``. The engine
instantiates it, follows the ``Build`` through a watch — failing at once on ``Failed``,
``Error`` or ``Cancelled``, with the build log saved as an artifact —, and returns the image
by digest (``…/telltale@sha256:…``): manifests naming ``telltale:<target>``
(`tasks.kube.placement.IMAGE_PREFIX`) run exactly what was built.

A run's builds carry its run id in their names and labels: its cleanup (and the leak
janitor, for a dead run) deletes the BuildConfig, its Builds and the ImageStreamTag it wrote
(`forget_output`). ``--rebuild-image`` builds the same targets without a run: names without
the run's suffix, kept until the next refresh.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from core.errors import ConfigError, PermanentServiceError, StepError
from core.safeio import write_text
from projects.library.clusters import ImageBuildBlock
from tasks.kube.api import Kube

__all__ = ["BUILD", "BUILD_CONFIG", "CONTAINERFILE", "IMAGE_STREAM", "IMAGE_STREAM_TAG",
           "build_manifests", "build_request", "cut_at_target", "forget_output",
           "git_url_of", "image_of_build", "pr_from_env", "run_builds"]

logger = logging.getLogger("telltale.images")

BUILD_CONFIG = ("build.openshift.io/v1", "BuildConfig")
BUILD = ("build.openshift.io/v1", "Build")
IMAGE_STREAM = ("image.openshift.io/v1", "ImageStream")
IMAGE_STREAM_TAG = ("image.openshift.io/v1", "ImageStreamTag")
CONTAINERFILE = Path(__file__).resolve().parents[2] / "Containerfile"
_FAILED_PHASES = {"Failed", "Error", "Cancelled"}
_STAGE = re.compile(r"^\s*FROM\s+\S+(?:\s+AS\s+(?P<name>[A-Za-z0-9_.-]+))?\s*$", re.IGNORECASE)


def pr_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """The PR number the field's CI exports: ``PULL_NUMBER`` when ``HOMELAB_CI=true``.

    Raises:
        ConfigError: ``PULL_NUMBER`` is set but is not a PR number.
    """
    env = os.environ if environ is None else environ
    if env.get("HOMELAB_CI", "").strip().lower() != "true":
        return None
    text = env.get("PULL_NUMBER", "").strip()
    if not text:
        return None
    if not re.fullmatch(r"[1-9][0-9]{0,7}", text):
        raise ConfigError(f"PULL_NUMBER={text[:40]!r} is not a PR number",
                          key="clusters.image_build.pr")
    return int(text)


def git_url_of(block: ImageBuildBlock, environ: Mapping[str, str] | None = None) -> str:
    """The repository to build from: the block's, or ``REPO_OWNER``/``REPO_NAME`` (CI).

    Raises:
        ConfigError: Neither is set (or the CI's names are not GitHub names).
    """
    if block.git_url:
        return block.git_url
    env = os.environ if environ is None else environ
    owner, name = env.get("REPO_OWNER", ""), env.get("REPO_NAME", "")
    if re.fullmatch(r"[A-Za-z0-9-]{1,39}", owner) and re.fullmatch(r"[A-Za-z0-9._-]{1,100}",
                                                                   name):
        return f"https://github.com/{owner}/{name}"
    raise ConfigError("a PR build needs the repository: set clusters.image_build.git_url "
                      "(or REPO_OWNER and REPO_NAME, as the field's CI does)",
                      key="clusters.image_build.git_url")


def cut_at_target(text: str, target: str) -> str:
    """The Containerfile up to the end of ``target``'s stage (later stages dropped).

    Raises:
        ConfigError: No stage is named ``target``.
    """
    lines = text.splitlines()
    start = None
    for index, line in enumerate(lines):
        match = _STAGE.match(line)
        if match is None:
            continue
        if start is not None:  # the stage after the target: cut here
            return "\n".join(lines[:index]).rstrip() + "\n"
        if match.group("name") == target:
            start = index
    if start is None:
        raise ConfigError(f"the Containerfile has no stage named {target!r}",
                          key="clusters.image_build.targets")
    return "\n".join(lines).rstrip() + "\n"


def _suffix(run_id: str | None) -> str:
    return f"-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}" if run_id else ""


def tag_of(block: ImageBuildBlock, target: str, run_id: str | None) -> str:
    """The ImageStreamTag a target's build writes (``user-pod-pr12-1a2b3c4d``)."""
    return f"{target}-pr{block.pr}{_suffix(run_id)}"


def build_manifests(block: ImageBuildBlock, namespace: str, *, run_id: str | None,
                    git_url: str, containerfile: str) -> list[dict[str, Any]]:
    """The ImageStream (shared) and one BuildConfig per target, in apply order."""
    if block.pr is None:
        raise ConfigError("no PR to build: --pr N (or PULL_NUMBER with HOMELAB_CI=true)",
                          key="clusters.image_build.pr")
    stream = {"apiVersion": IMAGE_STREAM[0], "kind": IMAGE_STREAM[1],
              "metadata": {"name": block.stream, "namespace": namespace},
              "spec": {"lookupPolicy": {"local": True}}}
    manifests: list[dict[str, Any]] = [stream]
    for target in block.targets:
        tag = tag_of(block, target, run_id)
        manifests.append({
            "apiVersion": BUILD_CONFIG[0], "kind": BUILD_CONFIG[1],
            "metadata": {"name": f"telltale-{tag}", "namespace": namespace,
                         "labels": {"telltale.io/pr": str(block.pr),
                                    "telltale.io/target": target}},
            "spec": {
                "runPolicy": "Serial",
                "source": {"type": "Git", "git": {"uri": git_url,
                                                  "ref": block.ref.replace("{pr}", str(block.pr))},
                           "dockerfile": cut_at_target(containerfile, target)},
                "strategy": {"type": "Docker", "dockerStrategy": {"buildArgs": [
                    {"name": "TELLTALE_IMAGE", "value": f"{block.stream}:{tag}"}]}},
                "output": {"to": {"kind": "ImageStreamTag",
                                  "name": f"{block.stream}:{tag}"}},
                "triggers": []}})
    return manifests


def build_request(name: str) -> dict[str, Any]:
    """The body of ``buildconfigs/<name>/instantiate``."""
    return {"kind": "BuildRequest", "apiVersion": BUILD_CONFIG[0], "metadata": {"name": name}}


def image_of_build(build: Mapping[str, Any]) -> str:
    """The built image by digest (``registry/ns/stream@sha256:…``).

    Raises:
        StepError: The Build completed without a digest.
    """
    status = build.get("status") or {}
    digest = ((status.get("output") or {}).get("to") or {}).get("imageDigest")
    reference = status.get("outputDockerImageReference")
    if not digest or not reference:
        raise StepError(f"build {build['metadata']['name']} completed without an image digest")
    repository = reference.rsplit("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    return f"{repository}@{digest}"


def _failure(build: Mapping[str, Any]) -> str | None:
    status = build.get("status") or {}
    if status.get("phase") not in _FAILED_PHASES:
        return None
    snippet = (status.get("logSnippet") or "").strip().splitlines()[-1:]
    return " ".join(p for p in (status.get("phase"), status.get("reason"),
                                status.get("message"), *snippet) if p)


def run_builds(kube: Kube, shared: Kube, block: ImageBuildBlock, namespace: str, *,
               run_id: str | None, here: Path, containerfile: str | None = None,
               git_url: str | None = None,
               progress: Callable[[str, str], None] | None = None) -> dict[str, str]:
    """Apply the BuildConfigs, start each build, follow it; returns target → image digest.

    Builds run concurrently in the cluster (each instantiated before any is followed); the
    log of each build is written to ``here/<build>.log``.

    Raises:
        StepError: A build failed (its log saved first) or passed its deadline.
        ConfigError: No PR, no repository, or a target the Containerfile lacks.
    """
    text = containerfile if containerfile is not None else CONTAINERFILE.read_text("utf-8")
    manifests = build_manifests(block, namespace, run_id=run_id,
                                git_url=git_url or git_url_of(block), containerfile=text)
    shared.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for api_version, kind in (BUILD_CONFIG, IMAGE_STREAM):
        kube.require(api_version, kind, namespace, what="a PR build (clusters.image_build.pr)",
                     key="clusters.image_build.pr")
    shared.apply(manifests[0])  # the ImageStream outlives the run, like the namespace
    started: dict[str, str] = {}
    for manifest, target in zip(manifests[1:], block.targets, strict=True):
        kube.apply(manifest)
        name = manifest["metadata"]["name"]
        build = kube.create_subresource(*BUILD_CONFIG, name, "instantiate", build_request(name),
                                        namespace)
        started[target] = build["metadata"]["name"]
        logger.info("building %s from PR %s: build %s", target, block.pr, started[target])
    images: dict[str, str] = {}
    phases: dict[str, str] = {}

    def seen(target: str, build: Mapping[str, Any]) -> None:
        phase = str((build.get("status") or {}).get("phase") or "New")
        if progress is not None and phases.get(target) != phase:
            progress(target, phase)
        phases[target] = phase

    for target, name in started.items():
        try:
            build = kube.wait(*BUILD, name, namespace, deadline_s=block.deadline_minutes * 60,
                              ready=lambda b: (b.get("status") or {}).get("phase") == "Complete",
                              fail=_failure, what=f"build {name} ({target})",
                              progress=lambda b, t=target: seen(t, b))
        finally:
            _save_log(kube, name, namespace, here)
        images[target] = image_of_build(build)
        logger.info("built %s: %s", target, images[target])
    return images


def _save_log(kube: Kube, name: str, namespace: str, here: Path) -> None:
    """The build's log, as an artifact (best effort: a build that never started has none)."""
    try:
        text = kube.log(*BUILD, name, namespace)
    except Exception as exc:
        text = f"(no log: {exc})\n"
    here.mkdir(parents=True, exist_ok=True)
    write_text(here / f"{name}.log", text)


def forget_output(kube: Kube, build_config: Mapping[str, Any]) -> str | None:
    """Delete the ImageStreamTag a BuildConfig writes (before the BuildConfig goes)."""
    to = (((build_config.get("spec") or {}).get("output") or {}).get("to") or {})
    if to.get("kind") != "ImageStreamTag" or ":" not in str(to.get("name", "")):
        return None
    namespace = to.get("namespace") or build_config["metadata"].get("namespace")
    try:
        if kube.delete(*IMAGE_STREAM_TAG, to["name"], namespace):
            return f"ImageStreamTag/{namespace}/{to['name']}"
    except PermanentServiceError as exc:
        if exc.status != 404:
            raise
    return None
