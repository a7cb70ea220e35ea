"""The config engine: base YAML → presets → overrides → environment → validation → `Config`.

Precedence, lowest first (DESIGN §3), applied as an ordered list of sources:

1. the project's base ``config.yaml``;
2. presets from ``ci_presets``, in the order requested; ``extends: [a, b]`` inside a preset
   applies ``a`` then ``b`` *at the position where ``extends`` appears*, recursively;
3. overrides (``--var``, ``--vars-file``, PR-comment ``/var key: value`` lines), their text
   parsed as YAML once, by the command line (`parse_override`); values given to `resolve`
   are taken as they are;
4. environment variables ``TELLTALE__<dotted path with __ for .>``, values parsed as YAML
   (``TELLTALE__tests__fine_tuning__test_settings__gpu=2``).

The project's pydantic model is the schema (`projects.schema`): the base file is merged, key
by key, over the model's defaults, so it holds only what differs from them; a preset,
override or environment variable may set any key the model declares, and a key it does not
declare is refused with the closest declared ones. Assigning a mapping replaces the whole
subtree. A bare YAML file (no project, no model) keeps the field's rule: only keys the file
holds exist. Traps removed: a preset cycle is reported with its path, every error names the
file, key path and line, and the result is validated by the model.
"""

from __future__ import annotations

import contextvars
import copy
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from core.errors import ConfigError
from core.redact import (
    REDACTED,
    is_secret_key,
    redact,
)
from core.safeio import write_text
from core.yamlio import LineMap, dump_yaml, load_yaml
from projects import registry
from projects.disabled import _refuse_settings_of_disabled_features
from projects.overrides import (
    ENV_PREFIX,
    _env_overrides,
    _refuse_secret_values,
    _request,
    load_vars_file,
    parse_override,
)
from projects.resolver import _MISSING, _closest, _data_path, _lookup, _merged, _Resolver, _split
from projects.schema import defaults_of

__all__ = [
    "ENV_PREFIX",
    "Config",
    "ConfigError",
    "current_config",
    "json_schema",
    "load_vars_file",
    "parse_override",
    "resolve",
    "resolve_once",
    "use_config",
]


