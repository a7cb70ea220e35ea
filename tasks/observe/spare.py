"""A spare local Prometheus: started when a local run's cells end, adopted by the next run.

Prometheus applies its scrape config on a 5 s discovery tick, and its scrape manager reloads
on another 5 s tick (2.42 has no flag for either): a fresh server gives its first samples
6-12 s after it starts, and a run must not open a cell's window before that (the window's
first seconds would have no samples). A server started for the run is therefore most of the
time between a command line's start and its first cell. So a run whose cells are done leaves
a *spare* (before its post-processing and cleanup, which overlap the spare's start):
a node exporter, a process exporter and a Prometheus, exactly as `PrometheusServer.start_local`
starts them, already scraping when the next run starts, which adopts it with its TSDB.

Who owns what:

- A **keeper** process (``python -m tasks.observe.spare``, detached, in its own session)
  starts the three and is their parent: they die with it (parent-death signal), even when it
  is SIGKILLed. It writes ``spare.json`` once the server is ready.
- **Unclaimed**, it stops them and removes its dir after ``TELLTALE_SPARE_PROMETHEUS_MINUTES``
  (default 10; 0: no spare is ever left), on SIGTERM, or when one of them exits.
- **Adopting** (`adopt`) writes ``claim.json`` (the run's pid and, once known, its artifact
  dir) under the spares' lock, so two runs never adopt one spare. The run then queries it as
  its own server; at its end it asks the keeper to stop the three (``release``), and moves
  their files (config, logs, TSDB) into the run's ``prometheus/`` dir, as a server started
  for the run would have left them. The TSDB also holds the minutes before the run (the
  machine, idle): the run's queries are bounded by its cells' windows.
- If the adopting run dies (SIGKILL), the keeper sees its pid gone, stops the three and moves
  their files into the run's dir itself.

At most one unclaimed spare exists per home (`offer` under the lock); the spares live under
``<local services home>/telltale-spare-prometheus`` (`core.environment.local_services_home`,
beside the shared Prefect API's state). Every run on the local platform takes part
(`tasks.platforms.local_ahead`): a command line adopts one before it imports Prefect, any
other run (a deployment's, a test's) when its platform prepares; each run that ends without
an error or an interrupt offers one in its cleanup.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from core.environment import local_services_home
from core.errors import PermanentServiceError
from core.filelock import dir_lock
from core.loopback import LOOPBACK_URL
from core.pids import pid_alive
from core.safeio import UnreadableInputError, open_append, read_bounded, write_text
from core.terminal import ArgumentParser, say
from tasks.hostwatch import count_as_run, uncount
from tasks.observe.prometheus import PrometheusServer, local_layout, relocate

__all__ = ["ADOPTED_FILE", "SPARES_DIR", "SparePrometheus", "adopt", "offer", "spare_base",
           "spares", "stop_spares"]

SPARES_DIR = "telltale-spare-prometheus"
ADOPTED_FILE = "adopted-spare.json"  # in a run's prometheus/ dir when its server was a spare
_LOCK = "lock"
_RECORD = "spare.json"
_CLAIM = "claim.json"
_RELEASE = "release"
_TICK_S = 0.2  # how often a keeper looks at its claim, its adopter and its deadline
_ROOT = Path(__file__).resolve().parents[2]  # the keeper imports this package from here


def spare_base() -> Path:
    """Where this user's spares live (beside the shared local Prefect API's state)."""
    return local_services_home() / SPARES_DIR


class SpareRecord(BaseModel):
    """``spare.json``: a ready spare, written by its keeper."""

    keeper_pid: int = Field(gt=1)
    url: str = Field(pattern=LOOPBACK_URL)  # an edited record never points elsewhere
    scrape_interval_s: float = Field(gt=0)
    layout: str = Field(max_length=64)  # `local_layout` of the code that started it
    started: float


class Claim(BaseModel):
    """``claim.json``: the run that adopted a spare, and where its files go."""

    pid: int = Field(gt=1)
    relocate_to: str | None = None


def _read(path: Path, model: type[BaseModel]) -> BaseModel | None:
    try:
        return model.model_validate_json(read_bounded(path, 4096, what=path.name))
    except (UnreadableInputError, ValidationError, OSError):
        return None


def _record(directory: Path) -> SpareRecord | None:
    found = _read(directory / _RECORD, SpareRecord)
    return found if isinstance(found, SpareRecord) else None


def _claim(directory: Path) -> Claim | None:
    found = _read(directory / _CLAIM, Claim)
    return found if isinstance(found, Claim) else None


def _keeper_alive(pid: int, directory: Path) -> bool:
    """``pid`` is this dir's keeper (never a recycled pid running something else)."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = read_bounded(f"/proc/{pid}/cmdline", 1 << 20, what="cmdline",
                               follow_links=True)
    except (UnreadableInputError, OSError):
        return False
    return b"tasks.observe.spare" in cmdline and os.fsencode(directory) in cmdline


