"""The llm_serving load step (`workload/load.py`): its config, its server checks, GuideLLM
executed or forked, stalled or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from projects.llm_serving.manifests import LOAD_SCRIPT


def _load(tmp_path: Path, config: dict, env: dict | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / "load.json"
    path.write_text(json.dumps(config))
    return subprocess.run([sys.executable, str(LOAD_SCRIPT), str(path), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=600, env=env or {"PATH": "/usr/bin:/bin"}, check=False)


GOOD = {"guidellm": ["guidellm"], "model": "tiny", "tokenizer": "/models/tiny",
        "concurrency": 1, "prompt_tokens": 8, "output_tokens": 8, "duration_s": 5,
        "request_format": "/v1/completions"}


@pytest.mark.parametrize(("change", "words"), [
    ({}, "no usable server URL"),  # no target, no TELLTALE_SERVICE_URL
    ({"target": "http://x;touch /tmp/p"}, "no usable server URL"),
    ({"target": "http://127.0.0.1:1", "model": "a,kind=evil"}, "model"),
    ({"target": "http://127.0.0.1:1", "concurrency": -1}, "concurrency"),
])
def test_the_load_step_refuses_bad_config_with_exit_2(tmp_path: Path, change: dict,
                                                       words: str) -> None:
    done = _load(tmp_path, {**GOOD, **change})
    assert done.returncode == 2 and words in done.stderr


def test_the_load_step_fails_when_the_server_never_answers(tmp_path: Path) -> None:
    done = _load(tmp_path, {**GOOD, "target": "http://127.0.0.1:1", "wait_ready_s": 0})
    assert done.returncode == 3 and "did not answer 200" in done.stderr


_STALLS_ONCE = '''
import shutil, sys, time
from pathlib import Path

marker = Path(sys.argv[1])
output = next(a.split("path=", 1)[1] for a in sys.argv if a.startswith("kind=json,path="))
if not marker.exists():  # the first run: alive and idle, as GuideLLM hangs upstream
    marker.write_text("stalled")
    time.sleep(600)
shutil.copy(sys.argv[2], output)
'''


@pytest.fixture
def model_server() -> Iterator[str]:
    """A server answering the load script's /version and /metrics (its base URL)."""
    import http.server
    import threading

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the handler's API)
            body = b'{"version": "0"}' if self.path == "/version" else b"# metrics\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


_RECORDED = Path(__file__).resolve().parents[1] / "data" / "guidellm_light.json"


def test_a_stalled_guidellm_is_killed_and_run_once_more(tmp_path: Path,
                                                        model_server: str) -> None:
    """GuideLLM's upstream hang (alive, idle, no report) costs its grace, not the cell's
    deadline: the load step kills it and runs it again."""
    fake = tmp_path / "guidellm.py"
    fake.write_text(_STALLS_ONCE)
    done = _load(tmp_path, {**GOOD, "target": model_server,
                            "guidellm": [sys.executable, str(fake),
                                         str(tmp_path / "stalled"), str(_RECORDED)],
                            "stall_grace_s": 1})
    assert (tmp_path / "stalled").exists()  # the first run did stall
    assert "guidellm stalled" in done.stderr and "attempt 2 of 2" in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "load.json").read_text())["guidellm_exit_code"] == 0


# A stand-in for GuideLLM's package: its command line is click's ``cli.main`` (the console
# script calls it); it records how it was reached, stalls once when asked, writes the report.
_STAND_IN_CLI = """
import json, os, shutil, sys, time
from pathlib import Path


class _Cli:
    def main(self, args, prog_name):
        work = Path(os.environ["STAND_IN_WORK"])
        how = "forked" if "stand_in_preloaded" in sys.modules else "executed"
        with open(work / "calls.jsonl", "a") as calls:
            calls.write(json.dumps({"how": how, "ppid": os.getppid(), "pid": os.getpid(),
                                    "prog": prog_name, "argv0": sys.argv[0]}) + "\\n")
        if os.environ.get("STAND_IN_STALL") and not (work / "stalled").exists():
            (work / "stalled").write_text("stalled")
            time.sleep(600)
        output = next(a.split("path=", 1)[1] for a in args if a.startswith("kind=json,path="))
        shutil.copy(os.environ["STAND_IN_RESULT"], output)
        sys.exit(0)


cli = _Cli()
"""


