"""The ``secrets`` block: *where* secrets are, never the secrets themselves."""

from __future__ import annotations

from pydantic import Field

from core.strict import StrictSettings

__all__ = ["SecretDirBlock", "SecretsBlock"]


class SecretDirBlock(StrictSettings):
    """The secret directory, found through an environment variable."""

    env_key: str = Field(description="Environment variable holding the secret dir path.")


class SecretsBlock(StrictSettings):
    """File names inside the secret dir; their contents never reach config, logs or exports."""

    dir: SecretDirBlock
    s3_credentials: str | None = Field(default=None, description="AWS-style env file name.")
    opensearch_instances: str | None = Field(default=None, description="OpenSearch YAML file.")
    horreum_instances: str | None = Field(default=None, description="Horreum YAML file "
                                          "({name: {url, api_key}}).")
    quads_credentials: str | None = Field(default=None, description="QUADS login YAML file.")
    pull_secret: str | None = Field(default=None, description="Registry pull secret (JSON).")
    ssh_public_key: str | None = Field(default=None, description="SSH key for cluster nodes.")
    prometheus_token: str | None = Field(default=None, description="Bearer token (a service "
                                         "account's) for observe.prometheus.url.")
