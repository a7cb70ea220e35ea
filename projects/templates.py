"""Step arguments from ``command_args.yaml.j2``, rendered over the resolved config.

The template is Jinja2 with ``StrictUndefined`` (a missing value is an error, never an empty
string) and three helpers:

- ``{{ value | or_env("NAME") }}``: ``value`` when set (not null/empty), else ``$NAME``; an error
  when neither is set.
- ``{{ raise_exception("message") }}``: stop rendering with a clear error (also a filter).
- ``{{ "message" | log_warning }}``: log a warning while rendering; renders as nothing.

Entries are keyed ``[prefix/]group command[/suffix]`` and hold the keyword arguments of one
step. `from_config` picks an entry, merges ``extra`` over it (``extra`` wins), refuses a value
left at ``SET_AT_RUNTIME``, and validates the result against the step's signature.
"""

from __future__ import annotations

import inspect
import logging
import os
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import jinja2
from pydantic import ConfigDict, ValidationError, create_model

from analysis.errors import ConfigError
from analysis.yamlio import load_yaml_text
from projects.config import Config, current_config
from projects.registry import project_dir

__all__ = ["SET_AT_RUNTIME", "TEMPLATE_NAME", "from_config", "render_command_args", "step_key"]

SET_AT_RUNTIME = "SET_AT_RUNTIME"
TEMPLATE_NAME = "command_args.yaml.j2"

logger = logging.getLogger("telltale.templates")


class _TemplateAbort(Exception):
    """Raised by ``raise_exception`` inside a template."""


# pass_context marks the helpers as impure: Jinja then never evaluates them at compile time
# (it folds filters over constants even with optimized=False), so a warning or an error
# inside a branch that is not taken stays silent, and or_env reads the environment at render.
@jinja2.pass_context
def _or_env(context: Any, value: Any, env_name: str) -> Any:
    if value not in (None, ""):
        return value
    if env_name in os.environ:
        return os.environ[env_name]
    raise _TemplateAbort(f"value is not set and ${env_name} is not in the environment")


@jinja2.pass_context
def _raise_exception(context: Any, message: str) -> typing.NoReturn:
    raise _TemplateAbort(str(message))


@jinja2.pass_context
def _log_warning(context: Any, message: str) -> str:
    logger.warning("%s", message)
    return ""


def _environment(search_dir: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(search_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # renders YAML, never HTML
    )
    env.filters.update(or_env=_or_env, raise_exception=_raise_exception, log_warning=_log_warning)
    env.globals.update(raise_exception=_raise_exception, log_warning=_log_warning)
    return env


def _template_line(tb: TracebackType | None, filename: str) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def render_command_args(config: Config, template: str | Path | None = None) -> dict[str, Any]:
    """Render a project's command-args template over ``config`` and parse it.

    Args:
        config: The resolved config (values, not secrets, are visible to the template).
        template: Template path; defaults to the project's ``command_args.yaml.j2``.

    Returns:
        Entry key → mapping of arguments.

    Raises:
        ConfigError: Syntax error, undefined value, ``raise_exception``, or a result that is
            not a mapping of mappings; with the template file and line.
    """
    if template is None:
        if config.project is None:
            raise ConfigError("no command-args template: the config has no project")
        template = project_dir(config.project) / TEMPLATE_NAME
    path = Path(template).resolve()
    if not path.is_file():
        raise ConfigError("template not found", file=str(path))
    env = _environment(path.parent)
    try:
        text = env.get_template(path.name).render(**config.as_dict())
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"template syntax error: {exc.message}", file=str(path),
                          line=exc.lineno) from None
    except jinja2.UndefinedError as exc:
        line = _template_line(exc.__traceback__, str(path))
        raise ConfigError(f"undefined value in template: {exc.message}", file=str(path),
                          line=line) from None
    except _TemplateAbort as exc:
        line = _template_line(exc.__traceback__, str(path))
        raise ConfigError(str(exc), file=str(path), line=line) from None
    data, _ = load_yaml_text(text, source=f"{path} (rendered)")
    if data is None:
        return {}
    if not isinstance(data, Mapping) or not all(
        isinstance(v, Mapping) or v is None for v in data.values()
    ):
        raise ConfigError("the rendered template must map 'group command' keys to argument "
                          "mappings", file=str(path))
    return {str(k): dict(v or {}) for k, v in data.items()}


