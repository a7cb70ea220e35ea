"""Run commands: argv lists without a shell, strings in a strict bash, always with a deadline.

A string command runs as ``bash -c`` with ``errexit``, ``pipefail``, ``nounset`` and
``errtrace`` set, so a failing stage of a pipeline or an unset variable fails the command
instead of being ignored. Each call appends the command, its exit code and its output to
``commands.log`` in the current artifact dir (when one is active).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import StepError
from core.pids import kill_leftovers
from core.safeio import open_append, write_text
from tasks.artifacts import ARTIFACT_DIR

__all__ = [
    "BASH_SAFETY",
    "CMDLINE_FILE",
    "PID_FILE",
    "DEFAULT_TIMEOUT_S",
    "CommandError",
    "CommandResult",
    "CommandTimeout",
    "die_with_parent",
    "run",
    "run_and_catch",
]

logger = logging.getLogger("telltale.runner")

PID_FILE = "workload.pid"
"""Beside a long-lived child this run started: its pid (local cleanup and janitor stop it)."""
CMDLINE_FILE = "workload.cmdline"
"""Its command line, NUL-separated: a recycled pid is never mistaken for it."""

BASH_SAFETY = "set -o errexit -o pipefail -o nounset -o errtrace"
DEFAULT_TIMEOUT_S = 3600.0
_TAIL = 2000


class CommandError(StepError):
    """A command exited non-zero.

    Attributes:
        command: The command as logged.
        returncode: Its exit code.
        stderr_tail: The end of its stderr.
    """

    def __init__(self, command: str, returncode: int, stderr_tail: str) -> None:
        self.command = command
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        tail = f"\n--- stderr (tail) ---\n{stderr_tail}" if stderr_tail.strip() else ""
        super().__init__(f"command failed with exit code {returncode}: {command}{tail}")


class CommandTimeout(StepError, TimeoutError):
    """A command ran past its deadline and was killed."""


@dataclass(frozen=True)
class CommandResult:
    """What a finished command gave back."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float


def _display(argv: Sequence[str], script: str | None) -> str:
    return script if script is not None else shlex.join(argv)


def _log(command: str, result: CommandResult | None, note: str = "") -> None:
    directory = ARTIFACT_DIR.get()
    if directory is None:
        return
    with open_append(directory / "commands.log") as raw, \
            io.TextIOWrapper(raw, encoding="utf-8") as stream:
        stream.write(f"$ {command}\n")
        if result is not None:
            stream.write(f"# exit {result.returncode} in {result.duration_s:.2f}s\n")
            if result.stdout:
                stream.write(result.stdout if result.stdout.endswith("\n")
                             else result.stdout + "\n")
            if result.stderr:
                stream.write("# stderr:\n" + result.stderr)
                stream.write("" if result.stderr.endswith("\n") else "\n")
        if note:
            stream.write(f"# {note}\n")


