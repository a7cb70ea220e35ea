"""The deployment form shows each parameter's description as rendered text."""

from __future__ import annotations

import re

import pytest
from prefect.utilities.callables import parameter_schema

from flows.cleanup import janitor, quads_janitor
from flows.fine_tuning.flow import fine_tuning
from flows.replot import replot

_TAG = re.compile(r"<[A-Za-z][^>]*>")  # what the UI's markdown takes for HTML and drops


@pytest.mark.parametrize("flow", [fine_tuning, janitor, quads_janitor, replot],
                         ids=lambda f: f.name)
def test_parameter_descriptions_survive_the_form(flow: object) -> None:
    schema = parameter_schema(flow.fn)  # type: ignore[attr-defined]
    for name, prop in schema.properties.items():
        description = prop.get("description") or ""
        assert not _TAG.search(description), f"{flow.name}.{name}: {description!r}"  # type: ignore[attr-defined]
    assert schema.properties  # the form has fields at all
