"""Re-run post-processing of a stored run and write the result next to it.

    python -m flows.replot --from s3://bucket/prefix/flow/<run-id> | LOCAL_DIR
        [--download cache|important|all] [--project NAME] [--history URI]
        [--preset NAME]... [--var KEY=VALUE]...

- ``s3://`` sources are fetched into ``runs/replot-<run-id>/`` (every key is checked first: one
  that would escape the target dir stops the fetch), then the new outputs are uploaded to
  ``<source>/plot/``. ``cache`` fetches only settings, exit codes and parse caches (and trusts
  the caches), ``important`` what post-processing reads, ``all`` everything.
- A local dir is post-processed in place; the outputs go to ``LOCAL_DIR/plot``.

S3 endpoint and credentials come from the project's ``export_artifacts`` block and secrets
(``--preset``/``--var`` apply), or the AWS environment (``AWS_ENDPOINT_URL``...). The run is
judged against the history but not appended to it again.
"""

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from prefect import flow
from pydantic import BaseModel

from analysis.pipeline import postprocess
from analysis.settings import AnalysisSettings
from blocks.s3 import S3Target
from core.errors import ConfigError
from core.terminal import say
from flows.api_server import prefect_api
from flows.cli import (
    EXIT_FAILED,
    EXIT_OK,
    add_config_arguments,
    main_guard,
    make_parser,
    overrides_from_args,
    policy_for,
    prefect_defaults,
)
from projects.config import resolve
from projects.library import ExportBlock, SecretsBlock
from projects.registry import available, project_of_flow, project_of_run
from tasks.artifacts import artifact_dir, step, use_artifact_dir
from tasks.publish.export import s3_target
from tasks.publish.s3 import DOWNLOAD_MODES, download_run, upload_tree

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


def source_project(source: str) -> str:
    """The project of a stored run: its flow's name in an S3 key, its cells' records locally.

    Raises:
        ConfigError: Neither says a registered project (pass ``--project``).
    """
    if source.startswith("s3://"):
        parts = source.rstrip("/").split("/")
        found = project_of_flow(parts[-2]) if len(parts) >= 5 else None
    else:
        found = project_of_run(source)
    if found is None:
        raise ConfigError(f"cannot tell which project {source} belongs to: pass --project "
                          f"({', '.join(available())})", key="--project")
    return found


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


@main_guard
def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    parser = make_parser("python -m flows.replot", "Re-run post-processing of a stored run.")
    parser.add_argument("--from", dest="source", required=True,
                        help="s3://bucket/prefix/flow/<run-id> or a local artifact dir")
    parser.add_argument("--download", choices=DOWNLOAD_MODES, default="important")
    parser.add_argument("--project", help="the run's project (default: the one the run says)")
    parser.add_argument("--history", metavar="URI", help="history to judge against")
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    if not args.source.startswith("s3://") and not Path(args.source).is_dir():
        parser.error(f"--from: no such directory: {args.source}")
    prefect_defaults()
    overrides = overrides_from_args(args, policy_for(args.project or
                                                     source_project(args.source)))
    with prefect_api():
        outcome = replot(source=args.source, download=args.download, project=args.project,
                         history_uri=args.history, presets=args.preset, overrides=overrides)
    say(f"outputs : {outcome.out_dir}")
    if outcome.report:
        say(f"report  : {outcome.report}")
    if outcome.uploaded_to:
        say(f"uploaded: {outcome.uploaded_to}")
    return EXIT_OK if outcome.report or outcome.out_dir else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
