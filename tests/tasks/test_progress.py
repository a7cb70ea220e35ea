"""Workload progress from the log's own progress bar: parsing, the watcher, the UI artifact."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from tqdm import tqdm

from tasks.progress import LogProgress, Progress, last_progress


def _bar_text(done: int, total: int) -> bytes:
    """What tqdm itself writes for a bar stopped at ``done``/``total``."""
    out = io.StringIO()
    bar = tqdm(total=total, file=out, mininterval=0, ascii=False)
    bar.update(done)
    bar.refresh()
    text = out.getvalue()
    bar.close()
    return text.encode()


def test_last_frame_of_a_real_tqdm_bar() -> None:
    text = b"loading\n" + _bar_text(74, 200) + b"\n{'loss': 1.0}\n"
    found = last_progress(text)
    assert found is not None and (found.done, found.total) == (74, 200)
    assert round(found.percent) == 37 and found.line("base").startswith("base: step 74/200 (37%)")


def test_untrusted_frames_are_refused() -> None:
    assert last_progress(b"no bar at all") is None
    assert last_progress(b"999/3 [00:01<00:02") is None  # done beyond total
    assert last_progress(b"5/0 [00:01<00:02") is None
    assert last_progress(b"1" * 40 + b"/2 [00:01<00:02") is None  # absurd numbers
    unknown = last_progress(b"3/10 [00:01<?, ?it/s]")
    assert unknown is not None and unknown.eta is None and "ETA" not in unknown.line("x")


def test_watcher_follows_a_growing_log_and_reports_the_end(tmp_path: Path) -> None:
    log = tmp_path / "pod.log"
    seen: list[Progress] = []
    moved = threading.Event()

    def record(progress: Progress) -> None:
        seen.append(progress)
        moved.set()

    with LogProgress(log, "base", interval=0.01, on_update=record):
        log.write_bytes(_bar_text(10, 100))
        assert moved.wait(60)  # an event, not a sleep: the watcher saw the first frame
        with open(log, "ab") as stream:
            stream.write(b"\r" + _bar_text(100, 100))
    # leaving the block takes a last look: the final frame is always reported
    assert seen[0].done == 10 and seen[-1].done == 100


def test_progress_artifact_in_a_flow_run(prefect_harness, tmp_path: Path) -> None:
    import asyncio
    from uuid import UUID

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    log = tmp_path / "pod.log"
    log.write_bytes(_bar_text(30, 60))

    @flow(name="progress-artifact")
    def watched() -> str:
        from prefect.runtime import flow_run

        with LogProgress(log, "cell-x", interval=3600):
            log.write_bytes(_bar_text(60, 60))
        return str(flow_run.id)

    run_id = watched()

    async def progress_artifacts() -> list[tuple[object, str | None]]:
        # this run's artifacts: the suite's shared API holds hundreds, and an unfiltered
        # read returns the server's default page of them (200), which once left this out
        async with get_client() as client:
            found = await client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(run_id)])))
            return [(a.data, a.description) for a in found
                    if a.type == "progress" and (a.description or "").startswith("cell-x")]

    found = asyncio.run(progress_artifacts())
    assert (100.0, "cell-x: step 60/60 (100%), ETA 00:00") in found, found