class Config:
    """A resolved, validated project configuration.

    Read it with `get`; `set` is allowed only in the main thread before `freeze` (which the
    flow calls before any fan-out), so concurrent steps always see the same values.

    Attributes:
        project: Project name, or ``None`` for a bare YAML file.
        file: The base config file.
        presets_applied: Presets in application order (child first, then parents).
        overrides: Dotted key → value from vars, PR comments and the environment.
        sources: Dotted key → the preset/override that last set it.
    """

    def __init__(
        self,
        data: dict[str, Any],
        *,
        project: str | None,
        file: str,
        presets_applied: Sequence[str],
        overrides: Mapping[str, Any],
        sources: Mapping[str, str],
        model: type[BaseModel] | None,
        lines: LineMap | None = None,
    ) -> None:
        self._data = data
        self.project = project
        self.file = file
        self.presets_applied: tuple[str, ...] = tuple(presets_applied)
        self.overrides: dict[str, Any] = dict(overrides)
        self.request: str | None = None  # what `resolve` was asked (`resolve_once`)
        self.request_overrides: dict[str, Any] = {}  # the overrides it was given, as given
        self.sources: dict[str, str] = dict(sources)
        self._model = model
        self._lines = lines or {}
        self._frozen = False
        self.typed: BaseModel | None = self._validate(data)
        if self.typed is not None:
            _refuse_settings_of_disabled_features(self.typed, self.sources, self.file,
                                                  self._lines)

    def __repr__(self) -> str:
        return (f"Config(project={self.project!r}, presets={list(self.presets_applied)!r}, "
                f"frozen={self._frozen})")

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def _validate(self, data: dict[str, Any]) -> BaseModel | None:
        if self._model is None:
            return None
        try:
            return self._model.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            path = _data_path(data, err["loc"])
            origin = self.sources.get(path)
            if origin is None:  # a parent mapping may have been replaced as a whole
                for key, src in self.sources.items():
                    if path.startswith(key + "."):
                        origin = src
            hint = f" (set by {origin})" if origin else ""
            more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
            # A whole block (a model-level rule) is not echoed: the message says what is wrong.
            got = "" if err["type"] == "missing" or isinstance(err["input"], dict | list) \
                else f"; got {REDACTED}" if is_secret_key(path) \
                else f"; got {redact(err['input'])!r}"
            raise ConfigError(f"{err['msg']}{got}{hint}{more}", file=self.file, key=path,
                              line=self._lines.get(path)) from None

    @property
    def model(self) -> Any:
        """The validated, typed config (the project's `EngineConfig` subclass).

        Raises:
            ConfigError: The config has no model (a bare YAML file).
        """
        if self.typed is None:
            raise ConfigError("this config has no model to validate it", file=self.file)
        return self.typed

    @property
    def frozen(self) -> bool:
        """True once `freeze` was called; `set` then raises."""
        return self._frozen

    def get(self, path: str, default: Any = _MISSING) -> Any:
        """Return the value at a dotted key path (a deep copy for mappings and lists).

        Args:
            path: Dotted key, e.g. ``"tests.fine_tuning.test_settings.gpu"``.
            default: Returned when the key is absent; without it a missing key raises.

        Raises:
            ConfigError: The key does not exist and no default was given.
        """
        value = _lookup(self._data, _split(path))
        if value is _MISSING:
            if default is not _MISSING:
                return default
            parts = _split(path)
            for depth in range(len(parts)):
                node = _lookup(self._data, parts[:depth])
                if not isinstance(node, Mapping) or parts[depth] not in node:
                    hint = _closest(parts[depth], node.keys()) if isinstance(node, Mapping) else ""
                    raise ConfigError(f"no such key ({hint})", file=self.file, key=path)
        return copy.deepcopy(value) if isinstance(value, dict | list) else value

    def set(self, path: str, value: Any) -> None:
        """Set an existing key at run time, revalidating the whole config.

        Raises:
            ConfigError: Called outside the main thread, after `freeze`, on an unknown key,
                or with a value the project's model refuses.
        """
        if threading.current_thread() is not threading.main_thread():
            raise ConfigError("Config.set is only allowed in the flow's main thread",
                              key=path)
        if self._frozen:
            raise ConfigError("Config.set after freeze(): the config is shared by concurrent "
                              "steps and can no longer change", key=path)
        work = copy.deepcopy(self._data)
        resolver = _Resolver(work, self.file, {}, self._model)
        resolver.assign(path, value, "Config.set")
        self.typed = self._validate(work)
        self._data = work
        self.sources[path] = "Config.set"

    def freeze(self) -> Config:
        """Forbid further `set` calls (call before fanning out); returns ``self``."""
        self._frozen = True
        return self

    def as_dict(self, *, redacted: bool = False) -> dict[str, Any]:
        """Return a deep copy of the values, optionally with secrets masked."""
        data = copy.deepcopy(self._data)
        return redact(data) if redacted else data

    def to_yaml(self, *, redacted: bool = True) -> str:
        """Serialise the resolved config as YAML (secrets masked unless asked otherwise)."""
        return dump_yaml(self.as_dict(redacted=redacted), redacted=redacted)

    def save(self, directory: str | Path) -> Path:
        """Write ``config.yaml``, ``presets_applied`` and ``variable_overrides.yaml``.

        Args:
            directory: Target directory, created if missing.

        Returns:
            The path of the written ``config.yaml``.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / "config.yaml"
        write_text(target, self.to_yaml())
        presets = "".join(f"{p}\n" for p in self.presets_applied)
        write_text(directory / "presets_applied", presets)
        write_text(directory / "variable_overrides.yaml", dump_yaml(redact(self.overrides)))
        return target

    def json_schema(self) -> dict[str, Any]:
        """JSON schema of this project's config (empty mapping for a bare YAML file)."""
        return self._model.model_json_schema() if self._model is not None else {}


