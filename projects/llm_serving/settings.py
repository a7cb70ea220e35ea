"""The llm_serving project's machine-level settings, from the environment.

Where the serving venv (vLLM + GuideLLM) lives: ``TELLTALE_SERVING__VENV`` (or the older
flat ``TELLTALE_SERVING_VENV``); default ``.venvs/llm-serving`` in the repository. The
project owns them: the engine's own ``TELLTALE_*`` settings (`core.environment`) know no
project.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from core.errors import ConfigError

__all__ = ["ServingEnvironment", "serving_environment"]


class _Serving(BaseModel):
    venv: Path | None = Field(default=None, description="The serving venv.")


class ServingEnvironment(BaseSettings):
    """``TELLTALE_SERVING__VENV`` / ``TELLTALE_SERVING_VENV``."""

    model_config = SettingsConfigDict(env_prefix="TELLTALE_", env_nested_delimiter="__",
                                      extra="ignore", case_sensitive=False)

    serving: _Serving = Field(default_factory=_Serving)
    serving_venv: Path | None = Field(default=None, description="Same as SERVING__VENV "
                                      "(the older flat name install docs and CI used).")

    @property
    def venv(self) -> Path | None:
        """The serving venv the environment names, if any (the nested name wins)."""
        return self.serving.venv or self.serving_venv


def serving_environment() -> ServingEnvironment:
    """The settings as the environment holds them now (read when asked, not at import).

    Raises:
        ConfigError: A malformed value, naming the variable.
    """
    try:
        return ServingEnvironment()
    except SettingsError as exc:  # a nested variable that is not JSON (TELLTALE_SERVING=x)
        raise ConfigError(f"environment variable TELLTALE_SERVING: {exc}") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        name = "TELLTALE_" + "__".join(str(p).upper() for p in error["loc"])
        raise ConfigError(f"environment variable {name}: {error['msg']}") from None
