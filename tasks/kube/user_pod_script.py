"""The program each user pod of a cluster fan-out runs (standard library only).

It is shipped to the pods in a ConfigMap and run by the workload image's ``python3``, so it
imports nothing outside the standard library. Environment:

- ``JOB_COMPLETION_INDEX`` (set by Kubernetes for Indexed Jobs), ``TELLTALE_USERS``,
  ``TELLTALE_BATCH_SIZE``, ``TELLTALE_SLEEP_FACTOR``, ``TELLTALE_BARRIER_TIMEOUT``;
- ``TELLTALE_S3_ENDPOINT``, ``TELLTALE_S3_BUCKET``, ``TELLTALE_S3_PREFIX``: the in-cluster S3
  server (anonymous access inside the test namespace);
- ``TELLTALE_COMMAND``: the workload argv as JSON; ``{index}``, ``{users}`` and ``{dir}``
  in it are replaced as in the local fan-out (``{dir}``: a fresh dir whose regular files,
  up to ``MAX_RESULT_BYTES`` in all, are uploaded as the user's results).

Barrier: each user PUTs ``<prefix>/barrier/ready-<index>`` and lists ``<prefix>/barrier/``
until all N markers exist (or the timeout passes: exit 125). Then it sleeps
``floor(index / batch_size) * sleep_factor`` seconds, runs the workload, and uploads
``user-<index>/pod.log``, ``timings.json``, ``exit_code`` and the files its command left in
``{dir}`` — the layout of the local fan-out.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

EXIT_BARRIER = 125
MAX_RESULT_BYTES = 256 * 1024 * 1024
"""What a user uploads from its ``{dir}`` at most (regular files, in name order)."""


def argv_for(command: list[str], index: int, users: int, directory: str) -> list[str]:
    """The workload argv with the fan-out's placeholders replaced.

    Not ``str.format``: an argument may hold other braces (a JSON value).
    """
    return [a.replace("{index}", str(index)).replace("{users}", str(users))
            .replace("{dir}", directory) for a in command]


def upload_results(endpoint: str, bucket: str, user: str, directory: str) -> int:
    """Upload the regular files under ``directory`` (no links), bounded; returns how many."""
    sent = 0
    budget = MAX_RESULT_BYTES
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            size = os.path.getsize(path)
            if size > budget:
                print(f"user results: {path} left out ({size} bytes over the budget)",
                      file=sys.stderr)
                continue
            budget -= size
            relative = os.path.relpath(path, directory).replace(os.sep, "/")
            with open(path, "rb") as stream:
                put(endpoint, bucket, f"{user}/{relative}", stream.read())
            sent += 1
    return sent


def _url(endpoint: str, bucket: str, key: str = "", query: str = "") -> str:
    url = f"{endpoint.rstrip('/')}/{bucket}"
    if key:
        url += "/" + urllib.parse.quote(key)
    return url + (f"?{query}" if query else "")


def put(endpoint: str, bucket: str, key: str, body: bytes) -> None:
    """PUT one object (retrying a few transient failures)."""
    for attempt in range(5):
        try:
            # An explicit binary type: urllib would otherwise send a form content type, which
            # some servers parse as a form and store as an empty object.
            request = urllib.request.Request(
                _url(endpoint, bucket, key), data=body, method="PUT",
                headers={"Content-Type": "application/octet-stream"})
            with urllib.request.urlopen(request, timeout=30):
                return
        except (urllib.error.URLError, OSError):
            if attempt == 4:
                raise
            time.sleep(0.2 * 2 ** attempt)


def count(endpoint: str, bucket: str, prefix: str) -> int:
    """Number of keys under ``prefix`` (ListObjectsV2)."""
    query = urllib.parse.urlencode({"list-type": "2", "prefix": prefix})
    with urllib.request.urlopen(_url(endpoint, bucket, query=query), timeout=30) as response:
        root = ET.fromstring(response.read())
    return sum(1 for element in root.iter() if element.tag.endswith("Key"))


def main() -> int:
    """Run one user; returns the workload's exit code."""
    env = os.environ
    index = int(env["JOB_COMPLETION_INDEX"])
    users = int(env["TELLTALE_USERS"])
    endpoint, bucket = env["TELLTALE_S3_ENDPOINT"], env["TELLTALE_S3_BUCKET"]
    prefix = env.get("TELLTALE_S3_PREFIX", "").strip("/")
    user = f"{prefix}/user-{index:03d}"
    timings: dict[str, object] = {"index": index, "launched_at": float(
        env.get("TELLTALE_LAUNCHED_AT") or time.time()), "ready_at": time.time(),
        "exit_code": 1}
    code = 1
    try:
        put(endpoint, bucket, f"{prefix}/barrier/ready-{index:03d}", str(time.time()).encode())
        deadline = time.time() + float(env.get("TELLTALE_BARRIER_TIMEOUT", "600"))
        while count(endpoint, bucket, f"{prefix}/barrier/ready-") < users:
            if time.time() > deadline:
                timings["note"] = "barrier: timeout"
                code = EXIT_BARRIER
                return code
            time.sleep(0.05)
        timings["released_at"] = time.time()
        stagger = math.floor(index / max(1, int(env.get("TELLTALE_BATCH_SIZE", "1")))) * \
            float(env.get("TELLTALE_SLEEP_FACTOR", "0"))
        timings["stagger_s"] = stagger
        time.sleep(stagger)
        timings["started_at"] = time.time()
        with tempfile.TemporaryDirectory(prefix="telltale-user-") as results:
            argv = argv_for(json.loads(env["TELLTALE_COMMAND"]), index, users, results)
            process = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     check=False)
            sys.stdout.buffer.write(process.stdout)  # the pod log keeps the output too
            put(endpoint, bucket, f"{user}/pod.log", process.stdout)
            code = process.returncode
            timings["ended_at"] = time.time()
            timings["result_files"] = upload_results(endpoint, bucket, user, results)
        return code
    finally:
        timings["exit_code"] = code
        put(endpoint, bucket, f"{user}/timings.json", json.dumps(timings).encode())
        put(endpoint, bucket, f"{user}/exit_code", f"{code}\n".encode())


if __name__ == "__main__":
    sys.exit(main())
