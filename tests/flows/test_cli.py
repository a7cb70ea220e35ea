"""The fine_tuning command line, through a subprocess as a user runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flows.fine_tuning", *args],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def test_plan_writes_config_and_cells(tmp_path: Path) -> None:
    proc = cli("--preset", "sweep", "--plan", "--artifact-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    assert len(plan["cells"]) == 4
    skipped = [c for c in plan["cells"] if "skip_reason" in c]
    assert len(skipped) == 1 and skipped[0]["skip_reason"].startswith("skip_if[0]")
    assert all({"name", "settings"} <= set(c) for c in plan["cells"])
    assert (tmp_path / "config.yaml").is_file()
    assert (tmp_path / "presets_applied").read_text().split() == ["sweep", "light", "not_metal"]
    assert "cells     4 (3 to run, 1 skipped)" in proc.stdout


@pytest.mark.parametrize(("project", "preset", "platform"), [
    ("fine_tuning", "light", "local"), ("fine_tuning", "gpu", "kubernetes"),
    ("llm_serving", "light", "local")])
@pytest.mark.parametrize("error", [False, True])
def test_plan_does_not_import_prefect_nor_pandas(tmp_path: Path, project: str, preset: str,
                                                 platform: str, error: bool) -> None:
    """A plan, a user error, and the front of every run (its config, its project's
    declaration, what it starts ahead), import neither Prefect (~1.3 s) nor pandas (~0.7 s),
    nor NumPy (~0.15 s) nor httpx (~0.2 s): a command line's ahead starts that much sooner,
    a user error (0.7 -> 0.45 s) or a plan answers that much sooner."""
    args = ["--preset", preset, "--platform", platform, "--plan", "--artifact-dir",
            str(tmp_path), *(["--var", "no.such.key=1"] if error else [])]
    code = ("import sys\nfrom flows.project_cli import project_main\n"
            f"print('exit', project_main({project!r}, {args!r}))\n"
            "print(sorted(m for m in ('prefect', 'pandas', 'pyarrow', 'numpy', 'httpx') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.stdout.strip().endswith("[]"), out.stdout[-500:] + out.stderr[-2000:]
    assert f"exit {2 if error else 0}" in out.stdout, out.stdout[-500:] + out.stderr[-2000:]


@pytest.mark.parametrize(("args", "message"), [
    (["--preset", "nope"], "unknown preset 'nope'; available presets:"),
    (["--var", "tests.fine_tuning.test_settings.gpuu=1"], "closest: gpu"),
    (["--var", "tests.fine_tuning.test_settings.gpu=[1"], "malformed YAML"),
    (["--var", "clusters.platform=moon"], "clusters.platform"),
    (["--var", "novalue"], "--var expects KEY=VALUE"),
    (["--vars-file", "/nonexistent/vars.yaml"], "file not found"),
    (["--platform", "moon"], "invalid choice"),
    (["--var", "tests.fine_tuning.test_settings.hyper_parameters.r=sixteen"], "valid integer"),
    (["--var", "tests.fine_tuning.test_settings.hyper_parameters.learning_rate=fast"],
     "valid number"),
    (["--var", "tests.fine_tuning.test_settings.dataset_replication=-3"], "greater than"),
    (["--var", "tests.fine_tuning.test_settings.max_steps=-5"], "greater than"),
    (["--var", "tests.fine_tuning.test_settings.hyper_parameters.lora_dropout=2"],
     "less than or equal to 1"),
    (["--var", "tests.fine_tuning.multi_user.user_count=100001"], "less than or equal to"),
    (["--var", "export_artifacts.opensearch.retry.attempts=0"], "greater than or equal to 1"),
])
def test_user_errors_are_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    proc = cli(*args, "--plan", "--artifact-dir", str(tmp_path))
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_preset_cycle_is_reported(tmp_path: Path) -> None:
    config = tmp_path / "cycle.yaml"
    config.write_text("ci_presets:\n  a: {extends: [b]}\n  b: {extends: [a]}\nx: 1\n")
    code = ("from projects.config import resolve\n"
            f"resolve({str(config)!r}, ['a'], env={{}})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "preset cycle: a -> b -> a" in proc.stderr


def test_pr_args_vars_file_and_env(tmp_path: Path) -> None:
    pr = tmp_path / "comment.txt"
    pr.write_text("/test fine_tuning\n/var tests.fine_tuning.test_settings.gpu: 2\n")
    vars_file = tmp_path / "vars.yaml"
    vars_file.write_text("tests.fine_tuning.test_settings.pod_count: 3\n"
                         "tests.fine_tuning.test_settings.gpu: 1\n")
    proc = cli("--vars-file", str(vars_file), "--pr-args", str(pr), "--show-config",
               env={"TELLTALE__tests__fine_tuning__test_settings__dataset_replication": "5"})
    assert proc.returncode == 0, proc.stderr
    settings = yaml.safe_load(proc.stdout)["tests"]["fine_tuning"]["test_settings"]
    assert (settings["gpu"], settings["pod_count"], settings["dataset_replication"]) == (2, 3, 5)


def test_list_presets_and_schema() -> None:
    listed = cli("--list-presets")
    assert "light  (extends not_metal)" in listed.stdout
    schema = json.loads(cli("--show-schema").stdout)
    assert "tests" in schema["properties"]


def test_replot_cli_refuses_missing_source(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "flows.replot", "--from",
                           str(tmp_path / "nope")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "no such directory" in proc.stderr


DOMAIN = ("--var", "clusters.create.base_domain=lab.example.com")


def test_metal_without_a_base_domain_is_refused_at_plan_time(tmp_path: Path) -> None:
    proc = cli("--preset", "metal_quads", "--plan", "--artifact-dir", str(tmp_path))
    assert proc.returncode == 2 and "clusters.create.base_domain" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_metal_quads_plan_shows_the_lease_request(tmp_path: Path) -> None:
    proc = cli("--preset", "metal_quads", *DOMAIN, "--plan", "--artifact-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "lease     QUADS: 3 host(s) [model=R650, disks.disk_type=nvme]" in proc.stdout
    lease = yaml.safe_load((tmp_path / "plan.yaml").read_text())["extra"]["lease"]
    assert lease["count"] == 3 and lease["release"].startswith("released at the end")
    kept = cli("--preset", "metal_quads", "--preset", "keep", *DOMAIN, "--plan",
               "--artifact-dir", str(tmp_path / "k"))
    assert "kept (clusters.keep)" in kept.stdout


def test_kubernetes_without_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    proc = cli("--preset", "gpu", "--artifact-dir", str(tmp_path),
               env={"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)})
    assert proc.returncode == 2 and "needs a kubeconfig" in proc.stderr


def test_gpu_plan_writes_every_manifest_without_a_cluster(tmp_path: Path) -> None:
    proc = cli("--preset", "gpu", "--plan", "--artifact-dir", str(tmp_path),
               env={"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    kinds = sorted(p.name.split("-")[1] for p in (tmp_path / "manifests").glob("*__cell/*"))
    assert kinds == ["configmap", "job", "namespace", "persistentvolumeclaim", "pytorchjob"]
    # what prepare would apply: every OLM object of the gpu preset's operators
    prepare = {p.name.split("-", 1)[1] for p in (tmp_path / "manifests" / "prepare").iterdir()}
    for expected in ("subscription-rhods-operator.yaml", "operatorgroup-rhods-operator-group.yaml",
                     "datasciencecluster-default-dsc.yaml", "subscription-servicemeshoperator.yaml",
                     "clusterpolicy-gpu-cluster-policy.yaml", "subscription-nfd.yaml",
                     "nodefeaturediscovery-nfd-instance.yaml",
                     "subscription-gpu-operator-certified.yaml"):
        assert expected in prepare, sorted(prepare)
    job = yaml.safe_load(next((tmp_path / "manifests").rglob("*pytorchjob*.yaml")).read_text())
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "manifests 19 written" in proc.stdout


def test_var_text_is_parsed_once_and_a_ticket_may_be_a_number() -> None:
    proc = cli("--var", 'tests.fine_tuning.test_settings.name="run #5 nightly"',
               "--var", "clusters.sutest.lab.enabled=true",  # a lab setting needs its lab
               "--var", "clusters.sutest.lab.ticket=8001", "--show-config")
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    assert config["tests"]["fine_tuning"]["test_settings"]["name"] == "run #5 nightly"
    from projects.config import parse_override, resolve

    lab = resolve("fine_tuning", overrides={"clusters.sutest.lab.enabled": True,
                                            "clusters.sutest.lab.ticket": parse_override(
        "t", "8001")}, env={}).model.clusters.sutest.lab
    assert lab.ticket == "8001"


@pytest.mark.parametrize(("key", "switches"), [
    ("clusters.sutest.compute.machineset.instance_type=g5.xlarge",
     ["clusters.sutest.compute.machineset"]),
    ("clusters.sutest.compute.machineset.replicas=3", ["clusters.sutest.compute.machineset"]),
    ("clusters.sutest.lab.ticket=CPT-1", ["clusters.sutest.lab"]),
    ("export_artifacts.opensearch.kpi_index=runs",  # the outer switch is named first
     ["export_artifacts", "export_artifacts.opensearch"]),
    ("prepare.gpu_operator.time_sharing_replicas=4", ["prepare.gpu_operator"]),
    ("tests.fine_tuning.multi_user.user_count=4", ["tests.fine_tuning.multi_user"]),
])
def test_a_setting_of_a_disabled_feature_is_refused_naming_enabled(
        key: str, switches: list[str]) -> None:
    """It would do nothing: refused (exit 2, one line), never ignored."""
    proc = cli("--preset", "light", "--var", key, "--show-config")
    assert proc.returncode == 2, proc.stdout[-500:]
    assert f"set {switches[0]}.enabled: true" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    enabled = cli("--preset", "light", *[a for s in switches for a in (
        "--var", f"{s}.enabled=true")], "--var", key, "--show-config")
    assert "enabled is false" not in enabled.stderr


@pytest.mark.parametrize("key", ["export_artifacts.s3.bucket=results",
                                 "export_artifacts.opensearch.instance=lab",
                                 "export_artifacts.opensearch.index=runs",
                                 "prepare.rhoai.uninstall=true"])
def test_a_setting_other_paths_read_is_not_refused_with_its_feature_off(key: str) -> None:
    """The export's S3 block is the run's S3 identity (an s3:// history, replot), and the
    OpenSearch instance and index are an OpenSearch history source's: used when publishing
    is off, so setting them then does something."""
    proc = cli("--preset", "light", "--var", key, "--show-config")
    assert proc.returncode == 0, proc.stderr


def test_alias_bomb_in_a_pr_comment_is_refused_at_once(tmp_path: Path) -> None:
    comment = tmp_path / "comment.txt"
    comment.write_text("/var tests.fine_tuning.skip_if: [&a [x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,"
                       "*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,"
                       "*c,*c,*c,*c], [*d,*d,*d,*d,*d,*d,*d,*d,*d]]\n")
    proc = cli("--pr-args", str(comment), "--plan", "--artifact-dir", str(tmp_path / "p"))
    assert proc.returncode == 2 and "anchors and aliases" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("line", [
    "/var export_artifacts.s3.endpoint_url: http://attacker.example",
    "/var analysis.history_uri: /tmp/elsewhere",
    "/var secrets.dir.env_key: HOME",
    "/var tests.fine_tuning.multi_user.user_count: 100000",
    "/var clusters.create.name_prefix: x",
])
def test_a_pr_comment_may_only_set_allowlisted_keys(tmp_path: Path, line: str) -> None:
    comment = tmp_path / "comment.txt"
    comment.write_text(f"/test fine_tuning\nLooks good!\n{line}\n")
    proc = cli("--pr-args", str(comment), "--plan", "--artifact-dir", str(tmp_path / "p"))
    assert proc.returncode == 2, proc.stdout
    assert "may not set" in proc.stderr and ":3:" in proc.stderr
    assert "pr_comment.allowed_keys" in proc.stderr


def test_an_unusable_artifact_dir_is_one_line_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    proc = cli("--preset", "light", "--plan", "--artifact-dir", str(blocker / "run"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: --artifact-dir {blocker / 'run'} is not a usable "
                                   "directory: Not a directory")


def test_a_full_disk_during_analysis_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """RLIMIT_FSIZE stands in for a full disk: writes past it fail (EFBIG) like ENOSPC."""
    import resource

    from tests.factories import make_result_dir

    make_result_dir(tmp_path / "results", "000__cell")

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    proc = subprocess.run([sys.executable, "-m", "analysis", str(tmp_path / "results"),
                           "--project", "fine_tuning", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600, preexec_fn=small_disk)
    assert proc.returncode == 1, proc.stderr[-2000:]
    # one error line after the progress lines of the stages that finished
    lines = proc.stderr.strip().splitlines()
    assert all(re.match(r"(parse|judge|report): ", line) for line in lines[:-1]), lines
    assert lines[-1].startswith("error: ") and "Traceback" not in proc.stderr
    assert "File too large" in lines[-1]


def test_bare_metal_with_one_host_is_refused_at_plan_time(tmp_path: Path) -> None:
    proc = cli("--preset", "metal_quads", "--var", "clusters.sutest.lab.count=1", "--plan",
               "--artifact-dir", str(tmp_path))
    assert proc.returncode == 2 and "at least 2 hosts" in proc.stderr


@pytest.mark.parametrize("target", ["kpis.prom", "lts_payload.json", "kpis.parquet",
                                    "report/index.html", "report/plotly.min.js"])
def test_outputs_never_write_through_a_planted_link(tmp_path: Path, target: str) -> None:
    from tests.factories import make_result_dir

    results = tmp_path / "results"
    make_result_dir(results, "000__cell")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    (out / target).parent.mkdir(parents=True)
    (out / target).symlink_to(victim)
    proc = subprocess.run([sys.executable, "-m", "analysis", str(results), "--project",
                           "fine_tuning", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "symbolic link" in proc.stderr and str(out / target) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("planted", ["manifests", "manifests/prepare", "manifests/000__cell"])
def test_a_plan_never_writes_through_a_planted_dir_link(tmp_path: Path, planted: str) -> None:
    """--plan writes its manifests under its artifact dir as an output root: a link planted
    on the way (``manifests -> elsewhere``) is refused, and nothing lands where it points."""
    run = tmp_path / "run"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / planted).parent.mkdir(parents=True, exist_ok=True)
    (run / planted).symlink_to(elsewhere, target_is_directory=True)
    proc = cli("--preset", "gpu", "--plan", "--artifact-dir", str(run),
               env={"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "symbolic link" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not any(elsewhere.rglob("*")), list(elsewhere.rglob("*"))


def test_a_huge_matrix_from_three_lines_is_refused_at_once(tmp_path: Path) -> None:
    values = "[" + ", ".join(str(1e-4 * (i + 1)) for i in range(20)) + "]"
    comment = tmp_path / "comment.txt"
    comment.write_text(
        f"/var tests.fine_tuning.test_settings.hyper_parameters.learning_rate: {values}\n"
        "/var tests.fine_tuning.test_settings.hyper_parameters.r: "
        f"[{', '.join(str(i) for i in range(1, 21))}]\n"
        "/var tests.fine_tuning.test_settings.hyper_parameters.lora_alpha: "
        f"[{', '.join(str(i) for i in range(1, 21))}]\n")
    proc = cli("--preset", "light", "--pr-args", str(comment), "--plan", "--artifact-dir",
               str(tmp_path / "p"))
    assert proc.returncode == 2
    assert "8000 cells, over matrix.max_cells (256)" in proc.stderr
    assert "learning_rate (20) x hyper_parameters.r (20) x hyper_parameters.lora_alpha (20)" \
        in proc.stderr


def _deep(levels: int) -> str:
    return "".join(f"{'  ' * i}k{i}:\n" for i in range(levels)) + "  " * levels + "leaf: 1\n"


@pytest.mark.parametrize("how", ["var", "vars-file", "env", "pr-args"])
def test_deep_yaml_is_one_line_exit_2_on_every_path(tmp_path: Path, how: str) -> None:
    flow = "[" * 300 + "]" * 300
    key = "tests.fine_tuning.test_settings.hyper_parameters.r"
    args: list[str] = ["--preset", "light", "--plan", "--artifact-dir", str(tmp_path / "p")]
    env = None
    if how == "var":
        args += ["--var", f"{key}={flow}"]
    elif how == "vars-file":
        (tmp_path / "v.yaml").write_text(_deep(300))
        args += ["--vars-file", str(tmp_path / "v.yaml")]
    elif how == "env":
        env = {"TELLTALE__tests__fine_tuning__test_settings__hyper_parameters__r": flow}
    else:
        (tmp_path / "c.txt").write_text(f"/var {key}: {flow}\n")
        args += ["--pr-args", str(tmp_path / "c.txt")]
    proc = cli(*args, env=env)
    assert proc.returncode == 2 and "deeper than 64 levels" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("source", ["/dev/zero", "fifo", "big"])
def test_pr_args_are_read_bounded(tmp_path: Path, source: str) -> None:
    path = tmp_path / source
    if source == "fifo":
        os.mkfifo(path)  # nobody writes: a blocking read would hang
    elif source == "big":
        path.write_text("/var x: 1\n" * 10_000)  # 100 KB
    else:
        path = Path(source)
    proc = cli("--preset", "light", "--pr-args", str(path), "--plan", "--artifact-dir",
               str(tmp_path / "p"))
    assert proc.returncode == 2, proc.stderr
    assert ("not a regular file" in proc.stderr) or ("over the 65536" in proc.stderr)


@pytest.mark.parametrize(("args", "env", "words"), [
    (["--plan"], {"TELLTALE_FORCE_REPARSE": "maybe"}, "TELLTALE_FORCE_REPARSE"),
    (["--var", "tests.fine_tuning.namespace=Has\"Quotes"], None, "tests.fine_tuning.namespace"),
    (["--var", "tests.fine_tuning.namespace=" + "n" * 64], None, "tests.fine_tuning.namespace"),
])
def test_late_user_errors_come_first_in_one_line(tmp_path: Path, args: list[str],
                                                  env: dict | None, words: str) -> None:
    proc = cli("--preset", "light", *args, "--artifact-dir", str(tmp_path / "r"), env=env)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").glob("*__*"))


def test_an_llm_serving_group_with_a_bad_name_is_refused_at_plan_time(tmp_path: Path) -> None:
    for preset in ("light", "gpu"):
        proc = subprocess.run(
            [sys.executable, "-m", "flows.llm_serving", "--preset", preset, "--plan",
             "--var", "tests.llm_serving.test_extra_settings=[{name: 'a b c'}]",
             "--artifact-dir", str(tmp_path / preset)],
            capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "test_settings.name" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_results_dir_loop_and_janitor_without_kubeconfig_are_one_line(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    proc = subprocess.run([sys.executable, "-m", "analysis", str(loop), "--project",
                           "fine_tuning", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    proc = subprocess.run([sys.executable, "-m", "flows.cleanup", "--older-than", "1.5h"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KUBECONFIG": str(tmp_path / "none"),
                               "HOME": str(tmp_path)})
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: no kubeconfig: pass --kubeconfig or set KUBECONFIG")


def test_terminal_escapes_from_input_are_shown_not_obeyed(tmp_path: Path) -> None:
    comment = tmp_path / "c.txt"
    comment.write_text('/var tests.fine_tuning.test_settings.name: "x\\e[2Jy\\u202e"\n')
    for args in (["--var", 'tests.fine_tuning.test_settings.name="x\\e]8;;http://a\\e\\\\y"'],
                 ["--pr-args", str(comment)]):
        proc = cli("--preset", "light", *args, "--plan", "--artifact-dir", str(tmp_path / "p"))
        assert proc.returncode == 2, proc.stderr
        assert "\x1b" not in proc.stderr + proc.stdout
        assert "\u202e" not in proc.stderr + proc.stdout


def test_out_of_range_values_in_a_results_tree_are_problems(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from tests.factories import make_result_dir

    results = tmp_path / "results"
    for i in range(4):
        make_result_dir(results, f"00{i}__cell", start=datetime(2026, 1, 1 + i, tzinfo=UTC))
    huge = make_result_dir(results, "004__cell", seed=4)
    (huge / "exit_code").write_text("99999999999999999999\n")
    late = make_result_dir(results, "005__cell", seed=5)
    (late / "test_start_end.json").write_text(json.dumps(
        {"start": "9999-12-31T00:00:00+00:00", "end": "9999-12-31T01:00:00+00:00"}))
    proc = subprocess.run([sys.executable, "-m", "analysis", str(results), "--project",
                           "fine_tuning", "--out", str(tmp_path / "o"), "--history",
                           str(tmp_path / "h"), "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "1 dir(s) skipped" in proc.stdout and "Traceback" not in proc.stderr


def test_the_pr_comes_from_the_flag_or_the_ci_and_a_var_wins(tmp_path: Path) -> None:
    """``--pr N`` beats the CI's ``PULL_NUMBER`` (read only with ``HOMELAB_CI=true``), and
    ``--var`` beats both; a bad number is a usage error."""
    key = "clusters.image_build.pr"

    def pr(*args: str, env: dict[str, str] | None = None) -> object:
        proc = cli(*args, "--show-config", env={"HOMELAB_CI": "", "PULL_NUMBER": "",
                                                **(env or {})})
        assert proc.returncode == 0, proc.stderr
        return yaml.safe_load(proc.stdout)["clusters"]["image_build"]["pr"]

    assert pr() is None
    assert pr(env={"PULL_NUMBER": "31"}) is None  # not the field's CI
    assert pr(env={"PULL_NUMBER": "31", "HOMELAB_CI": "true"}) == 31
    assert pr("--pr", "44", env={"PULL_NUMBER": "31", "HOMELAB_CI": "true"}) == 44
    assert pr("--pr", "44", "--var", f"{key}=45") == 45
    bad = cli("--pr", "4;4", "--show-config")
    assert bad.returncode == 2 and "a PR number" in bad.stderr
    refused = cli("--pr", "44", "--plan", "--platform", "local", "--artifact-dir",
                  str(tmp_path / "p"))
    assert refused.returncode == 2 and key in refused.stderr


def test_rebuild_image_builds_each_target_and_prints_its_digest(tmp_path: Path) -> None:
    from tests.servers.fake_openshift import BuildController
    from tests.servers.kubernetes import kube_server, write_kubeconfig

    with kube_server() as (url, state):
        controller = BuildController(state)
        controller.start()
        try:
            proc = cli("--rebuild-image", "--pr", "9", "--artifact-dir", str(tmp_path / "img"),
                       "--var", "clusters.image_build.git_url=https://github.com/org/t",
                       "--var", f"clusters.kubeconfig={write_kubeconfig(tmp_path / 'kc', url)}",
                       env={"HOMELAB_CI": ""})
        finally:
            controller.stop()
        assert proc.returncode == 0, proc.stderr
        lines = dict(line.split("\t") for line in proc.stdout.splitlines())
        assert set(lines) == {"telltale", "user-pod"}
        assert all("@sha256:" in image for image in lines.values())
        # kept until the next refresh: no run label, names without a run suffix
        configs = state.list("build.openshift.io/v1", "BuildConfig")
        assert sorted(c["metadata"]["name"] for c in configs) == [
            "telltale-telltale-pr9", "telltale-user-pod-pr9"]
        assert not any("telltale.io/run-id" in c["metadata"]["labels"] for c in configs)
        assert len(list((tmp_path / "img").glob("*.log"))) == 2
    missing = cli("--rebuild-image", "--artifact-dir", str(tmp_path / "none"),
                  env={"HOMELAB_CI": ""})
    assert missing.returncode == 2 and "--pr N" in missing.stderr


@pytest.mark.slow
def test_a_command_line_run_resolves_its_config_once(tmp_path: Path, prefect_harness,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI resolves (and validates) the config; the flow it starts takes that one."""
    import projects.config
    from flows.project_cli import project_main

    made: list[object] = []
    real = projects.config.Config.__init__

    def counted(self: object, *args: object, **kwargs: object) -> None:
        made.append(self)
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(projects.config.Config, "__init__", counted)
    import flows.cli

    parsed: list[object] = []
    parse = flows.cli.overrides_from_args
    monkeypatch.setattr(flows.cli, "overrides_from_args",
                        lambda *a, **k: parsed.append(a) or parse(*a, **k))
    # (12 steps of one copy of the data: what is checked is the config, not the training)
    code = project_main("fine_tuning", ["--preset", "light", "--platform", "local",
                                        "--artifact-dir", str(tmp_path / "run"),
                                        "--var", "analysis.history_uri=" +
                                        str(tmp_path / "history"),
                                        "--var", "tests.fine_tuning.test_settings.max_steps=12",
                                        "--var", "tests.fine_tuning.test_settings."
                                                 "dataset_replication=1"])
    assert code == 0
    # the run's config was made once (the flow took the command line's); others made
    # without presets are the PR-comment policy's reads of the base file
    assert [c.presets_applied for c in made if c.presets_applied] == [("light", "not_metal")]
    assert len(parsed) == 1  # the command line's arguments were parsed once
    assert (tmp_path / "run" / "config.yaml").is_file()


def test_an_error_raised_while_a_sigterm_was_handled_is_a_termination() -> None:
    """Measured in a deployed run: a SIGTERM while Prefect created a task run made its crash
    handling raise ``ValueError('Task run is not set')``, whose context is the signal; the
    run was reported failed (exit 1) instead of terminated (143)."""
    from prefect.exceptions import TerminationSignal

    from flows.cli import exit_code_for, is_terminated

    try:
        try:
            raise TerminationSignal(signal=signal.SIGTERM)
        except TerminationSignal:
            raise ValueError("Task run is not set")  # noqa: B904 (as Prefect raises it)
    except ValueError as exc:
        chained = exc
    assert is_terminated(chained) and exit_code_for(chained) == 143
    assert not is_terminated(ValueError("a plain failure"))
    interrupted = TerminationSignal(signal=signal.SIGINT)
    assert not is_terminated(interrupted)
    looped = ValueError("a cycle")
    looped.__context__ = ValueError("back")
    looped.__context__.__context__ = looped
    assert not is_terminated(looped)
