"""Prometheus for a run: a real local server on this machine, its lifetime, TSDB snapshots.

The local platform starts, for the whole run, a ``prometheus-node-exporter`` (and
``prometheus-process-exporter`` when installed) and a ``prometheus`` on 127.0.0.1 (free
ports), the server's TSDB in ``<run>/prometheus/data``, a short scrape interval, the admin
API on (for snapshots). After each cell, the cell's test window is queried
(`tasks.observe.promql.capture_window`); the run's TSDB is snapshotted at the end
(`PrometheusServer.snapshot`).

Processes are started like workloads: their own session (a terminal's Ctrl-C leaves them to
our cleanup), ``PR_SET_PDEATHSIG`` (a SIGKILLed CLI leaves no orphan), pid and command-line
files the local cleanup and ``python -m flows.cleanup`` know.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.errors import ConfigError, PermanentServiceError, TransientServiceError
from core.loopback import loopback_address, loopback_url
from core.safeio import write_text
from tasks.observe.promql import MAX_ANSWER, MAX_POINTS, QueryResult, Series, duration
from tasks.process import ManagedProcess, free_port, free_ports

__all__ = ["PrometheusServer", "find_binaries", "keep_ahead", "local_layout", "local_wanted",
           "relocate", "start_ahead", "stop_ahead", "take_ahead"]

logger = logging.getLogger("telltale.prometheus")

# process-exporter's group of the workloads of Telltale cells on this machine: a process
# whose command line holds a cell's step dir (``.../NNN__cell/NNN__<project>__<step>/...``;
# the CLI and Prefect's server name only the run dir). Fan-out users are forks of it.
_PROCESS_GROUPS = {"process_names": [{"name": "workload",
                                      "cmdline": [r"/[0-9]+__cell/[0-9]+__[^/]+__[^/]+/"]}]}

def local_wanted(block: Any) -> bool:
    """Whether a run's ``observe.prometheus`` block asks for a local Prometheus now.

    ``off``: never; ``auto``: when the binaries are installed; ``on``: always (a missing
    binary is then `PrometheusServer.start_local`'s clear error).
    """
    return block.mode == "on" or (block.mode == "auto" and find_binaries() is not None)


def find_binaries() -> tuple[str, str] | None:
    """Paths of ``prometheus`` and the node exporter (Debian or upstream name), or None."""
    server = shutil.which("prometheus")
    exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    return (server, exporter) if server and exporter else None


# what `PrometheusServer.start_local` runs besides ports and paths (`local_layout` digests it)
_NODE_FLAGS = ("--collector.disable-defaults", "--collector.cpu", "--collector.meminfo",
               "--collector.loadavg", "--collector.stat")
_SERVER_FLAGS = ("--web.enable-admin-api", "--storage.tsdb.retention.time=30d",
                 "--log.level=warn")
# no per-thread series, and no smaps_rollup read of every process each scrape (its
# proportional memory is queried nowhere: `promql.LOCAL_QUERIES` reads memtype="resident"):
# the exporter read all of /proc every second in 6.9 ms a scrape beside three torch
# processes, 5.6 ms without smaps (-20 %; docs/performance.md, session 46)
_PROCESS_FLAGS = ("-threads=false", "-gather-smaps=false")


def _process_exporter() -> str | None:
    return shutil.which("prometheus-process-exporter") or shutil.which("process-exporter")


# The workload group's series must be there before any workload: process-exporter makes a
# group at the first scan that finds one of its processes, and a rate needs a sample before
# it. A fresh exporter's group began at the trainer's first scrape, and a ~3-s trainer
# scraped every 2 s (the light preset) had no CPU rate one run in two, where a spare that
# had seen earlier runs' workloads had one. A primer whose command line matches the group,
# seen by the exporter once and gone before Prometheus scrapes it, makes every exporter as
# a spare is: the group there from the start, its count of the primer's milliseconds
# constant, its memory 0 once the primer has gone.
_PRIMER_DIR = "000__cell/000__telltale__process_group"
_PRIMED = 'namedprocess_namegroup_num_procs{groupname="workload"}'


def _prime_workload_group(exporter: ManagedProcess, port: int, home: Path,
                          timeout_s: float) -> None:
    """Have the process exporter on ``port`` make its workload group now (see above).

    The primer is a Python that reads its stdin to the end: it exits when it is closed,
    here or by this process's death. Best effort: without it the group begins at the
    workload's first scrape, as before (warned).
    """
    import subprocess
    import sys

    import httpx

    marker = f"{home / _PRIMER_DIR}/"  # not a dir: only its name is read, by the exporter
    primer = subprocess.Popen([sys.executable, "-S", "-c", "import sys; sys.stdin.read()",
                               marker], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=10.0) as client:
            while True:  # the exporter scans /proc at each request: the first that answers
                try:
                    if _PRIMED in client.get(f"{loopback_url(port)}/metrics").text:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                if exporter.proc.poll() is not None:
                    return  # it exited: the server's start says so, with its log
                if time.monotonic() > deadline:
                    logger.warning("process exporter: no workload group after %.0f s: a "
                                   "workload scraped once will have no CPU rate", timeout_s)
                    return
                time.sleep(0.05)
    finally:
        primer.communicate()  # closes its stdin: it exits


def local_layout() -> str:
    """A digest of what `PrometheusServer.start_local` would start now.

    Its binaries, flags and process groups: a server started by other code or other binaries
    is not the same server.
    """
    parts = [find_binaries(), _process_exporter(), _NODE_FLAGS, _SERVER_FLAGS,
             _PROCESS_FLAGS, _PROCESS_GROUPS, _PRIMER_DIR]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


class PrometheusServer:
    """A Prometheus to query: a URL (a cluster's, with a bearer token) or one we started."""

    def __init__(self, url: str, *, token: str | None = None, verify_tls: bool = True,
                 processes: Sequence[ManagedProcess] = (), data_dir: Path | None = None,
                 scrape_interval_s: float = 1.0) -> None:
        self.url = url.rstrip("/")
        self.scrape_interval_s = scrape_interval_s
        self.data_dir = data_dir
        self._processes = list(processes)
        self._scraped = False
        self.local = bool(processes)  # ours: it scrapes the node exporter itself
        self.relocate_to: Path | None = None
        # httpx (~0.2 s) is imported where a server is made, not with this module: every
        # command line imports it (through the spare's), a plan or a user error needs none
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=30.0,
                                    verify=verify_tls)

    @classmethod
    def start_local(cls, home: Path, *, scrape_interval_s: float = 1.0,
                    extra_targets: Mapping[str, str] | None = None,
                    ready_timeout_s: float = 120.0) -> PrometheusServer:
        """Start a node exporter and a Prometheus scraping it (and ``extra_targets``).

        Args:
            home: ``<run>/prometheus``: config, logs, pid files, the TSDB in ``data/``.
            scrape_interval_s: Scrape and evaluation interval.
            extra_targets: Job name -> ``host:port`` (e.g. a model server's ``/metrics``).
            ready_timeout_s: How long the server may take to say it is ready.

        Raises:
            ConfigError: The binaries are not installed (with how to install them).
            TransientServiceError: The server did not become ready (its log's tail is said).
        """
        found = find_binaries()
        if found is None:
            raise ConfigError("prometheus and prometheus-node-exporter are not installed: "
                              "`sudo apt-get install prometheus prometheus-node-exporter` "
                              "(Debian/Ubuntu), or set observe.prometheus.mode: off",
                              key="observe.prometheus.mode")
        server_bin, exporter_bin = found
        home.mkdir(parents=True, exist_ok=True)
        exporter_port, server_port, process_port = free_ports(3)  # distinct: held together
        exporter = ManagedProcess("node-exporter", [
            exporter_bin, f"--web.listen-address={loopback_address(exporter_port)}",
            *_NODE_FLAGS],
            home / "node-exporter")
        processes = [exporter]
        targets = {"node": loopback_address(exporter_port)}
        process_bin = _process_exporter()
        if process_bin:  # optional: the workload's own processes, apart from the machine
            write_text(home / "process-exporter.yml", json.dumps(_PROCESS_GROUPS))
            processes.append(ManagedProcess("process-exporter", [
                process_bin, f"-web.listen-address={loopback_address(process_port)}",
                f"-config.path={home / 'process-exporter.yml'}", *_PROCESS_FLAGS],
                home / "process-exporter"))
            targets["process"] = loopback_address(process_port)
            try:
                _prime_workload_group(processes[-1], process_port, home, ready_timeout_s)
            except BaseException:  # a Ctrl-C while it waits: nothing started is left
                for process in processes:
                    process.stop()
                raise
        interval = duration(max(scrape_interval_s, 0.2))
        targets.update(extra_targets or {})
        config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
                  "scrape_configs": [{"job_name": job, "static_configs": [
                      {"targets": [target]}]} for job, target in targets.items()]}
        write_text(home / "prometheus.yml", json.dumps(config, indent=2))
        data = home / "data"
        server = ManagedProcess("prometheus", [
            server_bin, f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address={loopback_address(server_port)}",
            *_SERVER_FLAGS], home / "server")
        prometheus = cls(loopback_url(server_port), processes=[*processes, server],
                         data_dir=data, scrape_interval_s=scrape_interval_s)
        try:
            prometheus._wait_ready(ready_timeout_s)
        except BaseException:
            prometheus.stop()
            raise
        logger.info("prometheus on %s (scrape every %s, TSDB in %s)", prometheus.url,
                    interval, data)
        return prometheus

    @classmethod
    def open_tsdb(cls, home: Path, *, scrape_interval_s: float = 1.0,
                  ready_timeout_s: float = 120.0) -> PrometheusServer:
        """Serve the TSDB in ``home/data`` (a snapshot's copy) for queries, scraping nothing.

        Raises:
            ConfigError: ``prometheus`` is not installed.
        """
        server_bin = shutil.which("prometheus")
        if server_bin is None:
            raise ConfigError("prometheus is not installed: `sudo apt-get install prometheus`",
                              key="observe.prometheus.mode")
        port = free_port()
        write_text(home / "prometheus.yml", "{}\n")
        server = ManagedProcess("prometheus", [
            server_bin, f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address={loopback_address(port)}",
            # the snapshot's blocks may be old: a short retention would delete them at start
            "--storage.tsdb.retention.time=36500d", "--log.level=warn"], home / "server")
        prometheus = cls(loopback_url(port), processes=[server],
                         data_dir=home / "data", scrape_interval_s=scrape_interval_s)
        prometheus.local = False  # nothing is scraped: never wait for a sample
        try:
            prometheus._wait_ready(ready_timeout_s)
        except BaseException:
            prometheus.stop()
            raise
        return prometheus

    def alive(self) -> bool:
        """Every process we started still runs."""
        return all(p.proc.poll() is None for p in self._processes)

    def _check_alive(self) -> None:
        """Raise when a process we started has exited (with its log's tail)."""
        for process in self._processes:
            if process.proc.poll() is not None:
                raise PermanentServiceError(
                    f"{process.name} exited with {process.proc.returncode}: "
                    f"{process.tail().strip()[-500:]}", service="prometheus")

    def __repr__(self) -> str:  # step parameters show this
        return f"PrometheusServer({self.url!r})"

    def _wait_ready(self, timeout_s: float) -> None:
        self._wait(timeout_s, "ready", lambda: self._client.get("/-/ready").status_code == 200)

    @property
    def scraped(self) -> bool:
        """`wait_scraped` has returned: every window from now on is sampled from its start."""
        return self._scraped

    def wait_scraped(self, timeout_s: float = 120.0) -> None:
        """Wait until the node exporter has been scraped twice (once per server).

        Prometheus applies its scrape config on a 5 s discovery tick after start: a window
        opened earlier has no samples for its first seconds, and a short cell none at all
        (its resource KPIs would come and go between runs). Two samples, not one: a rate
        evaluated at the window's start looks back over samples taken before it (one
        sample there left a one-second cell with no CPU rate at all). The server is
        started ahead of the run (`start_ahead`), so that the tick overlaps the run's own
        start.
        """
        if self._scraped:
            return
        self._wait(timeout_s, "scraping its node exporter",
                   lambda: self._node_samples("count_over_time(up{job=\"node\"}[10m])") >= 2)
        self._scraped = True

    def wait_sample_after(self, moment: datetime) -> None:
        """Wait until the node exporter has been scraped at or after ``moment``.

        So the window's last evaluation has a fresh sample: without it a cell shorter than
        the rate window had no CPU series. Costs at most one scrape interval.
        """
        self._wait(10 * self.scrape_interval_s + 10, "scraping after the window",
                   lambda: self._node_samples("timestamp(up{job=\"node\"})")
                   >= moment.timestamp())

    def _node_samples(self, query: str) -> float:
        answer = self._client.get("/api/v1/query", params={"query": query})
        result = answer.json().get("data", {}).get("result", [])
        values = [float(r["value"][1]) for r in result if isinstance(r, dict)]
        return max(values, default=0.0)

    def _wait(self, timeout_s: float, what: str, done: Callable[[], bool]) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            self._check_alive()
            try:
                if done():
                    return
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
            if time.monotonic() > deadline:
                raise TransientServiceError(f"prometheus not {what} after {timeout_s:.0f} s",
                                            service="prometheus")
            time.sleep(0.2)

    def query_range(self, query: str, start: datetime, end: datetime,
                    step_s: float) -> list[Series]:
        """Run a range query; the answer is validated (and bounded) before it is used.

        Raises:
            TransientServiceError: Unreachable, or a 5xx/429 (worth a retry).
            PermanentServiceError: Refused (4xx: a bad query, a bad token) or malformed.
        """
        import httpx

        # Prometheus refuses more than 11 000 points a series: widen the step to fit
        span = max((end - start).total_seconds(), 0.0)
        step = max(step_s, math.ceil(span / (MAX_POINTS - 1) * 1000) / 1000, 0.001)
        # evaluate at ``end`` itself (the last point a range query gives is on the step
        # grid from ``start``): the grid is moved back by less than one step
        start = end - timedelta(seconds=math.ceil(span / step) * step)
        try:
            answer = self._client.get("/api/v1/query_range", params={
                "query": query, "start": f"{start.timestamp():.3f}",
                "end": f"{end.timestamp():.3f}", "step": f"{step:g}"})
        except httpx.HTTPError as exc:
            raise TransientServiceError(f"prometheus {self.url}: {exc}",
                                        service="prometheus") from exc
        if answer.status_code >= 500 or answer.status_code == 429:
            raise TransientServiceError(f"prometheus {self.url}: HTTP {answer.status_code}",
                                        service="prometheus")
        if answer.status_code != 200:
            raise PermanentServiceError(
                f"prometheus {self.url} refused {query!r}: HTTP {answer.status_code} "
                f"{answer.text[:200]!r}", service="prometheus")
        if len(answer.content) > MAX_ANSWER:
            raise PermanentServiceError(f"prometheus answer over {MAX_ANSWER} bytes",
                                        service="prometheus")
        try:
            return QueryResult.model_validate_json(answer.content).data.result
        except ValidationError as exc:
            raise PermanentServiceError(f"prometheus {self.url}: malformed answer: "
                                        f"{str(exc).splitlines()[0]}",
                                        service="prometheus") from None

    def snapshot_name(self) -> str | None:
        """Ask the admin API for a TSDB snapshot; its name, or None when refused.

        A cluster's Prometheus usually has the admin API off (403/404): then the range
        queries of each cell are all there is, which is enough for post-processing.
        """
        import httpx

        try:
            answer = self._client.post("/api/v1/admin/tsdb/snapshot")
            name = answer.json()["data"]["name"] if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            name = None
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}",
                                                          name):
            logger.info("prometheus %s gave no snapshot", self.url)
            return None
        return name

    def snapshot(self) -> Path | None:
        """A TSDB snapshot of a server we started: its dir, or None when refused."""
        name = self.snapshot_name()
        return self.data_dir / "snapshots" / name if name and self.data_dir else None

    def stop(self) -> None:
        """Stop what we started (the server first: it closes its TSDB), close the client.

        A server started ahead of its run (`start_ahead`) then moves its TSDB, config and
        logs into the run's ``prometheus/`` dir: the artifact holds them as if it had been
        started there.
        """
        self._stop_processes()
        self._client.close()
        if self.relocate_to is not None and self.home is not None:
            relocate(self.home, self.relocate_to)
            self.data_dir = self.relocate_to / "data"
            self.relocate_to = None

    def _stop_processes(self) -> None:
        for process in reversed(self._processes):
            process.stop()

    @property
    def home(self) -> Path | None:
        """The dir of its config, logs and TSDB, when we started it."""
        return self._processes[0].home.parent if self._processes else None


