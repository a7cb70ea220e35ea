"""Energy and GPU counters of the local machine, sampled over a cell's test window.

Two meters, each used only when this machine has it (nothing is estimated):

- **NVML** (NVIDIA's management library, through ``nvidia-ml-py``): per GPU, the board's
  total-energy counter (mJ since the driver loaded), its power draw (mW), utilisation and
  memory in use. Used when ``libnvidia-ml.so.1`` loads and reports a device.
- **RAPL** (``/sys/class/powercap/intel-rapl:N``, Intel and AMD CPUs): each CPU package's
  energy counter (µJ, wrapping at ``max_energy_range_uj``), read through the bounded reader.
  Used when a package's ``energy_uj`` is readable (many kernels make it root-only).

`EnergyRecorder` samples both in a thread while the cell runs and writes
``<step>/energy/series.parquet`` in the Prometheus capture's tidy form (``query``, ``labels``,
``timestamp``, ``value``). Query names are the contract with the parser
(`projects.library.energy`), the same names the cluster's DCGM queries use:
``gpu_energy_joules`` (a counter), ``gpu_power_watts``, ``gpu_util_percent``,
``gpu_memory_used_bytes``, ``cpu_energy_joules`` (a counter, unwrapped here). Post-processing
integrates them over each KPI's own window (the training steps, the load window), not the
cell's.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from core.safeio import UnreadableInputError, atomic_open, read_text_bounded, write_text

__all__ = ["ENERGY_STEP", "EnergyRecorder", "Reading", "NvmlMeter", "RaplMeter", "meters",
           "record_energy", "write_series"]

logger = logging.getLogger("telltale.energy")

ENERGY_STEP = "observe__capture_energy"
POWERCAP_ROOT = Path("/sys/class/powercap")
_SAMPLE_S = 0.25  # a quarter second: power peaks of a training step are seen, cost ~0.1 % CPU
_MAX_SAMPLES = 200_000  # per series: ~14 h at the sample rate; older samples are thinned out


@dataclass(frozen=True)
class Reading:
    """One value of one series at one instant."""

    query: str
    labels: dict[str, str]
    value: float


class Meter(Protocol):
    """A source of readings (`NvmlMeter`, `RaplMeter`)."""

    name: str

    def read(self) -> list[Reading]:
        """The meter's readings now (an empty list: nothing readable this time)."""
        ...

    def close(self) -> None:
        """Release what the meter holds."""
        ...


class NvmlMeter:
    """Every GPU NVML sees: energy counter, power, utilisation, memory in use."""

    name = "nvml"

    def __init__(self) -> None:
        import pynvml  # nvidia-ml-py: loads libnvidia-ml.so.1 on nvmlInit

        self._nvml = pynvml
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count < 1:
                raise RuntimeError("NVML reports no GPU")
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self._handles]
        except Exception:
            pynvml.nvmlShutdown()
            raise

    def read(self) -> list[Reading]:
        """Each GPU's counters; a value NVML cannot give (an old board, a MIG slice) is left out."""
        nvml, out = self._nvml, []
        for index, handle in enumerate(self._handles):
            labels = {"gpu": str(index), "name": self.names[index]}
            for query, call, scale in (
                    ("gpu_energy_joules", nvml.nvmlDeviceGetTotalEnergyConsumption, 1e-3),
                    ("gpu_power_watts", nvml.nvmlDeviceGetPowerUsage, 1e-3),
                    ("gpu_util_percent", lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu,
                     1.0),
                    ("gpu_memory_used_bytes", lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used,
                     1.0)):
                try:
                    out.append(Reading(query, labels, float(call(handle)) * scale))
                except nvml.NVMLError:
                    continue
        return out

    def close(self) -> None:
        """Shut NVML down."""
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