def spares(base: Path) -> list[Path]:
    """The spare dirs under ``base`` whose keeper still runs."""
    if not base.is_dir():
        return []
    found = []
    for directory in sorted(base.glob("spare-*")):
        record = _record(directory)
        pid = record.keeper_pid if record else _starting_pid(directory)
        if pid is not None and _keeper_alive(pid, directory):
            found.append(directory)
    return found


def _starting_pid(directory: Path) -> int | None:
    try:
        return int(read_bounded(directory / "keeper.pid", 32, what="keeper.pid").strip())
    except (UnreadableInputError, ValueError, OSError):
        return None


def _sweep(base: Path) -> None:
    """Remove the dirs of keepers that are gone (a crashed keeper's, a stale copy).

    Not one a live run still holds: that run moves its files into its own dir when it stops.
    """
    live = set(spares(base))
    for directory in base.glob("spare-*"):
        if directory in live or not directory.is_dir():
            continue
        claim = _claim(directory)
        if claim is None or not pid_alive(claim.pid):
            shutil.rmtree(directory, ignore_errors=True)


def offer(base: Path, *, scrape_interval_s: float, minutes: float) -> Path | None:
    """Leave a spare for the next run (started, not waited for); its dir, or None.

    None when ``minutes`` is 0 or an unclaimed spare the next such run could adopt already
    waits (one at a time). One it could not (another interval, or started by other code or
    binaries: `local_layout`) is no reason: it had kept every run of this layout from a
    spare until it expired (10 minutes), each run waiting ~5 s for its own first scrape.
    """
    if minutes <= 0:
        return None
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    layout = local_layout()
    with dir_lock(base, _LOCK, mode=0o600):
        _sweep(base)
        if any(_claim(d) is None and _suits(_record(d), scrape_interval_s, layout)
               for d in spares(base)):
            return None
        directory = Path(tempfile.mkdtemp(prefix="spare-", dir=base))
        with open_append(directory / "keeper.log") as log:
            keeper = subprocess.Popen(
                [sys.executable, "-m", "tasks.observe.spare", str(directory),
                 "--interval", f"{scrape_interval_s:g}", "--minutes", f"{minutes:g}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=_ROOT)
        write_text(directory / "keeper.pid", f"{keeper.pid}\n")
    return directory


class SparePrometheus(PrometheusServer):
    """A spare adopted by this run: queried as its own, stopped through its keeper."""

    def __init__(self, directory: Path, record: SpareRecord) -> None:
        super().__init__(record.url, data_dir=directory / "prometheus" / "data",
                         scrape_interval_s=record.scrape_interval_s)
        self.local = True  # it scrapes this machine's exporters
        self.directory = directory
        self.keeper_pid = record.keeper_pid
        count_as_run(self.keeper_pid)  # the run's observer: its CPU is the run's, not others'

    @property  # type: ignore[override]
    def relocate_to(self) -> Path | None:
        """Where its files go when it stops; told to the keeper too (if this run dies)."""
        return self.__dict__.get("_relocate_to")

    @relocate_to.setter
    def relocate_to(self, target: Path | None) -> None:
        self.__dict__["_relocate_to"] = target
        if "directory" in self.__dict__:
            write_text(self.directory / _CLAIM, Claim(
                pid=os.getpid(), relocate_to=str(target) if target else None).model_dump_json())

    @property
    def home(self) -> Path | None:
        """The spare's ``prometheus/`` dir (config, logs, TSDB)."""
        return self.directory / "prometheus"

    def alive(self) -> bool:
        """Its keeper still runs (the server and exporters die with it)."""
        return _keeper_alive(self.keeper_pid, self.directory)

    def _check_alive(self) -> None:
        if not self.alive():
            raise PermanentServiceError(f"the spare prometheus's keeper ({self.keeper_pid}) "
                                        f"exited: see {self.directory / 'keeper.log'}",
                                        service="prometheus")

    def _stop_processes(self) -> None:
        """Ask the keeper to stop the three and wait for it; SIGKILL it after 60 s."""
        write_text(self.directory / _RELEASE, "")
        deadline = time.monotonic() + 60.0
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():  # its children get their parent-death signal
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.keeper_pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop it, move its files to the run's dir (when taken), remove the spare's dir."""
        uncount(self.keeper_pid)
        if not self.directory.exists():
            self._client.close()
            return  # its keeper moved them already (this run was taken for dead)
        super().stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def adopt(base: Path, *, scrape_interval_s: float,
          starting_wait_s: float = 20.0) -> SparePrometheus | None:
    """Claim a ready spare scraping every ``scrape_interval_s``; None when there is none.

    A spare whose keeper is still starting it is waited for (up to ``starting_wait_s``): it
    is still closer to its first scrape than a server started now. One started by other
    code or binaries (`local_layout`) is left alone.
    """
    if not base.is_dir():
        return None
    layout = local_layout()
    with dir_lock(base, _LOCK, mode=0o600):
        for directory in spares(base):
            record = _record(directory) or _await_record(directory, starting_wait_s)
            if record is None or _claim(directory) is not None \
                    or not _suits(record, scrape_interval_s, layout):
                continue
            server = SparePrometheus(directory, record)
            try:
                server._wait_ready(5.0)
            except Exception:
                uncount(server.keeper_pid)
                server._client.close()
                continue
            server.relocate_to = None  # writes the claim
            # provenance in the run's prometheus/ dir: its TSDB starts before the run
            write_text(directory / "prometheus" / ADOPTED_FILE, json.dumps(
                {**record.model_dump(), "adopted": time.time()}, indent=2) + "\n")
            return server
    return None


def _suits(record: SpareRecord | None, scrape_interval_s: float, layout: str) -> bool:
    """Whether a spare of this record suits a run of this interval and layout.

    A spare still starting (no record yet) is taken to.
    """
    return record is None or (record.scrape_interval_s == scrape_interval_s
                              and record.layout == layout)


def _await_record(directory: Path, timeout_s: float) -> SpareRecord | None:
    """The record of a spare still starting, once written; None if its keeper gives up."""
    pid = _starting_pid(directory)
    deadline = time.monotonic() + timeout_s
    while pid is not None and _keeper_alive(pid, directory) and time.monotonic() < deadline:
        if (directory / _RECORD).exists():  # written: usable or not, no more waiting
            return _record(directory)
        time.sleep(0.05)
    return _record(directory)


def stop_spares(base: Path, timeout_s: float = 30.0) -> int:
    """Stop every unclaimed spare under ``base`` now; how many were running."""
    stopped = 0
    with dir_lock(base, _LOCK, mode=0o600) if base.is_dir() else contextlib.nullcontext():
        for directory in spares(base):
            if _claim(directory) is not None:
                continue  # a run's own server now: its run stops it
            record = _record(directory)
            pid = record.keeper_pid if record else _starting_pid(directory)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while _keeper_alive(pid, directory) and time.monotonic() < deadline:
                time.sleep(0.05)
            stopped += 1
    return stopped


def _keep(directory: Path, scrape_interval_s: float, idle_s: float) -> int:
    """The keeper: start the three, wait to be adopted or to expire, stop them."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    home = directory / "prometheus"
    try:
        server = PrometheusServer.start_local(home, scrape_interval_s=scrape_interval_s)
    except Exception as exc:
        say(f"spare prometheus not started: {exc}", error=True)
        shutil.rmtree(directory, ignore_errors=True)
        return 1
    write_text(directory / _RECORD, SpareRecord(
        keeper_pid=os.getpid(), url=server.url, scrape_interval_s=scrape_interval_s,
        layout=local_layout(), started=time.time()).model_dump_json())
    deadline = time.monotonic() + idle_s
    keep_files = False
    while not stopping.wait(_TICK_S):
        claim = _claim(directory)
        if claim is not None:
            if (directory / _RELEASE).exists():
                keep_files = True  # the adopter moves them once we are gone
                break
            if not pid_alive(claim.pid):  # the adopting run died: its files go to its dir
                server.stop()
                if claim.relocate_to:
                    relocate(home, Path(claim.relocate_to))
                shutil.rmtree(directory, ignore_errors=True)
                return 0
        elif not server.alive() or time.monotonic() > deadline:
            with dir_lock(directory.parent, _LOCK, mode=0o600):
                if _claim(directory) is None:  # not adopted meanwhile
                    (directory / _RECORD).unlink(missing_ok=True)
                    break
    keep_files = keep_files or _claim(directory) is not None
    server.stop()
    if not keep_files:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tasks.observe.spare DIR --interval S --minutes M``: a keeper."""
    parser = ArgumentParser(prog="python -m tasks.observe.spare",
                            description="Keep a spare local Prometheus (internal).")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--minutes", type=float, required=True)
    args = parser.parse_args(argv)
    return _keep(args.directory, args.interval, args.minutes * 60)


if __name__ == "__main__":
    sys.exit(main())
