"""What a command-line run on this machine starts before its flow, and leaves after it.

The workload's warm Python (`core.warm_python`: it stays for the next runs), Prometheus (a
spare the previous run left, already scraping, or one of its own) and the first cell's
server start while Prefect is imported and its API found; the run takes them when it asks
for the same ones (`tasks.platforms.local_warm.find_warm`,
`tasks.observe.prometheus.take_ahead`, `tasks.platforms.service.take_ahead`). A run
whose cells end normally leaves a spare Prometheus for the next (`offer_spare`, once its
last cell is done: the platform's ``lock`` block), which the next run adopts (`adopt_spare`:
here for a command line, in the platform's prepare for any other run).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.environment import env_settings
from core.errors import ConfigError
from core.terminal import say
from projects.config import Config
from projects.contract import CellContext, Project
from tasks.observe.prometheus import (
    PrometheusServer,
    find_binaries,
    keep_ahead,
    local_wanted,
    start_ahead,
    stop_ahead,
)
from tasks.observe.spare import adopt, offer, spare_base
from tasks.platforms import service
from tasks.platforms.local_warm import offer_warm

__all__ = ["adopt_spare", "ahead", "first_context", "offer_spare"]


@contextmanager
def ahead(project: Project, config: Config, artifact_dir: Path | None) -> Iterator[None]:
    """Start the run's warm Python, Prometheus and the first cell's server before the flow.

    All start while Prefect is imported and its API found (seconds each); the run takes
    them when it asks for the same ones, and whatever it did not take is stopped at the
    end. Prometheus is a spare the previous run left, already scraping, when there is
    one (`adopt_spare`).
    """
    block = config.model.observe.prometheus
    _warm_ahead(project, config)  # first: its imports are the longest start
    _observe_ahead(block, artifact_dir)
    _service_ahead(project, config, artifact_dir)
    try:
        yield
    finally:
        service.stop_ahead()
        stop_ahead()


def _observe_ahead(block: Any, artifact_dir: Path | None) -> None:
    """Adopt a spare Prometheus, already scraping (`tasks.observe.spare`), or start one.

    The run's own starts while Prefect's API is found and the flow imported (`start_ahead`).
    """
    if not local_wanted(block) or find_binaries() is None:
        return  # "on" without binaries: the platform says so, with the config key
    spare = adopt_spare(block)
    if spare is not None:
        keep_ahead(spare)
        return
    try:
        start_ahead(artifact_dir.parent if artifact_dir else Path("runs"),
                    scrape_interval_s=block.scrape_interval_s,
                    ready_timeout_s=block.ready_timeout_s)
    except Exception as exc:  # the platform starts its own, and reports what goes wrong
        say(f"note: prometheus not started ahead: {exc}", error=True)


def first_context(hooks: Project, config: Config) -> CellContext | None:
    """The first runnable cell's context as the run will give it (None: no cell runs)."""
    from projects.plan import cells_of

    cells = [c for c in cells_of(config, hooks.name) if not c.skip_reason]
    if not cells:
        return None
    return CellContext(
        settings=cells[0].typed_as(hooks.settings_model),
        test=hooks.test_block(config.model), index=cells[0].index, name=cells[0].name,
        workdir=Path("."), data_dir=hooks.data_dir, run_id="ahead")


def _service_ahead(hooks: Project, config: Config, artifact_dir: Path | None) -> None:
    """Start the first cell's server (a project's `LocalService`) while Prefect starts.

    Best effort: the run takes it when its first cell asks for the same server, or starts
    its own (and reports what goes wrong); a command or an input that is not there yet
    (the serving venv or the model of a first run: the prepare builds them) is not tried.
    """
    if hooks.local_service is None:
        return
    try:
        context = first_context(hooks, config)
        if context is None:
            return
        spec = hooks.local_service(context)
        if not all(Path(str(p)).exists() for p in (spec.argv[0], *spec.needs)):
            return
        service.start_ahead(spec, artifact_dir.parent if artifact_dir else Path("runs"))
    except ConfigError:  # a cell that cannot run: the run's own check says why, once
        return
    except Exception as exc:  # the platform starts its own, and reports what goes wrong
        say(f"note: server not started ahead: {exc}", error=True)


def _warm_ahead(hooks: Project, config: Config) -> None:
    """Start the workload's warm Python (`core.warm_python`) while Prefect starts.

    Its imports (torch, transformers: seconds) overlap the run's own start-up; the run's
    prepare waits for it and its first cell forks from it. Best effort: the run starts one
    itself, or a fresh workload. Nothing when one runs already or the setting is 0.
    """
    if hooks.local is None or env_settings().warm_python_minutes <= 0:
        return
    try:
        context = first_context(hooks, config)
        if context is not None:
            offer_warm(hooks.local(context))
    except ConfigError:  # a cell that cannot run: the run's own check says why, once
        return
    except Exception as exc:  # the run tries again in its prepare
        say(f"note: warm python not started ahead: {exc}", error=True)


def adopt_spare(block: Any, home: Path | None = None) -> PrometheusServer | None:
    """A spare Prometheus this run adopts (`tasks.observe.spare`), or None.

    ``home``: the run's ``prometheus/`` dir, where its files go when it stops (a command
    line adopts before its run dir exists: `take_ahead` tells it later).
    """
    try:
        spare = adopt(spare_base(), scrape_interval_s=block.scrape_interval_s)
    except Exception as exc:  # a broken spare never stops a run: it starts its own
        say(f"note: no spare prometheus adopted: {exc}", error=True)
        return None
    if spare is not None and home is not None:
        spare.relocate_to = home
    return spare


def offer_spare(block: Any) -> None:
    """Leave a spare Prometheus for the next run on this machine (`tasks.observe.spare`)."""
    if not local_wanted(block) or find_binaries() is None:
        return
    try:
        offer(spare_base(), scrape_interval_s=block.scrape_interval_s,
              minutes=env_settings().spare_prometheus_minutes)
    except Exception as exc:  # the next run starts its own
        say(f"note: no spare prometheus left for the next run: {exc}", error=True)
