"""QUADS credentials block: where the scale lab's QUADS API is and who we are there."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field

from blocks.secret import SecretText

__all__ = ["QuadsCredentials"]


class QuadsCredentials(Block):
    """A QUADS API endpoint and a user's credentials.

    Example:
        ```python
        from blocks.quads import QuadsCredentials
        creds = QuadsCredentials(url="https://quads.example.com/api/v3",
                                 email="perf@example.com", password="...")
        with QuadsClient.from_credentials(creds) as quads:  # tasks.lab.quads
            quads.available(start, end, {"model": "R650"})
        ```
    """

    _block_type_name = "Telltale QUADS Credentials"
    _description = "QUADS API URL and self-scheduling user for bare-metal leases."

    url: str = Field(description="API base URL, ending in /api/v3.")
    email: str = Field(description="User e-mail (its local part is the assignment owner).")
    password: SecretText = Field(description="User password.")
    verify_tls: bool = Field(default=True, description="Verify the server's TLS certificate.")
    timeout_s: float = Field(default=30.0, gt=0, description="Per-request timeout.")

    def __repr__(self) -> str:  # never show the password
        return f"QuadsCredentials(url={self.url!r}, email={self.email!r})"
