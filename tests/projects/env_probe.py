"""A process target for `test_vllm_server`: importable by name, as a fork server's child needs."""

from __future__ import annotations

import os
from pathlib import Path


def write_env(path: str, name: str) -> None:
    """Write this process's ``name`` variable (``-`` when unset) into ``path``."""
    Path(path).write_text(os.environ.get(name, "-"))


def write_tempdir(path: str) -> None:
    """Write the temporary dir this process's `tempfile` uses into ``path``."""
    import tempfile

    Path(path).write_text(tempfile.gettempdir())


def write_vllm_title(path: str, *, cmdline: bool = False) -> None:
    """Title this process as vLLM titles its engine core (``vllm.utils.system_utils.
    set_process_title``: setproctitle, ``VLLM::EngineCore``), then write what ``ps`` shows:
    its name (comm), after its command line when asked."""
    import setproctitle

    setproctitle.setproctitle("VLLM::EngineCore")
    comm = Path("/proc/self/comm").read_text().strip()
    line = Path("/proc/self/cmdline").read_bytes().rstrip(b"\0").decode().replace("\0", " ")
    Path(path).write_text(f"{line} {comm}" if cmdline else comm)
