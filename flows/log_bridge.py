"""The Prefect log bridge: Telltale's own log lines reach the run's page in the Prefect UI.

Inside a flow run, the ``telltale.*`` loggers also write to Prefect's run logger (the UI);
outside one (a unit test, ``python -m analysis``), nothing is forwarded. `_log` is the
logger a phase writes to: Prefect's inside a run, the module's otherwise.
"""

from __future__ import annotations

import logging
from typing import Any

from core.redact import RedactingFilter

logger = logging.getLogger("telltale.flows")


def _log() -> Any:
    """Prefect's run logger inside a run (it reaches the UI), else the module logger."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # outside a flow or task run
        return logger


class _InRunOnly(logging.Filter):
    """Pass only records made inside a Prefect flow or task run (others have no run to go to)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from prefect.context import FlowRunContext, TaskRunContext

        return FlowRunContext.get() is not None or TaskRunContext.get() is not None


_UI_HANDLER: logging.Handler | None = None


def send_telltale_logs_to_prefect() -> None:
    """Send the ``telltale.*`` loggers' lines to the run's logs in the Prefect UI.

    Lines like "base finished: exit 0 ..." reached only the step logs and the terminal.
    Prefect sends only its own loggers to the API unless ``PREFECT_LOGGING_EXTRA_LOGGERS``
    names others before it sets logging up; attaching its `APILogHandler` here needs no
    environment variable on the worker. Idempotent; lines from outside a run are dropped
    by the filter instead of warning.
    """
    global _UI_HANDLER
    if _UI_HANDLER is not None:
        return
    from prefect.logging.handlers import APILogHandler

    handler = APILogHandler(level=logging.INFO)
    handler.addFilter(_InRunOnly())
    handler.addFilter(RedactingFilter())
    ours = logging.getLogger("telltale")
    if ours.level == logging.NOTSET:  # INFO lines are the point, whatever the root says
        ours.setLevel(logging.INFO)
    if not any(isinstance(h, APILogHandler) for h in ours.handlers):
        ours.addHandler(handler)
    _UI_HANDLER = handler


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    return str(run_id) if run_id else None


def _deployment_id() -> str | None:
    """The deployment of this run, None for a CLI run.

    Prefect's documented runtime field (``PREFECT__RUNTIME__DEPLOYMENT__ID`` sets it in tests).
    """
    from prefect.runtime import deployment

    return deployment.id or None
