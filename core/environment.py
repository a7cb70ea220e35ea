"""Telltale's settings that come from the environment (``TELLTALE_*``), read by pydantic-settings.

One typed place for the process-wide switches; the project config (YAML + presets) stays the
place for everything a run is about. ``TELLTALE__a__b=value`` variables are *config* overrides,
not settings: they address any key of a project's config, validated by that project's model, so
`projects.config` reads them (a settings model has no fixed fields for them); with this
model's ``TELLTALE_`` prefix they never collide (no field starts with an underscore).

Nested groups use ``__`` (pydantic-settings' nested delimiter). A project's own machine
settings are the project's (llm_serving's serving venv: `projects.llm_serving.settings`).
Settings are read when asked for, not at import, so a test or a CLI that sets a variable
before the call is seen.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from core.errors import ConfigError

__all__ = ["TelltaleEnv", "default_data_dir", "env_settings", "local_services_home",
           "prefect_home"]


class TelltaleEnv(BaseSettings):
    """``TELLTALE_*`` environment variables.

    Unknown ones are ignored: the workload's own ``TELLTALE_USERS``... belong to its scripts,
    which stay standard-library only.
    """

    model_config = SettingsConfigDict(env_prefix="TELLTALE_", env_nested_delimiter="__",
                                      extra="ignore", case_sensitive=False)

    data_dir: Path | None = Field(default=None, description="History and caches; default "
                                  "the user's data dir (platformdirs).")
    runs_dir: Path | None = Field(default=None, description="Where runs go when no artifact "
                                  "dir is given (default ./runs; <data dir>/runs for a "
                                  "deployment run, whose working dir a worker deletes).")
    force_reparse: bool = Field(default=False, description="Ignore the parse caches.")
    beside: bool = Field(default=True, description="A command-line post-processing uses the "
                         "machine's other core for work that waits on nothing else "
                         "(core.forked): the memo's stamps, half the warm parse, the "
                         "report. 0: one core.")

    @field_validator("data_dir", "runs_dir", "prefect_api_home")
    @classmethod
    def _a_directory(cls, value: Path | None) -> Path | None:
        """A directory, or a path a directory can be made at (not a file, nor under one)."""
        if value is None:
            return None
        probe = value.expanduser()
        while not os.path.lexists(probe) and probe != probe.parent:
            probe = probe.parent
        if os.path.lexists(probe) and not probe.is_dir():
            where = "is" if probe == value.expanduser() else f"is under {probe}, which is"
            raise ValueError(f"{value} {where} not a directory")
        return value.expanduser()
    image: str | None = Field(default=None, description="The container image this runs in "
                              "(set by the Containerfile); recorded as a label.")
    ci_engine: str = Field(default="prefect", description="Recorded in each cell's "
                           "settings.yaml.")
    prefect_api: Literal["reuse", "temporary"] = Field(
        default="reuse", description="A command-line run's Prefect API when PREFECT_API_URL "
        "is unset: `reuse` the local server runs share (started on first use, stopped when "
        "idle; flows.local_api), or a `temporary` one for the run alone.")
    prefect_api_home: Path | None = Field(default=None, description="The Prefect home of the "
                                          "shared local API (default: PREFECT_HOME).")
    prefect_api_idle_minutes: float = Field(default=20.0, gt=0, le=7 * 24 * 60,
                                            allow_inf_nan=False, description="The shared "
                                            "local API stops after this long unused (at most "
                                            "a week: an infinite one would never stop).")
    spare_prometheus_minutes: float = Field(
        default=10.0, ge=0, le=7 * 24 * 60, allow_inf_nan=False, description="A command-line "
        "run on this machine leaves a spare Prometheus, already scraping, that the next run "
        "adopts (tasks.observe.spare); unadopted, it stops after this long. 0: none.")
    warm_python_minutes: float = Field(
        default=10.0, ge=0, le=7 * 24 * 60, allow_inf_nan=False, description="A local run's "
        "workload is forked from a warm Python (its heavy imports done: torch, transformers; "
        "core.warm_python) that the run starts at its own start when none is there and "
        "leaves for the next; unused, it stops after this long. 0: every workload is a "
        "fresh interpreter. The launch is a label: forked and fresh runs are separate "
        "configurations (their resource KPIs differ).")
    warm_command_minutes: float = Field(
        default=10.0, ge=0, le=7 * 24 * 60, allow_inf_nan=False, description="A command "
        "line (`python -m analysis`) that ran in full leaves a warm Python with its imports "
        "done (pandas, pyarrow, Telltale's own modules; core.warm_command), keyed by the "
        "code's stamps and the whole environment, that serves the next command line with "
        "the same key; unused, it stops after this long. 0: every command line is a fresh "
        "interpreter.")


def default_data_dir() -> Path:
    """Telltale's data dir: ``$TELLTALE_DATA_DIR`` or the user's data dir.

    An environment setting like the others here, not the history's (`analysis.history`
    keeps its history under it): the command line and the lab's cluster credentials ask
    for it too, without the history's Parquet stack.
    """
    root = env_settings().data_dir
    if not root:
        from platformdirs import user_data_dir

        root = user_data_dir("telltale", appauthor=False)
    return Path(root)


def local_services_home() -> Path:
    """Where the local services command-line runs share keep their state.

    The shared Prefect API (`flows.local_api`) and the spare Prometheus
    (`tasks.observe.spare`): ``TELLTALE_PREFECT_API_HOME``, else the ``PREFECT_HOME``
    variable, else ``~/.prefect`` (Prefect's default). Read without importing Prefect
    (1.3 s): a run asks before it imports it.
    """
    chosen = env_settings().prefect_api_home
    return chosen if chosen is not None else prefect_home()


def prefect_home() -> Path:
    """Prefect's home as Prefect reads it: ``PREFECT_HOME``, else ``~/.prefect``."""
    return Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()


def env_settings() -> TelltaleEnv:
    """The ``TELLTALE_*`` settings as the environment holds them now.

    Building the model costs ~1 ms (pydantic-settings scans every source); the parser asks
    once per result dir, so the answer is kept per distinct set of ``TELLTALE_*`` variables.
    """
    prefix = "TELLTALE_"
    return _settings_for(tuple(sorted((k, v) for k, v in os.environ.items()
                                      if k[:9].upper() == prefix)))


@functools.lru_cache(maxsize=8)
def _settings_for(variables: tuple[tuple[str, str], ...]) -> TelltaleEnv:
    # the key is what the model reads; the model still reads os.environ itself
    try:
        return TelltaleEnv()
    except SettingsError as exc:  # a value pydantic-settings cannot even parse
        raise ConfigError(f"environment variable TELLTALE_*: {exc}") from None
    except ValidationError as exc:  # one line naming the variable, never a traceback
        error = exc.errors()[0]
        name = "TELLTALE_" + str(error["loc"][0]).upper() if error["loc"] else "TELLTALE_*"
        message = str(error["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"environment variable {name}: {message}") from None
