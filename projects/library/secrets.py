"""The ``secrets`` block: *where* secrets are, never the secrets themselves."""

from __future__ import annotations

from pydantic import Field

from core.strict import StrictSettings

__all__ = ["SecretDirBlock", "SecretsBlock"]


class SecretDirBlock(StrictSettings):
    """The secret directory, found through an environment variable."""

    env_key: str = Field(default="TELLTALE_SECRET_DIR",
                         description="Environment variable holding the secret dir path.")


class SecretsBlock(StrictSettings):
    """File names inside the secret dir; their contents never reach config, logs or exports."""

    dir: SecretDirBlock = Field(default_factory=SecretDirBlock)
    # Each file is read only by the step that needs it (a QUADS lease, an export...): a name
    # whose file is absent costs nothing until then, and that step's error names the key.
    s3_credentials: str | None = Field(default="s3.env", description="AWS-style env file name.")
    opensearch_instances: str | None = Field(default="opensearch.yaml",
                                             description="OpenSearch YAML file.")
    horreum_instances: str | None = Field(default="horreum.yaml", description="Horreum YAML "
                                          "file ({name: {url, api_key}}).")
    quads_credentials: str | None = Field(default="quads.yaml",
                                          description="QUADS login YAML file.")
    pull_secret: str | None = Field(default="pull-secret.json",
                                    description="Registry pull secret (JSON).")
    ssh_public_key: str | None = Field(default="id_ed25519.pub",
                                       description="SSH key for cluster nodes.")
    prometheus_token: str | None = Field(default=None, description="Bearer token (a service "
                                         "account's) for observe.prometheus.url.")
