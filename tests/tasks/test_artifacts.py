from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr

from core.errors import StepError
from tasks.artifacts import allocate_dir, artifact_dir, next_artifact_dir, step, use_artifact_dir


def test_no_active_dir_is_a_clear_error() -> None:
    with pytest.raises(StepError, match="no artifact dir is active"):
        artifact_dir()


def test_sequential_numbering(tmp_path: Path) -> None:
    with use_artifact_dir(tmp_path):
        with next_artifact_dir("a") as a:
            assert a.name == "000__a"
            with next_artifact_dir("inner") as inner:
                assert inner == a / "000__inner"
        with next_artifact_dir("b") as b:
            assert b.name == "001__b"
        assert artifact_dir() == tmp_path.resolve()


def test_sixteen_threads_never_share_a_number(tmp_path: Path) -> None:
    barrier = threading.Barrier(16)

    def grab(i: int) -> list[str]:
        barrier.wait()
        return [allocate_dir(tmp_path, f"t{i}_{j}").name for j in range(20)]

    with ThreadPoolExecutor(16) as pool:
        names = [n for chunk in pool.map(grab, range(16)) for n in chunk]
    numbers = [n.split("__")[0] for n in names]
    assert len(names) == 320
    assert len(set(numbers)) == 320
    assert sorted(int(n) for n in numbers) == list(range(320))


def test_context_is_per_thread(tmp_path: Path) -> None:
    seen: list[Path | None] = []
    with use_artifact_dir(tmp_path):
        thread = threading.Thread(target=lambda: seen.append(
            __import__("tasks.artifacts", fromlist=["ARTIFACT_DIR"]).ARTIFACT_DIR.get()))
        thread.start()
        thread.join()
    assert seen == [None]  # a bare thread does not inherit (Prefect copies context explicitly)


def test_plain_step_writes_its_dir(tmp_path: Path) -> None:
    @step("demo", prefect=False)
    def work(x: int, password: SecretStr, token: str = "abc") -> int:
        logging.getLogger("telltale.demo").warning("working on %s", x)
        return x * 2

    @step("demo", prefect=False)
    def broken() -> None:
        raise ValueError("kaput")

    with use_artifact_dir(tmp_path):
        assert work(21, SecretStr("pw")) == 42
        with pytest.raises(ValueError):
            broken()
    ok_dir, bad_dir = tmp_path / "000__demo__work", tmp_path / "001__demo__broken"
    params = yaml.safe_load((ok_dir / "parameters.yaml").read_text())
    assert params == {"x": 21, "password": "***", "token": "***"}
    meta = json.loads((ok_dir / "step.json").read_text())
    assert meta["state"] == "Completed" and meta["duration_s"] >= 0
    assert "working on 21" in (ok_dir / "step.log").read_text()
    assert not (ok_dir / "FAILURE").exists()
    assert json.loads((bad_dir / "step.json").read_text())["state"] == "Failed"
    assert "ValueError: kaput" in (bad_dir / "FAILURE").read_text()
