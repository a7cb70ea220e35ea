"""Command line of the fine_tuning flow.

python -m flows.fine_tuning [--preset NAME]... [--var KEY=VALUE]... [--vars-file F]
[--pr-args F] [--artifact-dir D] [--platform auto|local|kubernetes]
[--plan] [--list-presets] [--show-config] [--show-schema]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from flows.cli import (
    EXIT_OK,
    add_config_arguments,
    default_artifact_dir,
    main_guard,
    make_parser,
    overrides_from_args,
    prefect_defaults,
    resolve_from_args,
)
from projects.config import json_schema, resolve
from projects.plan import format_plan
from tasks.platform import select_platform

PROJECT = "fine_tuning"


def _parser() -> object:
    parser = make_parser("python -m flows.fine_tuning",
                         "Run (or plan) the fine_tuning performance test.")
    add_config_arguments(parser)
    parser.add_argument("--artifact-dir", metavar="D",
                        help="where artifacts go (default: runs/<date>-fine_tuning-<id>)")
    parser.add_argument("--platform", choices=["auto", "local", "kubernetes"],
                        help="override clusters.platform")
    parser.add_argument("--plan", action="store_true",
                        help="resolve config, expand the matrix, write config.yaml and plan.yaml;"
                             " touch nothing")
    parser.add_argument("--list-presets", action="store_true", help="list presets and exit")
    parser.add_argument("--show-config", action="store_true",
                        help="print the resolved config (secrets redacted) and exit")
    parser.add_argument("--show-schema", action="store_true",
                        help="print the config's JSON schema and exit")
    return parser


@main_guard
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)  # type: ignore[attr-defined]
    if args.list_presets:
        presets = resolve(PROJECT, env={}).get("ci_presets")
        for name, body in presets.items():
            parents = (body or {}).get("extends", [])
            parents = [parents] if isinstance(parents, str) else parents
            print(f"{name}" + (f"  (extends {', '.join(parents)})" if parents else ""))
        return EXIT_OK
    if args.show_schema:
        print(json.dumps(json_schema(PROJECT), indent=2))
        return EXIT_OK
    config = resolve_from_args(PROJECT, args)
    if args.show_config:
        sys.stdout.write(config.to_yaml())
        return EXIT_OK
    requested = args.platform or config.get("clusters.platform")
    if args.plan:  # a plan touches no cluster: it needs no kubeconfig
        platform = requested if requested != "auto" else select_platform(
            "auto", config.get("clusters.kubeconfig"))[0]
    else:
        platform, _ = select_platform(
            requested, config.get("clusters.kubeconfig"),
            creates_cluster=bool(config.get("clusters.create.type")))
    if args.plan:
        from flows.fine_tuning.planning import plan_run

        artifact_dir = Path(args.artifact_dir or default_artifact_dir(PROJECT))
        plan = plan_run(config, platform, artifact_dir)
        print(format_plan(plan))
        print(f"\nplan written to {artifact_dir}/plan.yaml")
        return EXIT_OK

    prefect_defaults()
    from flows.fine_tuning.flow import run_from_cli

    return run_from_cli(
        presets=list(args.preset),
        overrides=overrides_from_args(args),
        platform=platform,
        artifact_dir=Path(args.artifact_dir) if args.artifact_dir else None,
    )


if __name__ == "__main__":
    sys.exit(main())
