"""Export speed: a 1 000-file / 500 MB artifact dir to S3, and OpenSearch bulk indexing.

    python benchmarks/export_s3.py [--files 1000] [--mb 500] [--docs 5000]

Runs against local servers (moto's S3 server, the test OpenSearch server) on 127.0.0.1, so the
figures measure the client side and the protocol, not a network. Baseline: a plain loop of
boto3 ``upload_file`` calls, one file after the other, default transfer settings.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import boto3  # noqa: E402

from analysis.lts import LtsKpi, LtsMetadata, LtsPayload  # noqa: E402
from blocks.opensearch import OpenSearchInstance  # noqa: E402
from blocks.s3 import S3Target  # noqa: E402
from tasks.process import free_port  # noqa: E402
from tasks.publish.opensearch import export_payloads  # noqa: E402
from tasks.publish.s3 import iter_files, upload_dir  # noqa: E402
from tests.servers.opensearch import opensearch_server  # noqa: E402


def build_tree(root: Path, files: int, total_mb: int) -> int:
    """Many small files (logs, yaml) plus a few big ones (checkpoints, traces)."""
    big_count = 10
    big_size = int(total_mb * 0.8 * 1024 * 1024 / big_count)
    small_size = int(total_mb * 0.2 * 1024 * 1024 / (files - big_count))
    block = os.urandom(1024 * 1024)
    for i in range(files - big_count):
        path = root / f"{i % 50:03d}__cell" / f"file-{i:04d}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(block[:small_size])
    for i in range(big_count):
        with open(root / f"big-{i}.bin", "wb") as stream:
            for _ in range(big_size // len(block)):
                stream.write(block)
    return sum(p.stat().st_size for p in iter_files(root))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--docs", type=int, default=5000)
    args = parser.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")
    # The S3 server runs in its own process, as a real one would: in-process it would share
    # the GIL with the client being measured.
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="bench")
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            size = build_tree(root, args.files, args.mb)
            mb = size / 1e6
            files = list(iter_files(root))
            start = time.perf_counter()
            for path in files:
                s3.upload_file(str(path), "bench", f"baseline/{path.relative_to(root)}")
            baseline = time.perf_counter() - start
            target = S3Target(bucket="bench", endpoint_url=endpoint, region="us-east-1")
            start = time.perf_counter()
            result = upload_dir(root, target, "bench", "run-1")
            ours = time.perf_counter() - start
        print(f"tree              : {len(files)} files, {mb:.0f} MB")
        print(f"boto3 upload loop : {baseline:6.1f} s  {mb / baseline:7.1f} MB/s")
        print(f"telltale export   : {ours:6.1f} s  {mb / ours:7.1f} MB/s  "
              f"(x{baseline / ours:.2f}; sha256 manifest of {result.files} files included)")
    finally:
        server.terminate()
        server.wait(30)
    payloads = [LtsPayload(metadata=LtsMetadata(run_uuid=f"run-{i}", start="2026-01-01T00:00:00Z"),
                           kpis={f"kpi{k}": LtsKpi(value=float(i), unit="u", help="h",
                                                   lower_better=False,
                                                   labels={"model": "m", "gpu": "1"})
                                 for k in range(9)}) for i in range(args.docs)]
    with opensearch_server() as (url, _):
        start = time.perf_counter()
        written = export_payloads(OpenSearchInstance(url=url), payloads, index="bench",
                                  kpi_index="bench-kpis")
        elapsed = time.perf_counter() - start
    docs = sum(written.values())
    print(f"opensearch bulk   : {docs} docs in {elapsed:.1f} s = {docs / elapsed:,.0f} docs/s "
          f"({args.docs} run docs + {docs - args.docs} KPI docs, test server on loopback)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
