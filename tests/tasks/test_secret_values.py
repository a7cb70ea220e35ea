"""Secrets are redacted by value, not only by key name, and never echoed by an error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.errors import ConfigError
from core.redact import redact
from projects.library import ExportBlock, SecretsBlock
from tasks.artifacts import step, use_artifact_dir
from tasks.publish.export import opensearch_instance

SECRETS = SecretsBlock.model_validate({"dir": {"env_key": "TELLTALE_SECRET_DIR"},
                                       "opensearch_instances": "opensearch.yaml"})
EXPORT = ExportBlock.model_validate({"opensearch": {"enabled": True, "instance": "os"}})


@pytest.fixture()
def secret_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TELLTALE_SECRET_DIR", str(tmp_path))
    return tmp_path


def test_a_numeric_password_is_accepted_and_never_shown(secret_dir: Path) -> None:
    (secret_dir / "opensearch.yaml").write_text(yaml.safe_dump({"os": {
        "url": "https://search.example", "user": "cpt", "password": 4815162342}}))
    instance = opensearch_instance(EXPORT, SECRETS)
    assert instance.password is not None
    assert instance.password.get_secret_value() == "4815162342"
    assert "4815162342" not in repr(instance)


def test_an_invalid_secret_file_names_the_field_not_the_values(secret_dir: Path) -> None:
    (secret_dir / "opensearch.yaml").write_text(yaml.safe_dump({"os": {
        "url": "https://search.example", "user": ["not", "a", "string"],
        "password": "hunter2-not-shown"}}))
    with pytest.raises(ConfigError) as info:
        opensearch_instance(EXPORT, SECRETS)
    assert "user" in str(info.value) and "hunter2-not-shown" not in str(info.value)


def test_a_password_inside_a_url_is_masked_wherever_it_is(tmp_path: Path) -> None:
    assert redact({"endpoint_url": "https://bob:hunter2@s3.example.com/b",
                   "note": "see postgresql://svc:pa55@db:5432/x now",
                   "plain": "https://s3.example.com/b"}) == {
        "endpoint_url": "https://bob:***@s3.example.com/b",
        "note": "see postgresql://svc:***@db:5432/x now",
        "plain": "https://s3.example.com/b"}

    @step("test", prefect=False)
    def connect(endpoint: str) -> None:
        del endpoint

    with use_artifact_dir(tmp_path):
        connect("https://bob:hunter2@s3.example.com")
    parameters = next(tmp_path.glob("*__test__connect/parameters.yaml")).read_text()
    assert "hunter2" not in parameters and "bob:***@" in parameters


def test_a_secret_key_in_config_validation_errors_is_not_echoed(tmp_path: Path) -> None:
    from projects.config import resolve

    base = tmp_path / "c.yaml"
    base.write_text("password: null\n")

    from pydantic import BaseModel

    class WithPassword(BaseModel):
        password: int | None = None

    with pytest.raises(ConfigError) as info:
        resolve(base, overrides={"password": "letmein-not-shown"}, env={}, model=WithPassword)
    # refused before validation: a credential never comes as an override
    assert "letmein-not-shown" not in str(info.value) and "names a secret" in str(info.value)
