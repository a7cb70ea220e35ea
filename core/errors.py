"""Telltale's error tree, rooted in the lowest layer so every layer can raise and catch it.

```
TelltaleError                      any error Telltale raises on purpose
├── UserError (ValueError)         the user's input is wrong: fix it and run again (CLI exit 2)
│   ├── ConfigError                config file, preset, override, template (file, key path, hint)
│   └── ResultsError               a results dir or history URI that cannot be used
├── ParseError                     one artifact file could not be parsed (file, line)
├── ServiceError                   an external service failed (service, status)
│   ├── TransientServiceError      worth retrying: 5xx, throttling, connection reset, timeout
│   └── PermanentServiceError      retrying cannot help: 4xx, bad payload, auth refused
└── StepError                      a workflow step failed (command, workload, wait deadline)
```

Prefect retries look at the *type* (`is_transient`), never at message text.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "TelltaleError",
    "UserError",
    "ConfigError",
    "ResultsError",
    "ParseError",
    "ServiceError",
    "TransientServiceError",
    "PermanentServiceError",
    "StepError",
    "did_you_mean",
    "is_transient",
]


class TelltaleError(Exception):
    """Root of every error Telltale raises on purpose."""


class UserError(TelltaleError, ValueError):
    """The user's input is wrong; the message says what and where."""


class ConfigError(UserError):
    """A config file, preset, override or template is invalid.

    Attributes:
        file: The file at fault, when known.
        key: The dotted key path at fault, when known.
        line: The 1-based line in ``file``, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        line: int | None = None,
    ) -> None:
        self.file = file
        self.key = key
        self.line = line
        self.reason = message
        where = ""
        if file:
            where = f"{file}:{line}: " if line else f"{file}: "
        if key:
            where += f"{key}: "
        super().__init__(f"{where}{message}")


class ResultsError(UserError):
    """A results directory or history location cannot be used."""


class ParseError(TelltaleError):
    """An artifact file could not be parsed.

    Attributes:
        file: The file that failed.
        line: The 1-based line, when known.
    """

    def __init__(self, message: str, *, file: str, line: int | None = None) -> None:
        self.file = file
        self.line = line
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {message}")


class ServiceError(TelltaleError):
    """An external service (S3, OpenSearch, Kubernetes, QUADS) failed.

    Attributes:
        service: Short service name, e.g. ``"s3"``.
        status: HTTP status code when there was a response, else ``None``.
        detail: The message without the service prefix.
    """

    def __init__(self, message: str, *, service: str, status: int | None = None) -> None:
        self.service = service
        self.status = status
        code = f" (HTTP {status})" if status is not None else ""
        # a message that already carries a service prefix (an error wrapped in another)
        # is not prefixed twice: "quads (HTTP 400): quads (HTTP 400): ..." said nothing more
        while True:
            head, sep, rest = message.partition(": ")
            if sep and head.split(" (HTTP ", 1)[0] == service:
                message = rest
            else:
                break
        self.detail = message
        super().__init__(f"{service}{code}: {message}")


class TransientServiceError(ServiceError):
    """A fault worth retrying: 5xx, throttling, connection error, timeout."""


class PermanentServiceError(ServiceError):
    """A fault retrying cannot fix: 4xx, invalid request, refused credentials."""


class StepError(TelltaleError):
    """A workflow step failed: a command, a workload, or a wait that hit its deadline."""


def is_transient(exc: BaseException) -> bool:
    """Tell whether ``exc`` (or an exception it was raised from) is worth retrying.

    Args:
        exc: The exception raised by an attempt.

    Returns:
        True for `TransientServiceError`, connection errors and timeouts anywhere in the chain.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TransientServiceError | ConnectionError | TimeoutError):
            return True
        if isinstance(current, TelltaleError):
            return False
        current = current.__cause__
    return False


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean: a, b?)`` for the close matches of a misspelt name, else ``""``."""
    close = difflib.get_close_matches(word, sorted(str(c) for c in choices), n=3, cutoff=0.5)
    return f" (did you mean: {', '.join(close)}?)" if close else ""
