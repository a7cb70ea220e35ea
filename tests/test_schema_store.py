"""The upstream schemas: found through TELLTALE_SCHEMAS_DIR or the cache, verified by their
pins, fetched from a (local) mirror into the cache — and skipped with one reason without them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import schema_store
from tests.servers import serve

REPO = Path(__file__).resolve().parents[1]


def _upstream_tree(tmp_path: Path, *, tamper: str | None = None) -> Path:
    """A fake 'upstream host': every pinned file at its URL's path, content matching the
    pin only where we can make it (we do not have the real bytes here without a copy), so
    the test rewrites the lock to pin what it serves."""
    host = tmp_path / "host"
    files = []
    for pin in schema_store.pinned():
        data = f"# {pin.path}\nkind: Whatever\n".encode()
        rel = pin.url[len(schema_store.PINNED_HOST):]
        (host / rel).parent.mkdir(parents=True, exist_ok=True)
        served = data + b"tampered\n" if tamper == pin.path else data
        (host / rel).write_bytes(served)
        files.append({"path": pin.path, "url": pin.url,
                      "sha256": hashlib.sha256(data).hexdigest()})
    lock = tmp_path / "schemas.lock.json"
    lock.write_text(json.dumps({"files": files}), encoding="utf-8")
    return host


@pytest.fixture()
def fake_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def use(**kwargs: object) -> Path:
        host = _upstream_tree(tmp_path, **kwargs)  # type: ignore[arg-type]
        monkeypatch.setattr(schema_store, "LOCK", tmp_path / "schemas.lock.json")
        schema_store.pinned.cache_clear()
        schema_store._locate.cache_clear()
        return host

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(schema_store.ENV_DIRS, raising=False)
    yield use
    schema_store.pinned.cache_clear()
    schema_store._locate.cache_clear()


def _static(root: Path):
    from http.server import SimpleHTTPRequestHandler

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):  # quiet
            pass

    return Handler


def test_the_lock_pins_every_file_by_commit_and_sha256() -> None:
    pins = schema_store.pinned()
    assert len(pins) >= 14
    for pin in pins:
        assert pin.url.startswith(schema_store.PINNED_HOST)
        commit = pin.url[len(schema_store.PINNED_HOST):].split("/")[2]
        assert len(commit) == 40 and int(commit, 16) >= 0, pin.url  # a commit, not a branch
        assert len(pin.sha256) == 64
        assert pin.path.startswith(("crds/", "apis/"))


def test_fetch_verifies_and_the_cache_is_then_found(fake_lock, tmp_path: Path) -> None:
    host = fake_lock()
    assert schema_store.missing() == [p.path for p in schema_store.pinned()]
    with serve(_static(host)) as port:
        os.environ[schema_store.ENV_MIRROR] = f"http://127.0.0.1:{port}"
        try:
            assert schema_store.fetch(log=lambda _: None) == len(schema_store.pinned())
            assert schema_store.fetch(log=lambda _: None) == 0  # already there
        finally:
            del os.environ[schema_store.ENV_MIRROR]
    assert schema_store.missing() == []
    first = schema_store.pinned()[0].path
    assert schema_store.locate(first) == tmp_path / "cache" / "telltale" / "schemas" / first


def test_a_download_that_differs_from_its_pin_writes_nothing(fake_lock, tmp_path: Path) -> None:
    bad = schema_store.pinned()[3].path
    host = fake_lock(tamper=bad)
    with serve(_static(host)) as port:
        os.environ[schema_store.ENV_MIRROR] = f"http://127.0.0.1:{port}"
        try:
            with pytest.raises(schema_store.SchemaError, match="does not match its pin"):
                schema_store.fetch(log=lambda _: None)
        finally:
            del os.environ[schema_store.ENV_MIRROR]
    cache = tmp_path / "cache" / "telltale" / "schemas"
    assert not (cache / bad).exists()
    assert not [p for p in cache.rglob("*") if p.name.startswith(".")]  # no temp left


def test_an_unreachable_mirror_is_one_error_naming_the_file(fake_lock) -> None:
    fake_lock()
    os.environ[schema_store.ENV_MIRROR] = "http://127.0.0.1:9"
    try:
        with pytest.raises(schema_store.SchemaError, match="could not fetch crds/"):
            schema_store.fetch(log=lambda _: None)
    finally:
        del os.environ[schema_store.ENV_MIRROR]


def test_a_schemas_dir_is_searched_before_the_cache_and_an_edited_copy_is_refused(
        fake_lock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = fake_lock()
    shared = tmp_path / "shared"
    for pin in schema_store.pinned():
        src = host / pin.url[len(schema_store.PINNED_HOST):]
        (shared / pin.path).parent.mkdir(parents=True, exist_ok=True)
        (shared / pin.path).write_bytes(src.read_bytes())
    # two folders, one per first part, as `../shared/crds:../shared/apis`
    monkeypatch.setenv(schema_store.ENV_DIRS, f"{shared / 'crds'}{os.pathsep}{shared / 'apis'}")
    assert schema_store.missing() == []
    monkeypatch.setenv(schema_store.ENV_DIRS, str(shared))
    assert schema_store.missing() == []
    edited = shared / schema_store.pinned()[0].path
    edited.write_text("edited\n", encoding="utf-8")
    schema_store._locate.cache_clear()
    with pytest.raises(schema_store.SchemaError, match="differs from its pin"):
        schema_store.locate(schema_store.pinned()[0].path)


def test_without_schemas_a_test_is_skipped_with_one_reason_or_fails_when_required(
        tmp_path: Path) -> None:
    """Through pytest itself, in a clone-like environment: no schemas dir, an empty cache."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "from tests.upstream_schemas import validate\n"
        "from tests.servers.horreum import horreum_server\n"
        "def test_crd():\n"
        "    validate({'apiVersion': 'kubeflow.org/v1', 'kind': 'PyTorchJob'})\n"
        "def test_horreum():\n"
        "    with horreum_server():\n"
        "        pass\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if k not in (schema_store.ENV_DIRS, schema_store.ENV_REQUIRE)}
    env.update(XDG_CACHE_HOME=str(tmp_path / "empty"), PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=",
           "-rs", "-q", str(probe), "--rootdir", str(tmp_path)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 skipped" in out.stdout
    # one stated reason for all of them (pytest groups identical skips into one line)
    assert "SKIPPED [2] tests/schema_store.py" in out.stdout, out.stdout
    assert out.stdout.count(schema_store.MISSING_REASON) == 1, out.stdout
    out = subprocess.run(cmd, env={**env, schema_store.ENV_REQUIRE: "1"}, capture_output=True,
                         text=True, cwd=REPO, timeout=300)
    assert out.returncode == 1 and "2 failed" in out.stdout, out.stdout + out.stderr


def test_check_exits_non_zero_naming_what_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != schema_store.ENV_DIRS}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-m", "tests.schema_store", "check"], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "14 of 14 upstream schemas not found" in out.stderr
    assert "fetch-schemas" in out.stderr
