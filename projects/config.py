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
import difflib
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from core.errors import ConfigError, did_you_mean
from core.redact import (
    REDACTED,
    REFERENCE_BLOCKS,
    is_secret_key,
    redact,
    register_secret,
    url_password,
)
from core.safeio import write_text
from core.yamlio import LineMap, dump_yaml, load_yaml, load_yaml_text
from projects import registry
from projects.schema import UndeclaredKeyError, defaults_of, level_at

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

ENV_PREFIX = "TELLTALE__"
"""Environment variables ``TELLTALE__a__b__c=value`` override config key ``a.b.c``."""

_MISSING: Any = object()
_PRESETS_KEY = "ci_presets"
_EXTENDS = "extends"


def _split(path: str) -> list[str]:
    parts = path.split(".")
    if not path or any(not p for p in parts):
        raise ConfigError(f"invalid key path {path!r}")
    return parts


def _closest(word: str, choices: Iterable[str]) -> str:
    names = sorted(str(c) for c in choices)
    close = difflib.get_close_matches(word, names, n=3, cutoff=0.5)
    if close:
        return f"closest: {', '.join(close)}"
    if len(names) <= 12:
        return f"valid keys here: {', '.join(names) or '(none)'}"
    return f"{len(names)} keys exist at this level"


def _lookup(data: Any, parts: Sequence[str]) -> Any:
    node = data
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def parse_override(key: str, text: str) -> Any:
    """Parse one override value as YAML, once (``"[2, 4]"`` → ``[2, 4]``, ``"4"`` → ``4``).

    The text is untrusted (command line, PR comment, environment): aliases and oversized
    text are refused.

    Args:
        key: The dotted key, for error messages.
        text: The raw value as typed.

    Returns:
        The parsed value; an empty string stays an empty string.

    Raises:
        ConfigError: The value is not valid YAML.
    """
    if text == "":
        return ""
    value, _ = load_yaml_text(text, source=f"value of {key}", untrusted=True)
    return value


def load_vars_file(path: str | Path) -> dict[str, Any]:
    """Read a vars file: a YAML mapping of dotted key → value.

    Raises:
        ConfigError: Missing file, malformed YAML, or not a mapping.
    """
    data, _ = load_yaml(path, untrusted=True)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError("a vars file must be a mapping of dotted key: value", file=str(path))
    return {str(k): v for k, v in data.items()}


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sorted(env):
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            key = name[len(ENV_PREFIX) :].replace("__", ".")
            out[key] = parse_override(f"${name}", env[name])
    return out


def _merged(defaults: Any, written: Any) -> Any:
    """``written`` over ``defaults``, mapping by mapping (any other value: ``written`` wins)."""
    if isinstance(defaults, dict) and isinstance(written, Mapping):
        out = dict(defaults)
        for key, value in written.items():
            out[key] = _merged(defaults[key], value) if key in defaults \
                else copy.deepcopy(value)
        return out
    return copy.deepcopy(written)