def _stand_in_venv(tmp_path: Path) -> Path:
    """A venv-like bin dir: a ``python`` (this interpreter's binary) and a ``guidellm``
    console script beside it; the stand-in GuideLLM package on ``tmp_path/site``."""

    package = tmp_path / "site" / "guidellm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cli.py").write_text(_STAND_IN_CLI)
    (package / "benchmark.py").write_text("")
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.symlink_to(os.path.realpath(sys.executable))
    script = bin_dir / "guidellm"
    script.write_text(f"#!{python}\nimport sys\nfrom guidellm.cli import cli\n"
                      "sys.exit(cli.main(args=sys.argv[1:], prog_name='guidellm'))\n")
    script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(("preloaded", "stall"), [(True, False), (True, True), (False, False)])
def test_a_preloaded_guidellm_runs_forked_from_the_load_script(
        tmp_path: Path, model_server: str, preloaded: bool, stall: bool) -> None:
    """In an interpreter that has GuideLLM imported (a warm Python of the serving venv), the
    load script runs the venv's own GuideLLM in a forked child — the same command line,
    without ~9 s of imports — and a stalled one is still killed and run once more; in a
    fresh interpreter the same command is executed."""
    bin_dir = _stand_in_venv(tmp_path)
    config = tmp_path / "load.json"
    config.write_text(json.dumps({**GOOD, "target": model_server, "duration_s": 2,
                                  "guidellm": [str(bin_dir / "guidellm")],
                                  "stall_grace_s": 1}))
    out = tmp_path / "out"
    preload = ("import guidellm.cli, guidellm.benchmark, types; "
               "sys.modules['stand_in_preloaded'] = types.ModuleType('stand_in_preloaded'); "
               if preloaded else "")
    code = ("import os, runpy, sys; " + preload
            + f"sys.argv = ['load', {str(config)!r}, '--out', {str(out)!r}]; "
            "print('load pid', os.getpid(), flush=True); "
            "runpy.run_module('projects.llm_serving.workload.load', run_name='__main__')")
    repo = Path(__file__).resolve().parents[2]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path / 'site'}:{repo}",
           "STAND_IN_WORK": str(tmp_path), "STAND_IN_RESULT": str(_RECORDED),
           **({"STAND_IN_STALL": "1"} if stall else {})}
    done = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True,
                          text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    load_pid = int(done.stdout.split("load pid ", 1)[1].split()[0])
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == (2 if stall else 1)
    for call in calls:
        assert call["how"] == ("forked" if preloaded else "executed")
        assert call["prog"] == "guidellm" and call["argv0"] == str(bin_dir / "guidellm")
        if preloaded:  # a child of the load process itself, not of a new interpreter
            assert call["ppid"] == load_pid and call["pid"] != load_pid
    if stall:
        assert "guidellm stalled" in done.stderr and "attempt 2 of 2" in done.stderr
    record = json.loads((out / "load.json").read_text())
    assert record["guidellm_exit_code"] == 0 and record["exit_code"] == 0


def test_a_preloaded_guidellm_of_another_venv_is_executed_not_forked(
        tmp_path: Path, model_server: str) -> None:
    """The fork is only for this interpreter's own GuideLLM: a command elsewhere (another
    venv's script, a bare name on PATH) is executed even when GuideLLM is imported here."""
    bin_dir = _stand_in_venv(tmp_path)
    other = tmp_path / "other" / "bin"
    other.mkdir(parents=True)
    (other / "guidellm").write_text((bin_dir / "guidellm").read_text())
    (other / "guidellm").chmod(0o755)
    config = tmp_path / "load.json"
    config.write_text(json.dumps({**GOOD, "target": model_server, "duration_s": 2,
                                  "guidellm": [str(other / "guidellm")]}))
    code = ("import runpy, sys, types; import guidellm.cli, guidellm.benchmark; "
            "sys.modules['stand_in_preloaded'] = types.ModuleType('stand_in_preloaded'); "
            f"sys.argv = ['load', {str(config)!r}, '--out', {str(tmp_path / 'out')!r}]; "
            "runpy.run_module('projects.llm_serving.workload.load', run_name='__main__')")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True,
                          text=True, timeout=600, check=False,
                          env={"PATH": "/usr/bin:/bin",
                               "PYTHONPATH": f"{tmp_path / 'site'}:{repo}",
                               "STAND_IN_WORK": str(tmp_path),
                               "STAND_IN_RESULT": str(_RECORDED)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [c["how"] for c in calls] == ["executed"]
