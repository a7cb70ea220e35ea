"""The command line every project's flow shares: ``python -m flows.<project> ...``.

python -m flows.<project> [--preset NAME]... [--var KEY=VALUE]... [--vars-file F]
[--pr-args F] [--artifact-dir D] [--platform auto|local|kubernetes]
[--pr N] [--rebuild-image] [--plan] [--list-presets] [--show-config] [--show-schema]

Plan, listing and schema never import Prefect (they answer in well under a second); a run
imports the project's flow module ``flows.<project>.flow``.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.paths import writable_dir
from core.terminal import say
from core.timeline import mark
from flows.cli import (
    EXIT_OK,
    add_config_arguments,
    default_artifact_dir,
    main_guard,
    make_parser,
    prefect_defaults,
    resolve_from_args,
)
from flows.local_api import warm_up
from projects import registry
from projects.config import json_schema, resolve, use_config
from projects.plan import format_plan
from tasks.platforms.select import platform_type, select_platform

__all__ = ["project_main"]


def _parser(project: str) -> argparse.ArgumentParser:
    parser = make_parser(f"python -m flows.{project}",
                         f"Run (or plan) the {project} performance test.")
    add_config_arguments(parser)
    parser.add_argument("--artifact-dir", metavar="D",
                        help=f"where artifacts go (default: runs/<date>-{project}-<id>)")
    parser.add_argument("--platform", choices=["auto", "local", "kubernetes"],
                        help="override clusters.platform")
    parser.add_argument("--plan", action="store_true",
                        help="resolve config, expand the matrix, write config.yaml, plan.yaml "
                             "and (kubernetes) every manifest; touch nothing")
    parser.add_argument("--pr", type=_pr_number, metavar="N",
                        help="the PR under test: its head is built into Telltale's image in "
                             "the cluster (default: PULL_NUMBER when HOMELAB_CI=true)")
    parser.add_argument("--rebuild-image", action="store_true",
                        help="build Telltale's image of the PR (--pr) in the cluster, print "
                             "each target's digest and exit (kept until the next refresh)")
    parser.add_argument("--list-presets", action="store_true", help="list presets and exit")
    parser.add_argument("--show-config", action="store_true",
                        help="print the resolved config (secrets redacted) and exit")
    parser.add_argument("--show-schema", action="store_true",
                        help="print the config's JSON schema and exit")
    return parser


def _pr_number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= 10_000_000:
        raise argparse.ArgumentTypeError(f"a PR number, got {text!r}")
    return int(text)


def _rebuild_image(project: str, config: Any, artifact_dir: Path) -> int:
    """``--rebuild-image``: build the PR's image targets without a run; print the digests."""
    from core.errors import ConfigError
    from tasks.kube.api import Kube, api_client, owned_clients
    from tasks.kube.images import run_builds

    clusters = config.model.clusters
    if clusters.image_build.pr is None:
        raise ConfigError("--rebuild-image needs the PR: --pr N (or PULL_NUMBER with "
                          "HOMELAB_CI=true)", key="clusters.image_build.pr")
    kubeconfig = select_platform("kubernetes", clusters.kubeconfig)[1]
    namespace = registry.load(project).test_block(config.model).namespace
    with owned_clients():
        kube = Kube(api_client(kubeconfig))
        images = run_builds(kube, kube, clusters.image_build, namespace, run_id=None,
                            here=artifact_dir, progress=lambda target, phase: say(
                                f"{target}: {phase}", error=True))
    for target, image in images.items():
        say(f"{target}\t{image}", keep_newlines=True)  # a tab-separated line
    say(f"build logs in {artifact_dir}", error=True)
    return EXIT_OK


def project_main(project: str, argv: Sequence[str] | None = None) -> int:
    """Run the command line of ``project``; returns the process exit code."""

    @main_guard
    def main(args_list: Sequence[str] | None) -> int:
        args = _parser(project).parse_args(args_list)
        if args.list_presets:
            presets = resolve(project, env={}).get("ci_presets")
            for name, body in presets.items():
                parents = (body or {}).get("extends", [])
                parents = [parents] if isinstance(parents, str) else parents
                say(f"{name}" + (f"  (extends {', '.join(parents)})" if parents else ""))
            return EXIT_OK
        if args.show_schema:
            say(json.dumps(json_schema(project), indent=2), keep_newlines=True)
            return EXIT_OK
        if args.artifact_dir:
            writable_dir(args.artifact_dir, "--artifact-dir")
        config = resolve_from_args(project, args)
        if args.show_config:
            say(config.to_yaml().rstrip("\n"), keep_newlines=True)
            return EXIT_OK
        if args.rebuild_image:
            return _rebuild_image(project, config, Path(args.artifact_dir or default_artifact_dir(
                f"{project}-image")))
        clusters = config.model.clusters
        requested = args.platform or clusters.platform
        if args.plan:  # a plan touches no cluster: it needs no kubeconfig
            platform = requested if requested != "auto" else select_platform(
                "auto", clusters.kubeconfig)[0]
            from tasks.platforms.plan import plan_run

            artifact_dir = Path(args.artifact_dir or default_artifact_dir(project))
            plan = plan_run(registry.load(project), config, platform, artifact_dir)
            say(format_plan(plan), keep_newlines=True)
            say("")
            say(f"plan written to {artifact_dir}/plan.yaml")
            return EXIT_OK
        platform, _ = select_platform(requested, clusters.kubeconfig,
                                      creates_cluster=clusters.create.type is not None)
        prefect_defaults()
        artifact_dir = Path(args.artifact_dir) if args.artifact_dir else None
        # What the platform starts before the run (`Platform.ahead`): first thing, so that
        # Prometheus's first scrape (5 s after it starts) overlaps importing Prefect and the
        # flow, and finding or starting the Prefect API.
        mark("start ahead (prometheus, a first server)")
        with platform_type(platform).ahead(registry.load(project), config, artifact_dir), \
                use_config(config):  # the flow takes it: resolved once (`resolve_once`)
            # the shared Prefect API's first start overlaps the imports and the flow's
            # start; Prometheus went first: its scrape tick is the longer wait of a warm run
            warm_up()
            mark("import prefect and the flow")
            from flows.orchestration import run_from_cli

            module = importlib.import_module(f"flows.{project}.flow")
            return run_from_cli(module.FLOW, presets=list(args.preset),
                                overrides=config.request_overrides,
                                platform=platform, artifact_dir=artifact_dir)

    return main(argv)
