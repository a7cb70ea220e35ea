"""The fine_tuning project's post-processing plugin (entry point ``telltale.projects``)."""

from __future__ import annotations

from pathlib import Path

from analysis.parsing import ParsedResult
from analysis.project import AnalysisProject
from projects.fine_tuning.kpis import KPIS, labels, results_summary
from projects.fine_tuning.parser import FineTuningParser, FineTuningResult

__all__ = ["PROJECT"]


def _as_ft(result: ParsedResult) -> FineTuningResult:
    if not isinstance(result, FineTuningResult):
        raise TypeError(f"expected a FineTuningResult, got {type(result).__name__}")
    return result


def _run_uuid(result: ParsedResult) -> str:
    return _as_ft(result).run_uuid or result.rel_path


def _timestamps(result: ParsedResult) -> tuple[str | None, str | None]:
    ft = _as_ft(result)
    return ft.start, ft.end


def _loss_curve(result: ParsedResult) -> list[dict[str, float]]:
    losses = _as_ft(result).progress.loss
    return [{"step": step, "loss": loss} for step, loss in enumerate(losses, start=1)
            if loss is not None]


def _user_rows(result: ParsedResult) -> list[dict[str, object]]:
    return [user.model_dump() for user in _as_ft(result).users]


PROJECT = AnalysisProject(
    name="fine_tuning",
    parser=FineTuningParser(),
    kpis=KPIS,
    labels=lambda r: labels(_as_ft(r)),
    results_summary=lambda r: results_summary(_as_ft(r)),
    run_uuid=_run_uuid,
    timestamps=_timestamps,
    plots_file=Path(__file__).with_name("plots.yaml"),
    loss_curve=_loss_curve,
    user_rows=_user_rows,
)
