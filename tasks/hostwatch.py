"""Watch this machine during a cell: what the engine's validity checks read (``host.json``).

`HostWatch` reads ``/proc`` at the start and the end of the cell's window (CPU time of the
whole machine, of steal, and of the run's own process tree; pages swapped in; the run's
cgroup's throttling counters) and samples the 1-minute load average and the available
memory once a second in between, on a thread that stops on an event (never a sleep that a
test would wait on). Linux only; elsewhere, or when ``/proc`` is unreadable, no file is
written and the checks that need it are not made.

The run's process tree is this process and its descendants (the flow, the workloads, the
model server, Prometheus and its exporters; an adopted spare Prometheus's keeper and its
children too, `count_as_run`): their CPU time is the run's, everything else's
is "other processes" (four busy loops beside a 2-core run show as ~80 % here). A child
reaped within the window counts through its parent's ``cutime``. The load is sampled the
same way: threads of other processes running or ready to run (the machine's load average
counts the run's own: a vLLM server's threads made a quiet 2-core machine's load 5).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from analysis.validity import HOST_FILE, HostWindow
from core.safeio import write_json

__all__ = ["HostWatch", "count_as_run", "uncount", "watch_host"]

logger = logging.getLogger("telltale.hostwatch")

_PROC = Path("/proc")
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def _cpu_times() -> tuple[float, float, float] | None:
    """(total, busy, steal) CPU seconds of the machine since boot, from ``/proc/stat``."""
    text = _read(_PROC / "stat")
    if not text or not text.startswith("cpu "):
        return None
    fields = [int(x) for x in text.split("\n", 1)[0].split()[1:9]]
    fields += [0] * (8 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq
    return (busy + idle + iowait + steal) / _HZ, busy / _HZ, steal / _HZ


def _processes() -> dict[int, tuple[int, int]]:
    """Every process: pid → (parent pid, CPU ticks of it and its reaped children)."""
    out: dict[int, tuple[int, int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        text = _read(entry / "stat")
        if not text:
            continue
        # the command name is in parentheses and may hold spaces: split after the last ")"
        rest = text[text.rfind(")") + 2:].split()
        if len(rest) < 15:
            continue
        out[int(entry.name)] = (int(rest[1]),
                                int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14]))
    return out


_ALSO_RUN: set[int] = set()  # roots of trees counted as the run's besides its own


def count_as_run(pid: int) -> None:
    """Count ``pid``'s tree as the run's own from now on (`uncount` ends it).

    An adopted spare Prometheus (`tasks.observe.spare`) is the run's observer, but its
    keeper is not a descendant of the run: without this, its CPU time and threads would be
    "other processes" to the validity checks, as they never were when the run started its
    own.
    """
    _ALSO_RUN.add(pid)


def uncount(pid: int) -> None:
    """Stop counting ``pid``'s tree as the run's (see `count_as_run`)."""
    _ALSO_RUN.discard(pid)


def _tree(root: int, processes: dict[int, tuple[int, int]]) -> set[int]:
    """``root`` and its live descendants, and those of the trees counted as the run's."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root, *_ALSO_RUN]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def _tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants (with their reaped children)."""
    processes = _processes()
    return sum(processes.get(pid, (0, 0))[1] for pid in _tree(root, processes)) / _HZ


