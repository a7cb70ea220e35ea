"""Horreum instance block: where each run's LTS document is uploaded as a Horreum run."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, model_validator

from blocks.secret import SecretText

__all__ = ["HorreumInstance"]


class HorreumInstance(Block):
    """A Horreum server and the credential Telltale uploads with.

    Horreum takes an API key (``HUSR_...``, sent as ``X-Horreum-API-Key``; made in its UI
    under *Profile → API keys*) or a Keycloak bearer token. An API key is the one to use
    from CI: it does not expire within a night.

    Example:
        ```python
        from blocks.horreum import HorreumInstance
        instance = HorreumInstance(url="https://horreum.example.com", api_key="HUSR_...")
        with HorreumClient(instance) as horreum:  # tasks.publish.horreum
            horreum.test_id("telltale-fine-tuning")
        ```
    """

    _block_type_name = "Telltale Horreum Instance"
    _description = "Horreum URL and API key (or bearer token) for Telltale's run uploads."

    url: str = Field(description="Base URL, e.g. https://horreum.example.com (no /api).")
    api_key: SecretText | None = Field(default=None, description="A Horreum API key (HUSR_...).")
    token: SecretText | None = Field(default=None, description="A Keycloak bearer token, "
                                     "where no API key is available.")
    verify_certs: bool = Field(default=True, description="Verify the server's TLS certificate.")
    ca_bundle: str | None = Field(default=None, description="CA bundle file for TLS.")
    timeout_s: float = Field(default=30.0, gt=0, description="Per-request timeout.")

    @model_validator(mode="after")
    def _one_credential(self) -> HorreumInstance:
        if self.api_key is None and self.token is None:
            raise ValueError("a Horreum upload needs api_key (or token)")
        return self

    def __repr__(self) -> str:  # never show the credential
        return f"HorreumInstance(url={self.url!r})"

    def headers(self) -> dict[str, str]:
        """The authentication header: the API key when there is one, else the bearer token."""
        if self.api_key is not None:
            return {"X-Horreum-API-Key": self.api_key.get_secret_value()}
        assert self.token is not None  # the validator said one of them is set
        return {"Authorization": f"Bearer {self.token.get_secret_value()}"}
