"""A setting of a feature that is off would do nothing: it is refused, naming ``enabled``."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from core.errors import ConfigError
from core.yamlio import LineMap

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
