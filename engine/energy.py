"""Energy meters, shared by every backend.

* ``nvml_counter``: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  millijoules, Volta and newer) read at both edges of the request window, with
  CUDA synchronised first so queued kernels are counted.
* ``nvml_power_poll``: where the counter is missing, power (``nvmlDeviceGetPowerUsage``,
  milliwatts) polled every 50 ms on a thread and integrated with the trapezoid rule.
* ``estimate``: no meter on the machine (a CPU box without readable RAPL): process CPU
  time x an assumed power per busy core. Clearly an estimate, labelled as such.

A window shorter than the counter's update period is flagged (``short_window``):
its reading may be zero or a whole period's worth.

The NVML module is injectable so the arithmetic is tested against a fake device.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psutil

#: NVML updates its energy counter roughly every 100 ms on recent GPUs.
NVML_UPDATE_PERIOD_S = 0.1
#: Assumed average power of one busy server core for the CPU estimate (W).
DEFAULT_WATTS_PER_CORE = 4.0


@dataclass
class EnergyReading:
    joules: float
    source: str
    seconds: float
    short_window: bool = False


class CpuTimeEstimate:
    """Energy ~= process CPU seconds (all threads) x watts per busy core."""

    source = "estimate"

    def __init__(self, watts_per_core: float = DEFAULT_WATTS_PER_CORE, clock=time.process_time,
                 wall=time.perf_counter):
        self.watts_per_core = watts_per_core
        self._clock, self._wall = clock, wall

    def start(self):
        self._c0, self._w0 = self._clock(), self._wall()

    def stop(self) -> EnergyReading:
        cpu = self._clock() - self._c0
        return EnergyReading(cpu * self.watts_per_core, self.source, self._wall() - self._w0)

    def describe(self) -> str:
        return f"process CPU seconds x {self.watts_per_core:g} W per busy core (estimate)"


def _sync():
    try:
        import torch  # lazy: torch is heavy, and absent on a CPU-only install

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except ImportError:
        pass


class NvmlCounter:
    source = "nvml_counter"

    def __init__(self, nvml, handle, sync=_sync, wall=time.perf_counter):
        self.nvml, self.handle, self._sync, self._wall = nvml, handle, sync, wall

    def start(self):
        self._sync()
        self._e0 = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        self._w0 = self._wall()

    def stop(self) -> EnergyReading:
        self._sync()
        e1 = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        secs = self._wall() - self._w0
        return EnergyReading((e1 - self._e0) / 1000.0, self.source, secs,
                             short_window=secs < NVML_UPDATE_PERIOD_S)

    def describe(self) -> str:
        return "NVML total-energy counter"


class NvmlPowerPoll:
    source = "nvml_power_poll"

    def __init__(self, nvml, handle, interval_s: float = 0.05, sync=_sync, wall=time.perf_counter):
        self.nvml, self.handle, self.interval_s = nvml, handle, interval_s
        self._sync, self._wall = sync, wall
        self.samples: list[tuple[float, float]] = []

    def _sample(self):
        self.samples.append((self._wall(), self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0))

    def _run(self):
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self):
        self._sync()
        self.samples = []
        self._stop = threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> EnergyReading:
        self._sync()
        self._stop.set()
        self._thread.join()
        self._sample()
        joules = trapezoid_joules(self.samples)
        secs = self.samples[-1][0] - self.samples[0][0]
        return EnergyReading(joules, self.source, secs, short_window=secs < 2 * self.interval_s)

    def describe(self) -> str:
        return f"NVML power polled every {self.interval_s * 1000:.0f} ms, trapezoid rule"


def trapezoid_joules(samples: list[tuple[float, float]]) -> float:
    """Integrate (time s, power W) samples with the trapezoid rule."""
    total = 0.0
    for (t0, p0), (t1, p1) in zip(samples, samples[1:]):
        total += (t1 - t0) * (p0 + p1) / 2
    return total


def process_tree_cpu_seconds() -> float:
    """CPU seconds of this process and its live children (vLLM's engine core is a child)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for c in me.children(recursive=True):
        try:
            total += sum(c.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def cpu_seconds_clock(include_children: bool = False):
    """The CPU-seconds clock for an engine: this process's, or with its live children
    (an engine that computes in child processes). The CPU energy estimate and the
    profiler's per-trial CPU time read the same one."""
    return process_tree_cpu_seconds if include_children else time.process_time


def make_meter(device: str = "cpu", device_index: int = 0, nvml=None,
               watts_per_core: float = DEFAULT_WATTS_PER_CORE, include_children: bool = False):
    """The best meter for ``device``: NVML counter, NVML polling, else the CPU estimate
    (over this process and its children with ``include_children``)."""
    if device.startswith("cuda"):
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError:
                nvml = None
        if nvml is not None:
            try:
                nvml.nvmlInit()
                handle = nvml.nvmlDeviceGetHandleByIndex(device_index)
            except Exception:  # NVMLError_LibraryNotFound and friends: no driver here
                handle = None
            if handle is not None:
                try:
                    nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
                    return NvmlCounter(nvml, handle)
                except Exception:
                    return NvmlPowerPoll(nvml, handle)
    return CpuTimeEstimate(watts_per_core, clock=cpu_seconds_clock(include_children))
