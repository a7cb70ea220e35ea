"""The ground floor: what every other floor uses and nothing else.

Errors (`core.errors`), the bounded reader and atomic writer (`core.safeio`), YAML
(`core.yamlio`), strict config types (`core.strict`), secret masking (`core.redact`), the
``TELLTALE_*`` environment settings (`core.environment`), the safe printer
(`core.terminal`), path rules (`core.paths`) and progress lines (`core.progress`).
These modules import only each other and third-party libraries: no Prefect, no service
client, nothing from `analysis`, `projects`, `tasks` or `flows` (import-linter checks it).
"""
