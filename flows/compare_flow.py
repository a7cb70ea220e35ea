"""The compare flow (`flows.compare`): two selections of a history, as artifacts."""

from prefect import flow

from analysis.compare import Comparison, compare_frames
from analysis.history import HistoryStore
from analysis.project import load_project
from analysis.settings import settings_for
from tasks.publish.prefect_artifacts import publish_comparison

__all__ = ["compare"]


@flow(name="compare", log_prints=True)
def compare(history: str, a: str, b: str, kpis: list[str] | None = None,
            project: str | None = None, same_within_pct: float = 2.0) -> list[Comparison]:
    """Compare selection B with selection A of the history, KPI by KPI (see module doc)."""
    hooks = load_project(project) if project else None
    ignored = list(settings_for(hooks, ".").comparison.ignored_labels) if hooks else []
    rows = compare_frames(HistoryStore(history).read(), a, b, kpis=kpis or (),
                          ignored_labels=ignored, same_within_pct=same_within_pct,
                          curve=hooks.curve if hooks else None)
    publish_comparison(rows, a, b, key=f"{project or 'history'}")
    return rows