def relocate(home: Path, target: Path) -> None:
    """Move a stopped server's files (config, logs, TSDB) from ``home`` into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(home.iterdir()):
        # safeio-exempt: moves this run's own Prometheus files into its artifact dir
        shutil.move(str(entry), str(target / entry.name))
    shutil.rmtree(home, ignore_errors=True)


_AHEAD: list[PrometheusServer] = []  # started by a CLI before its run exists (one per process)


def start_ahead(parent: Path, *, scrape_interval_s: float, ready_timeout_s: float) -> None:
    """Start the local Prometheus before the run does, in a hidden dir of ``parent``.

    Prometheus applies its scrape config on a 5 s tick after start; a CLI run spends longer
    than that starting its temporary Prefect API, so started then, the first scrape is
    long done when the first cell begins. The run takes it with `take_ahead`;
    `stop_ahead` stops one it never took.
    """
    parent.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix=".prometheus-", dir=parent))
    _AHEAD.append(PrometheusServer.start_local(home, scrape_interval_s=scrape_interval_s,
                                               ready_timeout_s=ready_timeout_s))


def keep_ahead(server: PrometheusServer) -> None:
    """Hold ``server`` (a spare this run adopted) for the run to take, as if started ahead."""
    _AHEAD.append(server)


def take_ahead(home: Path, scrape_interval_s: float) -> PrometheusServer | None:
    """The server started ahead (its files go to ``home`` when it stops), or None."""
    while _AHEAD:
        server = _AHEAD.pop()
        if server.scrape_interval_s == scrape_interval_s and server.alive():
            server.relocate_to = home
            return server
        server.stop()
    return None


def stop_ahead() -> None:
    """Stop a server started ahead that no run took, and remove its dir."""
    while _AHEAD:
        server = _AHEAD.pop()
        server.stop()
        if server.home is not None:
            shutil.rmtree(server.home, ignore_errors=True)
