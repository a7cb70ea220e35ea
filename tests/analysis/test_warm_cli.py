"""``python -m analysis`` served by a warm Python (`core.warm_command`, `analysis.warm`): the
second command line is forked from the warm Python the first one left, and prints, writes
and exits as a fresh interpreter does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from core.warm_python import stop_warm_pythons
from tests.factories import make_result_dir, wait_until

REPO = Path(__file__).resolve().parents[2]


def _analysis(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "analysis", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def _outputs(out: Path) -> dict[str, bytes]:
    """Every output but the report's pages (a plot's id is random) and the memo."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.suffix != ".html" and p.name != ".telltale_memo"}


def test_the_second_command_line_is_served_warm_and_does_what_a_fresh_one_does(
        tmp_path: Path) -> None:
    tree = tmp_path / "results"
    for i in range(3):
        make_result_dir(tree, f"{i:03d}__cell", tokens_per_second=1000 + 10 * i,
                        run_uuid=f"run-{i}", seed=i)
    home = tmp_path / "home"
    env = {**os.environ, "TELLTALE_PREFECT_API_HOME": str(home),
           "TELLTALE_WARM_COMMAND_MINUTES": "5"}
    base = home / "telltale-warm-python"
    try:
        args = [str(tree), "--project", "fine_tuning", "--force"]
        fresh = _analysis(env, *args, "--out", str(tmp_path / "fresh"))
        assert fresh.returncode == 0, fresh.stderr
        wait_until(lambda: any(p.parent.joinpath("sock").exists()
                               for p in base.glob("*/warm.json")), "the warm Python's socket")
        [log] = base.glob("*/warm-python.log")
        assert "runs python -m analysis" not in log.read_text()
        warm = _analysis(env, *args, "--out", str(tmp_path / "warm"))
        assert warm.returncode == 0, warm.stderr
        assert "runs python -m analysis" in log.read_text()  # forked, not a fresh process
        assert warm.stdout.replace(str(tmp_path / "warm"), "OUT") == \
            fresh.stdout.replace(str(tmp_path / "fresh"), "OUT")
        assert _outputs(tmp_path / "warm") == _outputs(tmp_path / "fresh")
        assert sorted(p.name for p in (tmp_path / "warm" / "report").iterdir()) == \
            sorted(p.name for p in (tmp_path / "fresh" / "report").iterdir())
        # a usage error and a subcommand's answer, served too
        usage = _analysis(env, str(tree), "--project", "nope", "--out", str(tmp_path / "x"))
        assert usage.returncode == 2 and "unknown project 'nope'" in usage.stderr
        assert log.read_text().count("runs python -m analysis") == 2
        # an interpreter option (-W, -O, -X...): never served (the warm Python has none)
        flagged = subprocess.run([sys.executable, "-B", "-m",
                                  "analysis", *args, "--out", str(tmp_path / "flagged")],
                                 cwd=REPO, env=env, capture_output=True, text=True,
                                 timeout=600)
        assert flagged.returncode == 0, flagged.stderr
        assert log.read_text().count("runs python -m analysis") == 2
        # TELLTALE_WARM_COMMAND_MINUTES=0: another key; a fresh interpreter, none left
        alone = {**env, "TELLTALE_WARM_COMMAND_MINUTES": "0"}
        assert _analysis(alone, *args, "--out", str(tmp_path / "alone")).returncode == 0
        assert len(list(base.glob("*/warm.json"))) == 1
    finally:
        stop_warm_pythons(tmp_path)