class _Resolver:
    """Applies sources to a working copy and records who set each key.

    With a model, a key exists when the model declares it (`projects.schema.level_at`);
    without one (a bare YAML file), when the data holds it.
    """

    def __init__(self, data: dict[str, Any], file: str, lines: LineMap,
                 model: type[BaseModel] | None = None) -> None:
        self.data = data
        self.file = file
        self.lines = lines
        self.model = model
        self.sources: dict[str, str] = {}
        self.presets_applied: list[str] = []

    def _unknown(self, parts: Sequence[str], depth: int, keys: Iterable[str], source: str,
                 where: str | None) -> ConfigError:
        parent = ".".join(parts[:depth]) or "the top level"
        if self.model is None:
            why = f"{_closest(parts[depth], keys)}; presets and overrides cannot create keys"
        else:
            keys = list(keys)
            why = _closest(parts[depth], keys) if keys else f"{parent} has no keys below it"
        return ConfigError(f"unknown key (set by {source}): no {parts[depth]!r} under "
                           f"{parent} ({why})", file=self.file, key=where or ".".join(parts),
                           line=self.lines.get(where or ""))

    def _declared(self, parts: Sequence[str], depth: int, source: str,
                  where: str | None) -> bool:
        """Whether the model declares ``parts[:depth + 1]`` with keys below it.

        Raises:
            ConfigError: The model declares no such key (or there is no model).
        """
        if self.model is None:
            return False
        try:
            level = level_at(self.model, parts[:depth + 1])
        except UndeclaredKeyError as exc:
            raise self._unknown(parts, exc.depth, exc.level.keys, source, where) from None
        return not level.is_leaf

    def assign(self, path: str, value: Any, source: str, *, where: str | None = None) -> None:
        parts = _split(path)
        node: Any = self.data
        for depth, part in enumerate(parts):
            if not isinstance(node, dict):
                parent = ".".join(parts[:depth])
                raise ConfigError(
                    f"cannot set {path!r} from {source}: {parent!r} is a "
                    f"{type(node).__name__}, not a mapping",
                    file=self.file,
                    key=where or path,
                    line=self.lines.get(where or ""),
                )
            last = depth == len(parts) - 1
            if part not in node:
                branch = self._declared(parts, depth, source, where)
                if self.model is None:
                    raise self._unknown(parts, depth, node.keys(), source, where)
                if not last:
                    if not branch:
                        raise self._unknown(parts, depth + 1, [], source, where)
                    node[part] = {}
            elif not last and node[part] is None and self.model is not None:
                if not self._declared(parts, depth, source, where):
                    raise self._unknown(parts, depth + 1, [], source, where)
                node[part] = {}  # a block that is off (None) gets its first key
            if last:
                node[part] = copy.deepcopy(value)
            else:
                node = node[part]
        self.sources[path] = source

    def presets(self) -> Mapping[str, Any]:
        presets = self.data.get(_PRESETS_KEY) or {}
        if not isinstance(presets, Mapping):
            raise ConfigError("must be a mapping of preset name → settings", file=self.file,
                              key=_PRESETS_KEY, line=self.lines.get(_PRESETS_KEY))
        return presets

    def apply_preset(self, name: str, stack: tuple[str, ...] = ()) -> None:
        presets = self.presets()
        if name in stack:
            cycle = " -> ".join((*stack[stack.index(name) :], name))
            raise ConfigError(f"preset cycle: {cycle}", file=self.file,
                              key=f"{_PRESETS_KEY}.{stack[-1]}.{_EXTENDS}",
                              line=self.lines.get(f"{_PRESETS_KEY}.{stack[-1]}.{_EXTENDS}"))
        if name not in presets:
            via = f" (extended by {stack[-1]!r})" if stack else ""
            available = ", ".join(sorted(presets)) or "(none)"
            raise ConfigError(f"unknown preset {name!r}{via}{did_you_mean(name, presets)}; "
                              f"available presets: {available}", file=self.file)
        body = presets[name] or {}
        base = f"{_PRESETS_KEY}.{name}"
        if not isinstance(body, Mapping):
            raise ConfigError("a preset must be a mapping of dotted key: value", file=self.file,
                              key=base, line=self.lines.get(base))
        # Child first, then its parents: the order the field records (and its run metadata).
        self.presets_applied.append(name)
        for key, value in body.items():
            if key == _EXTENDS:
                parents = [value] if isinstance(value, str) else value
                if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
                    raise ConfigError("extends must be a preset name or a list of names",
                                      file=self.file, key=f"{base}.{_EXTENDS}",
                                      line=self.lines.get(f"{base}.{_EXTENDS}"))
                for parent in parents:
                    self.apply_preset(parent, (*stack, name))
                continue
            self.assign(str(key), value, f"preset {name!r}", where=f"{base}.{key}")


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


def _data_path(data: Any, loc: Sequence[Any]) -> str:
    """Keep the parts of a pydantic error location that are real keys (not union tags)."""
    parts: list[str] = []
    node = data
    for part in loc:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(node, Mapping) and not parts[-1:] == [str(part)]:
            parts.append(str(part))  # a missing required key: still part of the path
            break
        else:
            continue
        parts.append(str(part))
    return ".".join(parts)


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
    if env is None and project is not None:  # the real environment: the project's own too
        hooks = registry.load(project)
        if hooks.environment is not None:
            hooks.environment()
    return config


USED_WHEN_DISABLED = "used_when_disabled"
"""A field's ``json_schema_extra`` flag: other paths read it even when its block's
``enabled`` is false (the export's S3 block is the run's S3 identity), so setting it there
is not refused."""