def run(
    command: Sequence[str] | str,
    *,
    check: bool = True,
    capture: bool = True,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    cwd: str | Path | None = None,
    stdin_file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    output_file: str | Path | None = None,
    pid_file: str | Path | None = None,
    log: bool = True,
    secrets: Sequence[str] = (),
) -> CommandResult:
    """Run a command and return its result.

    Args:
        command: An argv list (no shell involved) or a bash script string (strict mode).
        check: Raise `CommandError` on a non-zero exit.
        capture: Capture stdout/stderr (else they go to this process's streams).
        timeout: Seconds before the command is killed (`CommandTimeout`); None: no limit.
        cwd: Working directory.
        stdin_file: File fed to the command's stdin (else stdin is closed).
        env: Variables added to this process's environment.
        output_file: Stream stdout and stderr, interleaved, into this file instead of memory
            (for long workloads; the stderr tail of an error is then read from the file).
        pid_file: Write ``pid`` of the command (started in its own session, so its whole
            process group can be stopped by a cleanup running elsewhere) to this file.
        log: Append the command and its output to ``commands.log`` in the artifact dir.
        secrets: Strings masked as ``***`` wherever the command or its output is logged or
            raised (passwords passed as arguments, tokens printed by a CLI).

    Returns:
        The `CommandResult`.

    Raises:
        CommandError: Non-zero exit and ``check``.
        CommandTimeout: The deadline passed (the command was killed).
        StepError: The program does not exist.
    """
    script: str | None = None
    if isinstance(command, str):
        script = command
        argv: tuple[str, ...] = ("bash", "-c", f"{BASH_SAFETY}\n{command}")
    else:
        argv = tuple(str(a) for a in command)
        if not argv:
            raise StepError("empty command")
    display = _mask(_display(argv, script), secrets)
    full_env = {**os.environ, **(env or {})} if env else None
    with contextlib.ExitStack() as stack:
        stdin: Any = (stack.enter_context(open(stdin_file, "rb")) if stdin_file is not None
                      else subprocess.DEVNULL)
        if output_file is not None:
            stdout: Any = stack.enter_context(open_append(output_file))
            stderr: Any = subprocess.STDOUT
        elif capture:
            stdout = stderr = subprocess.PIPE
        else:
            stdout = stderr = None
        started = time.monotonic()
        # A workload (pid_file) runs in its own session, tied to our life (die_with_parent).
        launch = die_with_parent(argv) if pid_file is not None else list(argv)
        if pid_file is not None and shutil.which(argv[0]) is None:
            raise StepError(f"program not found: {argv[0]!r} (command: {display})")
        try:
            proc = subprocess.Popen(launch, cwd=cwd, env=full_env, stdin=stdin, stdout=stdout,
                                    stderr=stderr, start_new_session=pid_file is not None)
        except FileNotFoundError as exc:
            raise StepError(f"program not found: {argv[0]!r} (command: {display})") from exc
        if pid_file is not None:
            write_text(Path(pid_file), f"{proc.pid}\n")
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            _stop(proc, group=pid_file is not None)
            if log:
                _log(display, None, f"killed after {timeout}s timeout")
            raise CommandTimeout(f"command timed out after {timeout}s: {display}") from exc
        except BaseException:  # Ctrl-C, cancellation: never leave the child running
            _stop(proc, group=pid_file is not None)
            raise
        if pid_file is not None:  # its own session: what outlived it goes with it
            kill_leftovers(proc.pid)
    def _decode(data: bytes | None) -> str:
        return data.decode("utf-8", errors="replace") if data else ""

    stderr_text = _mask(_decode(err), secrets)
    if output_file is not None:
        stderr_text = _mask(_tail_of(Path(output_file)), secrets)
    result = CommandResult(argv, proc.returncode, _decode(out), stderr_text,
                           time.monotonic() - started)
    logged = result if not secrets else CommandResult(
        tuple(_mask(a, secrets) for a in argv), result.returncode,
        _mask(result.stdout, secrets), result.stderr, result.duration_s)
    if log:
        _log(display, logged if output_file is None else
             CommandResult(argv, proc.returncode, f"(output in {output_file})\n", "",
                           result.duration_s))
    logger.debug("%s -> exit %d (%.2fs)", display, result.returncode, result.duration_s)
    if check and result.returncode != 0:
        raise CommandError(display, result.returncode, result.stderr[-_TAIL:])
    return result


def _mask(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


_PARENT_DEATH = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() == int(sys.argv[1]):  # the parent may already be gone\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "sys.exit(143)\n"
)


def die_with_parent(argv: Sequence[str]) -> list[str]:
    """Wrap ``argv`` so the command gets SIGTERM when this process dies, even by SIGKILL.

    Linux's ``PR_SET_PDEATHSIG`` is set in a tiny Python exec wrapper (thread-safe, unlike a
    ``preexec_fn``), then the command replaces it. A workload or server started in its own
    session (so a terminal's Ctrl-C leaves it to our cleanup) can then never outlive us as
    an orphan. The signal fires when the *thread* that started it ends: start long-lived
    children from the main thread or a thread that lives as long as they do.
    """
    return [sys.executable, "-c", _PARENT_DEATH, str(os.getpid()), *[str(a) for a in argv]]


def _stop(proc: subprocess.Popen[bytes], *, group: bool) -> None:
    """Kill a child (its whole session when it has one) and reap it."""
    try:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _tail_of(path: Path, size: int = _TAIL) -> str:
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - size))
            return stream.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def run_and_catch(
    exc: BaseException | None, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> BaseException | None:
    """Call ``fn`` and keep the first exception, so later cleanup steps still run.

    Usage::

        exc = None
        exc = run_and_catch(exc, capture_state)
        exc = run_and_catch(exc, delete_namespace)
        if exc: raise exc

    Args:
        exc: The first exception seen so far (or None).
        fn: The step to run.
        *args: Positional arguments for ``fn``.
        **kwargs: Keyword arguments for ``fn``.

    Returns:
        ``exc`` if it was set, else the exception ``fn`` raised, else None.
    """
    try:
        fn(*args, **kwargs)
    except Exception as error:
        logger.error("%s failed: %s", getattr(fn, "__name__", fn), error)
        return exc or error
    return exc
