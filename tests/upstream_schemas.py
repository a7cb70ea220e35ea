"""Validate manifests as the API server would: built-in kinds with the Kubernetes OpenAPI
(kubernetes-validate, strict), custom kinds with their real upstream CRDs and OpenShift's
OpenAPI (found through `tests.schema_store`: pinned by sha256, never copied into the
repository; a test that needs one is skipped with one stated reason when they are absent).

The API server prunes fields a structural schema does not declare, so here an undeclared
field is an error: every object schema with ``properties`` and neither
``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields`` is closed.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import jsonschema
import kubernetes_validate

from core.yamlio import load_documents
from tests import schema_store

OPENSHIFT_OPENAPI = "crds/upstream/openshift/openapi.json"
KUBERNETES_VERSION = "1.30"

# OpenShift kinds served by the platform's OpenAPI (not CRDs): apiVersion/kind -> definition
OPENSHIFT_DEFINITIONS = {
    ("build.openshift.io/v1", "BuildConfig"): "com.github.openshift.api.build.v1.BuildConfig",
    ("build.openshift.io/v1", "Build"): "com.github.openshift.api.build.v1.Build",
    ("image.openshift.io/v1", "ImageStream"): "com.github.openshift.api.image.v1.ImageStream",
    ("image.openshift.io/v1", "ImageStreamTag"):
        "com.github.openshift.api.image.v1.ImageStreamTag",
}


def _closed(schema: Any) -> Any:
    """The schema with every declared object closed to undeclared fields (as pruning)."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the closed openAPIV3Schema of every served version."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for pin in schema_store.pinned():
        if not (pin.path.startswith("crds/") and pin.path.endswith(".yaml")):
            continue
        path = schema_store.require(pin.path)
        for crd in load_documents(path.read_text(encoding="utf-8")):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = (version.get("schema") or {}).get("openAPIV3Schema")
                if schema and version.get("served", True):
                    out[(f"{group}/{version['name']}", kind)] = _closed(schema)
    return out


@functools.cache
def _openshift() -> dict[str, Any]:
    doc = json.loads(schema_store.require(OPENSHIFT_OPENAPI).read_text(encoding="utf-8"))
    return {"definitions": _closed(doc.get("definitions") or doc["components"]["schemas"])}


def _openshift_schema(definition: str) -> dict[str, Any]:
    root = copy.copy(_openshift())
    root["$ref"] = f"#/definitions/{definition}"
    return root


def validate(manifest: dict[str, Any]) -> None:
    """Raise a ValidationError naming the path of the first problem in ``manifest``.

    Raises:
        jsonschema.ValidationError: A custom kind breaks its CRD or OpenShift's OpenAPI.
        kubernetes_validate.ValidationError: A built-in kind breaks the Kubernetes schema.
        LookupError: No schema is known for the kind.
    """
    key = (manifest.get("apiVersion", ""), manifest.get("kind", ""))
    if key in OPENSHIFT_DEFINITIONS:
        jsonschema.Draft7Validator(_openshift_schema(OPENSHIFT_DEFINITIONS[key])).validate(
            manifest)
        return
    schema = crd_schemas().get(key)
    if schema is not None:
        jsonschema.Draft7Validator(schema).validate(manifest)
        _validate_metadata(manifest)
        return
    if "/" not in key[0] or key[0].split("/")[0].endswith(".k8s.io") or \
            key[0].split("/")[0] in ("apps", "batch", "policy", "autoscaling"):
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        return
    raise LookupError(f"no upstream schema for {key[0]}/{key[1]}")


def _validate_metadata(manifest: dict[str, Any]) -> None:
    """ObjectMeta of a custom resource, by the built-in schema (a ConfigMap's, strictly)."""
    probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": manifest.get("metadata", {})}
    kubernetes_validate.validate(probe, KUBERNETES_VERSION, strict=True)
