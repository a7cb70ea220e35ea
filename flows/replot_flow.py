"""The replot flow (`flows.replot`): post-process a stored run again, next to it."""

import os
from pathlib import Path
from typing import Any, Literal

from prefect import flow
from pydantic import BaseModel

from analysis.pipeline import postprocess
from analysis.settings import AnalysisSettings
from blocks.s3 import S3Target
from flows.cli import source_project
from projects.config import resolve
from projects.library import ExportBlock, SecretsBlock
from tasks.artifacts import artifact_dir, step, use_artifact_dir
from tasks.publish.export import s3_target
from tasks.publish.s3 import download_run, upload_tree

__all__ = ["ReplotOutcome", "replot"]


class ReplotOutcome(BaseModel):
    """Where the replot wrote its outputs."""

    local_dir: str
    out_dir: str
    report: str | None
    uploaded_to: str | None = None
    fetched: int = 0


def _target_for(url: str, export: ExportBlock, secrets: SecretsBlock) -> S3Target:
    bucket = url[len("s3://"):].split("/", 1)[0]
    if export.s3.bucket:
        return s3_target(export, secrets).model_copy(update={"bucket": bucket})
    return S3Target(bucket=bucket, endpoint_url=os.environ.get("AWS_ENDPOINT_URL"),
                    region=os.environ.get("AWS_DEFAULT_REGION"))


@step("replot", timeout_seconds=3600)
def fetch_run(url: str, dest: str, mode: str, target: S3Target) -> list[str]:
    """Download an exported run into ``dest`` (keys checked against escapes first)."""
    return download_run(url, dest, mode=mode, target=target)  # type: ignore[arg-type]


@step("replot", timeout_seconds=3600)
def replot_results(local_dir: str, project: str, history_uri: str | None,
                   settings: dict[str, Any] | None, trust_cache: bool) -> dict[str, Any]:
    """Post-process ``local_dir`` into ``local_dir/plot``.

    ``settings`` None: the run's own ``analysis`` block (its saved ``config.yaml``), so the
    replot gives the verdicts the run gave.
    """
    out = Path(local_dir) / "plot"
    outcome = postprocess(local_dir, project, out, history_uri=history_uri,
                          settings=AnalysisSettings.model_validate(settings)
                          if settings is not None else None,
                          append_history=False, trust_cache=trust_cache)
    return {"out": str(out), "report": outcome.report, "runs": outcome.runs,
            "step_dir": str(artifact_dir())}


@step("replot", timeout_seconds=3600)
def upload_plot(plot_dir: str, url: str, target: S3Target) -> str:
    """Upload the replot outputs under ``<url>/plot/``."""
    return upload_tree(plot_dir, target, url.rstrip("/") + "/plot").url


@flow(name="replot", log_prints=True)
def replot(
    source: str,
    download: Literal["cache", "important", "all"] = "important",
    project: str | None = None,
    history_uri: str | None = None,
    presets: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> ReplotOutcome:
    """Re-run post-processing of a stored run (S3 export or local artifact dir).

    Args:
        source: ``s3://bucket/prefix/flow/RUN_ID`` or a local artifact dir.
        download: What to fetch from S3: cache, important or all.
        project: The project whose parser and KPIs apply (default: the one the run says:
            its cells' records locally, its flow's name in an S3 key).
        history_uri: History to judge against (default: the config's, if any).
        presets: Presets for the S3 connection settings and analysis block.
        overrides: Config overrides (dotted key → value).
    """
    project = project or source_project(source)
    config = resolve(project, presets=presets or [], overrides=overrides or {})
    settings = config.get("analysis")
    history = history_uri or settings.get("history_uri")
    # Without presets or overrides the run's own analysis block applies (ignored labels,
    # compared label): the verdicts the run gave. Presets or overrides are a deliberate
    # change of the analysis, so the resolved block applies.
    chosen = dict(settings) if presets or overrides else None
    if source.startswith("s3://"):
        target = _target_for(source, config.model.export_artifacts, config.model.secrets)
        run_name = source.rstrip("/").rsplit("/", 1)[-1]
        local = Path("runs") / f"replot-{run_name}"
        with use_artifact_dir(local):
            fetched = fetch_run(source, str(local), download, target)
            result = replot_results(str(local), project, history, chosen,
                                    download == "cache")
            uploaded = upload_plot(result["out"], source, target)
        return ReplotOutcome(local_dir=str(local), out_dir=result["out"],
                             report=result["report"], uploaded_to=uploaded,
                             fetched=len(fetched))
    local = Path(source)
    with use_artifact_dir(local / "plot" / "steps"):
        result = replot_results(str(local), project, history, chosen, False)
    return ReplotOutcome(local_dir=str(local), out_dir=result["out"], report=result["report"])