class RaplMeter:
    """The CPU packages' energy counters (``intel-rapl:N/energy_uj``), unwrapped."""

    name = "rapl"

    def __init__(self, root: Path = POWERCAP_ROOT) -> None:
        self._zones: list[tuple[str, Path, float]] = []
        for zone in sorted(root.glob("intel-rapl:*")):
            if zone.name.count(":") != 1:  # intel-rapl:0:0 is a subzone (cores, dram)
                continue
            try:
                label = read_text_bounded(zone / "name", 256, what="RAPL zone name",
                                          follow_links=True).strip()
                wrap = float(read_text_bounded(zone / "max_energy_range_uj", 64,
                                               what="RAPL range", follow_links=True))
                float(read_text_bounded(zone / "energy_uj", 64, what="RAPL counter",
                                        follow_links=True))
            except (OSError, ValueError, UnreadableInputError):
                continue  # root-only on many kernels: that zone is not measurable
            self._zones.append((label or zone.name, zone / "energy_uj", wrap))
        if not self._zones:
            raise RuntimeError(f"no readable RAPL package under {root}")
        self._last: dict[str, float] = {}
        self._offset: dict[str, float] = {}

    def read(self) -> list[Reading]:
        """Each package's energy since the meter opened its zones, in joules (wraps undone)."""
        out = []
        for label, path, wrap in self._zones:
            try:
                raw = float(read_text_bounded(path, 64, what="RAPL counter", follow_links=True))
            except (OSError, ValueError, UnreadableInputError):
                continue
            last = self._last.get(label)
            if last is not None and raw < last:
                if last - raw < wrap / 2:
                    # Not a wrap: one would drop by nearly the whole range (half of it in a
                    # sample is megawatts). A counter read backwards is a bad sample, left
                    # out rather than counted as a whole range of joules.
                    logger.debug("RAPL %s read backwards (%s after %s): sample left out",
                                 label, raw, last)
                    continue
                self._offset[label] = self._offset.get(label, 0.0) + wrap  # it wrapped
            self._last[label] = raw
            joules = (raw + self._offset.get(label, 0.0)) * 1e-6
            out.append(Reading("cpu_energy_joules", {"zone": label}, joules))
        return out

    def close(self) -> None:
        """Nothing to release."""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def meters(*, gpu: bool = True, rapl_root: Path | None = None) -> list[Meter]:
    """The meters this machine has (none: nothing measurable; never an error).

    Args:
        gpu: Try NVML (False: the workload uses no GPU, an idle board's energy is not its).
        rapl_root: Where the powercap zones are (default ``/sys/class/powercap``, or
            ``TELLTALE_POWERCAP_ROOT``: a container that mounts the host's sysfs elsewhere).
    """
    found: list[Meter] = []
    if gpu:
        try:
            found.append(NvmlMeter())
        except Exception as exc:  # no library, no driver, no device: not measurable here
            logger.debug("NVML not used: %s", exc)
    root = rapl_root or Path(os.environ.get("TELLTALE_POWERCAP_ROOT") or POWERCAP_ROOT)
    try:
        found.append(RaplMeter(root))
    except RuntimeError as exc:
        logger.debug("RAPL not used: %s", exc)
    return found


@dataclass
class EnergyRecorder:
    """Samples ``meters`` every ``interval_s`` in a daemon thread until `stop`."""

    meters: list[Meter]
    interval_s: float = _SAMPLE_S
    rows: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        """Read every meter once (the first and last samples bracket the window)."""
        now = datetime.now(UTC)
        for meter in self.meters:
            try:
                readings = meter.read()
            except Exception as exc:  # a meter that fails mid-run: its samples stop there
                logger.warning("energy meter %s: %s", meter.name, exc)
                continue
            self.rows += [{"query": r.query, "labels": json.dumps(r.labels, sort_keys=True),
                           "timestamp": now, "value": r.value} for r in readings]
        if len(self.rows) > _MAX_SAMPLES * 8:
            # a very long cell: keep every other sample (the counters still integrate right)
            stamps = sorted({r["timestamp"] for r in self.rows})[::2]
            keep = set(stamps) | {now}
            self.rows = [r for r in self.rows if r["timestamp"] in keep]

    def start(self) -> EnergyRecorder:
        """Take the first sample and start the thread."""
        self.sample()
        self._thread = threading.Thread(target=self._run, name="telltale-energy", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> list[dict[str, Any]]:
        """Stop the thread, take the last sample, close the meters; the rows (once)."""
        if self._stop.is_set():
            return self.rows
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        for meter in self.meters:
            meter.close()
        return self.rows


def write_series(rows: list[dict[str, Any]], out_dir: Path,
                 sources: list[str]) -> dict[str, Any]:
    """Write ``out_dir/series.parquet`` (the capture's tidy form) and ``capture.json``."""
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows, columns=["query", "labels", "timestamp", "value"])
    with atomic_open(out_dir / "series.parquet") as stream:
        frame.to_parquet(stream, index=False)
    summary = {"sources": sources, "rows": len(frame),
               "queries": sorted(set(frame["query"])) if len(frame) else []}
    write_text(out_dir / "capture.json", json.dumps(summary, indent=2) + "\n")
    return summary


@contextmanager
def record_energy(*, gpu: bool, rapl_root: Path | None = None,
                  interval_s: float = _SAMPLE_S) -> Iterator[EnergyRecorder | None]:
    """Sample this machine's meters while the block runs; None when it has none."""
    found = meters(gpu=gpu, rapl_root=rapl_root)
    if not found:
        yield None
        return
    recorder = EnergyRecorder(found, interval_s=interval_s).start()
    try:
        yield recorder
    finally:
        recorder.stop()