def resolve(
    base: str | Path,
    presets: Sequence[str] = (),
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    model: type[BaseModel] | None = None,
) -> Config:
    """Resolve a project's configuration once: base → presets → overrides → env → validation.

    Args:
        base: A project name (``"fine_tuning"``) or a path to a YAML file.
        presets: Preset names to apply, in order (later writes win).
        overrides: Dotted key → value, taken as given (the command line parses ``--var``
            text with `parse_override`, once).
        env: Environment to read ``TELLTALE__*`` overrides from (``None``: ``os.environ``).
        model: Validation model; defaults to the project's model (none for a bare file).

    Returns:
        The validated `Config`.

    Raises:
        ConfigError: Any user mistake, naming the file, key path and (when known) line.

    Example:
        >>> cfg = resolve("fine_tuning", presets=["light"], env={})
        >>> cfg.get("tests.fine_tuning.test_settings.gpu")
        0
    """
    project, path = registry.locate(base)
    data, lines = load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("a config file must be a mapping at the top level", file=str(path))
    if isinstance(presets, str):  # a lone name, not a sequence of characters
        presets = [presets]
    if model is None and project is not None:
        model = registry.config_model(project)
    if model is not None:  # the file holds what differs from the model's defaults
        data = _merged(defaults_of(model), data)
    resolver = _Resolver(data, str(path), lines, model)
    for name in presets:
        resolver.apply_preset(name)
    applied_overrides: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        # Values are taken as given: the command line parsed its text once already, and a
        # second parse turned '"run #5 nightly"' into 'run' (a comment) or "8001" into 8001.
        resolver.assign(key, value, f"override {key}")
        applied_overrides[key] = value
    environ = os.environ if env is None else env
    for key, value in _env_overrides(environ).items():
        resolver.assign(key, value, f"environment {ENV_PREFIX}{key.replace('.', '__')}")
        applied_overrides[key] = value
    for key, value in applied_overrides.items():
        _refuse_secret_values(key, value, resolver.sources.get(key, f"override {key}"))
    config = Config(resolver.data, project=project, file=str(path),
                    presets_applied=resolver.presets_applied, overrides=applied_overrides,
                    sources=resolver.sources, model=model, lines=lines)
    config.request = _request(base, presets, overrides or {}, environ)
    config.request_overrides = dict(overrides or {})
    if env is None and project is not None:  # the real environment: the project's own too
        hooks = registry.load(project)
        if hooks.environment is not None:
            hooks.environment()
    return config


def resolve_once(base: str | Path, presets: Sequence[str] = (),
                 overrides: Mapping[str, Any] | None = None) -> Config:
    """The active config (`use_config`) when resolved from this very request, else `resolve`.

    A command line resolves its config once, and the flow it starts in the same process
    takes that one instead of resolving (and validating) it a second time.

    A deployment's run, or a request that differs in anything (presets, overrides, the
    ``TELLTALE__*`` environment), resolves anew.
    """
    if isinstance(presets, str):
        presets = [presets]
    active = _CURRENT.get()
    if active is not None and not active.frozen and active.request == _request(
            base, presets, overrides or {}, os.environ):
        return active
    return resolve(base, presets=presets, overrides=overrides)


def json_schema(project: str) -> dict[str, Any]:
    """Return the JSON schema of a project's config, for editors and docs."""
    model = registry.config_model(project)
    return model.model_json_schema() if model is not None else {}


_CURRENT: contextvars.ContextVar[Config | None] = contextvars.ContextVar(
    "telltale_config", default=None
)


def current_config() -> Config:
    """Return the config set by `use_config` in this context.

    Raises:
        ConfigError: No config is active.
    """
    config = _CURRENT.get()
    if config is None:
        raise ConfigError("no active config: resolve() one and enter use_config(config)")
    return config


@contextmanager
def use_config(config: Config) -> Iterator[Config]:
    """Make ``config`` the active one for `current_config` and templates in this context."""
    token = _CURRENT.set(config)
    try:
        yield config
    finally:
        _CURRENT.reset(token)
