"""The strict base of every config model, and the value types untrusted input is held to.

Every config block (the engine's and each project's) derives from `StrictSettings`:

- **strict types**: ``r: true`` is not the integer 1, ``num_train_epochs: 2.5`` is not an
  integer, ``enabled: 1`` is not a bool, ``"8"`` is not a number (YAML already gives numbers
  as numbers, so nothing legitimate is lost);
- **finite numbers**: ``.inf``, ``.nan`` and ``1e400`` (which YAML reads as ``inf``) are
  refused everywhere;
- **no unknown keys** (``extra="forbid"``).

Every numeric field also declares both bounds (``tests/projects/test_strict_models.py``
walks every config model and fails on a number without a lower and an upper bound).

Value types with a meaning beyond their Python type:

- `Name`: a name, never a path: segments of ``[A-Za-z0-9._-]`` starting with a letter or
  digit, joined by ``/`` (``ibm-granite/granite-3b``); no absolute path, no ``..``;
- `ImageRef`: a container image reference; an untrusted source may set it only to an image of
  a registry the project allows (``pr_comment.image_registries``), see `projects.untrusted`;
- `Text`: one line of free text (at most 128 characters, no control characters);
- `DnsLabel`: a Kubernetes namespace or object name (RFC 1123 label, at most 63 characters);
- `DnsSubdomain`: a Kubernetes object name of the kinds that take one (a PVC, a
  StorageClass, a ConfigMap: RFC 1123 subdomain, at most 253 characters);
- `Quantity`: a Kubernetes resource quantity (``200Gi``, ``500m``, ``1.5``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints

__all__ = [
    "IMAGE",
    "DnsLabel",
    "DnsSubdomain",
    "ImageRef",
    "Name",
    "Quantity",
    "StrictSettings",
    "Text",
    "image_registry",
]


class StrictSettings(BaseModel):
    """Base of config models: strict types, finite numbers, unknown keys refused."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False,
                              validate_default=True)


class _Kind:
    """A marker in a field's ``Annotated`` metadata that `projects.untrusted` looks for."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


IMAGE = _Kind("image")
"""Marks a container image reference."""

_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
Name = Annotated[str, StringConstraints(
    pattern=rf"^{_SEGMENT}(/{_SEGMENT})*$", max_length=255)]
"""A name (``alpaca_mini.jsonl``, ``ibm-granite/granite-3b``), never an absolute path or
``..``; where a name becomes a file, the workload also resolves it inside its data dir."""

ImageRef = Annotated[str, StringConstraints(
    pattern=r"^[a-z0-9][a-z0-9._-]*(:[0-9]{1,5})?(/[a-z0-9][a-z0-9._-]*)*"
            r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$",
    max_length=512), IMAGE]
"""A container image reference: ``registry[:port]/path[:tag][@sha256:digest]``."""

Text = Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]{1,128}$")]
"""One line of free text (a test name shown in labels): no control characters, bounded."""

DnsLabel = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
"""An RFC 1123 label: what Kubernetes accepts as a namespace (at most 63 characters)."""

DnsSubdomain = Annotated[str, StringConstraints(
    pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    max_length=253)]
"""An RFC 1123 subdomain: the name of a PVC, a StorageClass, a ConfigMap."""

Quantity = Annotated[str, StringConstraints(
    pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$", max_length=32)]
"""A Kubernetes resource quantity (``200Gi``, ``500m``): what a request or a size takes."""


def image_registry(reference: str) -> str:
    """The registry host of an image reference (``docker.io`` when it names none).

    Example:
        >>> image_registry("quay.io/modh/vllm:tag"), image_registry("ubuntu:24.04")
        ('quay.io', 'docker.io')
    """
    first, sep, _ = reference.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first.split(":", 1)[0]
    return "docker.io"


def kinds_of(metadata: Any) -> set[str]:
    """The `_Kind` markers in an ``Annotated`` metadata list."""
    return {m.name for m in metadata if isinstance(m, _Kind)}
