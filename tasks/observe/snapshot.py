"""Query a run's TSDB snapshot again: rebuild each cell's ``series.parquet`` without the run.

A run leaves its Prometheus's snapshot in ``<run>/prometheus/data/snapshots/<name>``. A cell
whose capture was lost (deleted, a capture that failed, a run made before a query was added)
is captured again from it: a Prometheus is started on a *copy* of the snapshot (Prometheus
writes to its data dir; the artifact stays as it was), with no scrape target and a retention
that keeps old blocks, and each cell's window (``test_start_end.json``) is queried like the
live capture does. Then ``python -m analysis`` or replot read the files as usual.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from core.errors import ResultsError
from core.safeio import UnreadableInputError, read_text_bounded
from tasks.artifacts import allocate_dir
from tasks.observe.prometheus import PrometheusServer
from tasks.observe.promql import LOCAL_QUERIES, capture_window

__all__ = ["latest_snapshot", "requery_run"]

logger = logging.getLogger("telltale.prometheus")

CAPTURE_STEP = "observe__capture_prometheus"


def latest_snapshot(run_dir: Path) -> Path:
    """The newest snapshot of the run's Prometheus.

    Raises:
        ResultsError: The run has none.
    """
    root = run_dir / "prometheus" / "data" / "snapshots"
    found = sorted(p for p in root.glob("*") if p.is_dir() and not p.is_symlink()) \
        if root.is_dir() else []
    if not found:
        raise ResultsError(f"no Prometheus snapshot under {root}")
    return found[-1]


def _window(cell: Path) -> tuple[datetime, datetime] | None:
    try:
        times = json.loads(read_text_bounded(cell / "test_start_end.json", 64 * 1024,
                                             what="test window"))
        return datetime.fromisoformat(times["start"]), datetime.fromisoformat(times["end"])
    except (OSError, ValueError, KeyError, TypeError, UnreadableInputError):
        return None


def requery_run(run_dir: Path, *, snapshot: Path | None = None, force: bool = False,
                queries: Mapping[str, str] = LOCAL_QUERIES,
                scrape_interval_s: float = 1.0) -> list[str]:
    """Capture each cell of ``run_dir`` again from a snapshot; returns the cells written.

    Args:
        run_dir: The run's artifact dir.
        snapshot: The snapshot dir (default: the run's newest).
        force: Also replace captures that exist.
        queries: What to query (default: the local platform's).
        scrape_interval_s: The run's scrape interval (sets the rate window).

    Raises:
        ResultsError: No snapshot.
    """
    source = snapshot or latest_snapshot(run_dir)
    written: list[str] = []
    with tempfile.TemporaryDirectory(prefix="telltale-snapshot-") as tmp:
        home = Path(tmp)
        shutil.copytree(source, home / "data", symlinks=True)
        prometheus = PrometheusServer.open_tsdb(home, scrape_interval_s=scrape_interval_s)
        try:
            for cell in sorted(run_dir.glob("*__cell")):
                window = _window(cell)
                if window is None:
                    logger.warning("%s: no usable test_start_end.json: skipped", cell.name)
                    continue
                steps = sorted(cell.glob(f"*__{CAPTURE_STEP}"))
                if steps and (steps[-1] / "prometheus" / "series.parquet").is_file() \
                        and not force:
                    continue
                step = steps[-1] if steps else allocate_dir(cell, CAPTURE_STEP)
                capture_window(prometheus, queries, *window, step / "prometheus")
                written.append(cell.name)
        finally:
            prometheus.stop()
    return written
