"""The local trainer ends without Python's module teardown, and loses nothing by it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("code", [0, 3])
def test_the_trainer_exits_with_its_code_its_handlers_run_and_its_output_flushed(
        code: int) -> None:
    """``exit_now``: what ``sys.exit`` does (``atexit`` handlers, flushed streams, the exit
    code) but the seconds of module teardown that torch's modules cost."""
    script = (
        "import atexit, logging, sys\n"
        "from projects.fine_tuning.workload.train_local import exit_now\n"
        "atexit.register(lambda: print('handler ran', end=''))\n"
        "logging.basicConfig(stream=sys.stderr)\n"
        "logging.getLogger('t').warning('logged')\n"
        "print('summary line', end='')  # a pipe: block-buffered, still in the buffer\n"
        "sys.stderr.write('on stderr')\n"
        f"exit_now({code})\n"
        "print('never')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == code, done.stderr[-2000:]
    assert done.stdout == "summary linehandler ran"
    assert "logged" in done.stderr and "on stderr" in done.stderr