def _disabled_blocks(model: BaseModel, path: str = "") -> list[str]:
    """Dotted paths of every block of ``model`` that has ``enabled: false``.

    A field flagged `USED_WHEN_DISABLED` is left out: its subtree is given as a path of its
    own prefixed with ``!`` (an exception the caller skips).
    """
    out: list[str] = []
    fields = type(model).model_fields
    if "enabled" in fields and model.enabled is False:  # type: ignore[attr-defined]
        out.append(path)
        out += [f"!{'.'.join(p for p in (path, name) if p)}" for name, info in fields.items()
                if isinstance(info.json_schema_extra, dict)
                and info.json_schema_extra.get(USED_WHEN_DISABLED)]
    for name in fields:
        value = getattr(model, name)
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for key, item in items:
            if isinstance(item, BaseModel):
                sub = ".".join(p for p in (path, name, key) if p)
                out += _disabled_blocks(item, sub)
    return out


def _refuse_settings_of_disabled_features(model: BaseModel, sources: Mapping[str, str],
                                          file: str, lines: LineMap) -> None:
    """Refuse a key set under a disabled feature, naming the feature's ``enabled``.

    Set by a preset, an override or the environment, it would do nothing; it is never
    ignored silently.

    The project's own ``config.yaml`` may hold values of a disabled feature (ready for a
    preset that enables it); what a caller *sets* there is refused. Decision: refused, not
    enabled implicitly — turning on a MachineSet or a lease is a choice to write down.

    Raises:
        ConfigError: Naming the key, who set it and the ``enabled`` key to set.
    """
    blocks = _disabled_blocks(model)
    exempt = [b[1:] for b in blocks if b.startswith("!")]
    disabled = [b for b in blocks if not b.startswith("!")]
    for key, source in sources.items():
        if any(key == field or key.startswith(field + ".") for field in exempt):
            continue
        for block in disabled:
            if block and key.startswith(block + ".") and key != f"{block}.enabled":
                del lines  # the base file's lines: this key was set elsewhere (the source)
                raise ConfigError(f"set by {source} while {block}.enabled is false, so it "
                                  f"would do nothing: set {block}.enabled: true to use it",
                                  file=file, key=key)


def _request(base: str | Path, presets: Sequence[str], overrides: Mapping[str, Any],
             environ: Mapping[str, str]) -> str:
    """What a resolution was asked for, as comparable text (base, presets, overrides, env)."""
    import json

    env = {k: v for k, v in environ.items() if k.startswith(ENV_PREFIX)}
    return json.dumps([str(base), list(presets), dict(overrides), env], sort_keys=True,
                      default=repr)


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


def _refuse_secret_values(key: str, value: Any, source: str) -> None:
    """Refuse a credential given as an override.

    It would reach the run's parameters (the Prefect database), the saved overrides and
    every document built from them.

    Keys of the top-level ``secrets`` block hold references (file and block names) and may
    be set.

    Raises:
        ConfigError: A secret-named key (``hf_token``, ``api_key``, ``password``...) at any
            depth of the override, or a credential by shape (`core.redact.url_secrets`)
            in a value; the value is not shown.
    """
    if key.split(".", 1)[0] in REFERENCE_BLOCKS:
        return
    stack: list[tuple[str, Any]] = [(key, value)]
    while stack:
        path, item = stack.pop()
        if is_secret_key(path):
            raise ConfigError(f"{path.rsplit('.', 1)[-1]!r} names a secret ({source}): "
                              "put the value in a file of the secret dir or a Prefect Secret "
                              "block, and its name in the secrets block", key=path)
        if isinstance(item, Mapping):
            stack += [(f"{path}.{k}", v) for k, v in item.items()]
        elif isinstance(item, list):
            stack += [(path, v) for v in item]
        elif isinstance(item, str) and (password := url_password(item)) is not None:
            register_secret(password)  # masked if it got out
            raise ConfigError(f"a credential inside a value ({source}: a URL's user info, a "
                              "token query parameter or a Bearer value): a credential never "
                              "comes as an override; give it in the secret dir (S3: "
                              "secrets.s3_credentials) and the value without it", key=path)


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