def _other_runnable(root: int) -> int:
    """Threads running or ready to run now that are not the run's.

    The run's own load is left out: a model server's threads made a quiet 2-core machine's
    load average 5.
    """
    processes = _processes()
    ours = _tree(root, processes)
    count = 0
    for pid in processes:
        if pid in ours:
            continue
        try:
            tasks = list((_PROC / str(pid) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            text = _read(task / "stat")
            if text and text[text.rfind(")") + 2:text.rfind(")") + 3] == "R":
                count += 1
    return count


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (_read(_PROC / "meminfo") or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = int(parts[0]) * 1024
    return out


def _swap_in() -> int | None:
    for line in (_read(_PROC / "vmstat") or "").splitlines():
        if line.startswith("pswpin "):
            return int(line.split()[1])
    return None


def _load1() -> float | None:
    text = _read(_PROC / "loadavg")
    return float(text.split()[0]) if text else None


def _throttling() -> tuple[int, int] | None:
    """(periods, throttled periods) of this process's cgroup (v2), when it is limited."""
    text = _read(_PROC / "self" / "cgroup") or ""
    line = next((x for x in text.splitlines() if x.startswith("0::")), None)
    if line is None:
        return None
    stat = _read(Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "cpu.stat")
    if not stat:
        return None
    values = dict(x.split() for x in stat.splitlines() if len(x.split()) == 2)
    try:
        return int(values["nr_periods"]), int(values["nr_throttled"])
    except (KeyError, ValueError):
        return None


class HostWatch:
    """Measure the machine over a window: `start`, then `stop` → `HostWindow` (or None)."""

    def __init__(self, interval_s: float = 1.0, root_pid: int | None = None) -> None:
        self._interval = interval_s
        self._root = root_pid or os.getpid()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._start: dict[str, Any] = {}
        self._load_max: float | None = None
        self._mem_min: int | None = None
        self._runnable: list[int] = []

    def _sample(self) -> None:
        load = _load1()
        if load is not None:
            self._load_max = load if self._load_max is None else max(self._load_max, load)
        self._runnable.append(_other_runnable(self._root))
        available = _meminfo().get("MemAvailable")
        if available is not None:
            self._mem_min = available if self._mem_min is None else min(self._mem_min,
                                                                         available)

    def _loop(self) -> None:
        while not self._done.wait(self._interval):
            self._sample()

    def start(self) -> bool:
        """Take the start readings and begin sampling; False where ``/proc`` is not there."""
        cpu = _cpu_times()
        if cpu is None:
            return False
        self._start = {"t": time.monotonic(), "cpu": cpu, "tree": _tree_cpu(self._root),
                       "swap": _swap_in(), "throttle": _throttling()}
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="telltale-hostwatch",
                                        daemon=True)
        self._thread.start()
        return True

    def stop(self) -> HostWindow | None:
        """End the window: the `HostWindow` (None when `start` found no ``/proc``)."""
        if self._thread is None:
            return None
        self._done.set()
        self._thread.join()
        self._sample()
        cpu = _cpu_times()
        if cpu is None:
            return None
        first = self._start
        swap_end, swap_start = _swap_in(), first["swap"]
        throttle_end, throttle_start = _throttling(), first["throttle"]
        memory = _meminfo()
        return HostWindow(
            cores=os.cpu_count() or 1, window_s=max(time.monotonic() - first["t"], 0.0),
            cpu_total_s=max(cpu[0] - first["cpu"][0], 0.0),
            cpu_busy_s=max(cpu[1] - first["cpu"][1], 0.0),
            cpu_steal_s=max(cpu[2] - first["cpu"][2], 0.0),
            run_cpu_s=max(_tree_cpu(self._root) - first["tree"], 0.0),
            load1_max=self._load_max, memory_total_bytes=memory.get("MemTotal"),
            other_runnable_mean=sum(self._runnable) / len(self._runnable)
            if self._runnable else None,
            memory_available_min_bytes=self._mem_min,
            swap_in_pages=max(swap_end - swap_start, 0) if swap_end is not None
            and swap_start is not None else None,
            periods=throttle_end[0] - throttle_start[0] if throttle_end and throttle_start
            else None,
            throttled_periods=throttle_end[1] - throttle_start[1] if throttle_end
            and throttle_start else None)


@contextmanager
def watch_host(cell_dir: Path) -> Iterator[None]:
    """Watch the machine while the block runs; write ``<cell_dir>/host.json`` after it.

    Best effort: a machine without ``/proc`` gets no file (its checks are not made), and a
    failure to write it is logged, never the cell's failure.
    """
    watch = HostWatch()
    started = False
    try:
        started = watch.start()
    except (OSError, ValueError) as exc:
        logger.warning("cannot watch this machine (%s): the machine checks are skipped", exc)
    try:
        yield
    finally:
        if started:
            try:
                window = watch.stop()
                if window is not None:
                    write_json(cell_dir / HOST_FILE, window.model_dump())
            except (OSError, ValueError) as exc:
                logger.warning("could not record the machine's window (%s)", exc)
