"""The janitor's flows (`flows.cleanup`): leaks on a cluster and QUADS leases of dead runs."""

from pathlib import Path

from prefect import flow
from pydantic import BaseModel

from core.errors import ConfigError
from core.terminal import say
from flows.cli import parse_age
from projects.config import resolve
from tasks.kube.api import Kube, api_client, owned_clients
from tasks.kube.machinesets import SCALED_BY_LABEL, find_scaled_leaks, give_back
from tasks.kube.workload import find_leaks, remove_object
from tasks.lab.lease import find_orphans, release_from_file, release_orphan
from tasks.lab.provision import quads_client
from tasks.platforms.select import find_kubeconfig

__all__ = ["JanitorOutcome", "janitor", "quads_janitor"]


class JanitorOutcome(BaseModel):
    """What the janitor found and did."""

    leaks: list[str]
    deleted: int
    dry_run: bool


@flow(name="cleanup-janitor", log_prints=True)
def janitor(older_than: str = "6h", dry_run: bool = True,
            kubeconfig: str | None = None) -> JanitorOutcome:
    """Delete objects of crashed runs older than ``older_than`` (``--dry-run`` only lists).

    Args:
        older_than: Minimum age, e.g. 6h, 90m, 2d.
        dry_run: Only list what would be deleted.
        kubeconfig: Kubeconfig path (default: KUBECONFIG, ~/.kube/config, in-cluster).
    """
    seconds = parse_age(older_than)
    config = kubeconfig or find_kubeconfig()
    if config is None:
        raise ConfigError("no kubeconfig: pass --kubeconfig or set KUBECONFIG")
    with owned_clients():  # the sweep's clients are closed when it ends
        return _sweep(config, seconds, dry_run)


def _sweep(config: str, seconds: float, dry_run: bool) -> JanitorOutcome:
    """The janitor's work: list the leaks, then delete them and scale back (not dry run)."""
    leaks = find_leaks(config, seconds)
    names = [f"{kind}/{ns + '/' if ns else ''}{name} (run {run})"
             for _, kind, name, ns, run in leaks]
    for line in names:
        say(("would delete " if dry_run else "deleting ") + line)
    kube = Kube(api_client(config))
    scaled = find_scaled_leaks(kube, seconds)
    for machineset in scaled:
        meta = machineset["metadata"]
        line = (f"MachineSet/{meta.get('namespace')}/{meta['name']} (scaled by run "
                f"{meta['labels'].get(SCALED_BY_LABEL)})")
        names.append(line)
        say(("would scale back " if dry_run else "scaling back ") + line)
    deleted = 0
    if not dry_run:
        for api_version, kind, name, namespace, _ in leaks:
            deleted += remove_object(kube, api_version, kind, name, namespace)
        for machineset in scaled:
            say(give_back(kube, machineset))
            deleted += 1
    return JanitorOutcome(leaks=names, deleted=deleted, dry_run=dry_run)


@flow(name="cleanup-quads", log_prints=True)
def quads_janitor(project: str, older_than: str = "6h", dry_run: bool = True,
                  artifacts: str = "runs", presets: list[str] | None = None,
                  artifact_dir: str | None = None) -> JanitorOutcome:
    """Release the QUADS assignments of dead runs (``--dry-run`` only lists them).

    Args:
        older_than: With no local ``lease.json``, release only assignments surely older.
        dry_run: Only list what would be released.
        artifacts: Where the runs' artifact dirs (and their ``lease.json``) are.
        project: The project whose secrets block names the QUADS credentials.
        presets: Presets of that project's config (for the secrets block).
        artifact_dir: Release this one run's lease and nothing else.
    """
    seconds = parse_age(older_than)
    secrets = resolve(project, presets=presets or [], overrides={}).model.secrets
    with quads_client(secrets) as client:
        if artifact_dir is not None:
            released = not dry_run and release_from_file(client, Path(artifact_dir))
            line = f"lease of {artifact_dir}"
            say(("would release " if dry_run else "released " if released
                   else "nothing to release: ") + line)
            return JanitorOutcome(leaks=[line], deleted=int(released), dry_run=dry_run)
        orphans = find_orphans(client, [Path(artifacts)], seconds)
        names = [f"assignment {o.assignment_id} ({o.cloud}, run {o.marker}): {o.reason}"
                 for o in orphans]
        for line in names:
            say(("would release " if dry_run else "releasing ") + line)
        released = 0
        if not dry_run:
            for orphan in orphans:
                release_orphan(client, orphan)
                released += 1
    return JanitorOutcome(leaks=names, deleted=released, dry_run=dry_run)