def step_key(step: Callable[..., Any], prefix: str | None = None,
             suffix: str | None = None) -> str:
    """Return the template key of a step: ``[prefix/]group command[/suffix]``.

    The group is the step's ``telltale_group`` attribute (set by ``tasks.artifacts.step``) or
    its module's last name; the command is the function name.
    """
    fn = _unwrap(step)
    group = getattr(step, "telltale_group", None) or getattr(fn, "telltale_group", None)
    group = group or fn.__module__.rsplit(".", 1)[-1]
    key = f"{group} {fn.__name__}"
    if prefix:
        key = f"{prefix}/{key}"
    if suffix:
        key = f"{key}/{suffix}"
    return key


def _unwrap(step: Callable[..., Any]) -> Callable[..., Any]:
    fn = getattr(step, "fn", step)  # a Prefect Task keeps the function in .fn
    return inspect.unwrap(fn)


def _find_leftover(value: Any, path: str) -> str | None:
    if value == SET_AT_RUNTIME:
        return path
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _find_leftover(item, f"{path}.{key}")
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _find_leftover(item, f"{path}[{index}]")
            if found:
                return found
    return None


def from_config(
    step: Callable[..., Any],
    prefix: str | None = None,
    suffix: str | None = None,
    extra: Mapping[str, Any] | None = None,
    *,
    config: Config | None = None,
    template: str | Path | None = None,
) -> dict[str, Any]:
    """Build a step's keyword arguments from the command-args template.

    Args:
        step: The step function or Prefect task.
        prefix: Optional key prefix (``sutest/cluster set_scale``).
        suffix: Optional key suffix (``cluster set_scale/gpu``).
        extra: Values merged over the template's (extra wins).
        config: The config to render over; defaults to `current_config`.
        template: Template path; defaults to the project's ``command_args.yaml.j2``.

    Returns:
        Validated keyword arguments, ready for ``step(**kwargs)``.

    Raises:
        ConfigError: Missing entry, leftover ``SET_AT_RUNTIME``, unknown argument, or a value
            the step's type hints refuse.
    """
    config = config or current_config()
    key = step_key(step, prefix, suffix)
    if template is None and config.project is not None:
        template = project_dir(config.project) / TEMPLATE_NAME
    entries = render_command_args(config, template)
    template = str(template) if template is not None else None
    if key not in entries:
        import difflib

        close = difflib.get_close_matches(key, list(entries), n=3, cutoff=0.5)
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise ConfigError(f"no entry {key!r}{hint}", file=template)
    args = {**entries[key], **dict(extra or {})}
    leftover = _find_leftover(args, key)
    if leftover:
        raise ConfigError(f"{leftover} is still {SET_AT_RUNTIME}: pass it in extra=",
                          file=template, key=key)
    return _validate_against(step, args, key, template)


def _validate_against(step: Callable[..., Any], args: dict[str, Any], key: str,
                      template: str | None) -> dict[str, Any]:
    fn = _unwrap(step)
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to "any"
        hints = {}
    fields: dict[str, Any] = {}
    for name, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        default = ... if param.default is param.empty else param.default
        fields[name] = (hints.get(name, Any), default)
    model = create_model(  # type: ignore[call-overload]
        f"Args_{fn.__name__}", __config__=ConfigDict(extra="forbid",
                                                     arbitrary_types_allowed=True), **fields
    )
    try:
        validated = model.model_validate(args)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        raise ConfigError(f"argument {where} of {fn.__name__}(): {err['msg']}", file=template,
                          key=key) from None
    return {name: getattr(validated, name) for name in model.model_fields if name in args or
            fields[name][1] is not ...}
