"""Peak memory during a request window.

On CUDA the allocator's peak counter is exact. On CPU we report what the engine
holds when the request starts (:func:`held_bytes`: every tensor it can reach, so
the weights, a draft model, continuous batching's paged KV cache and a prefix
store's entries, packed quantized weights at their real byte size) plus the peak
growth of the process's resident set during the request (its KV cache and
activations), sampled every few milliseconds, after the memory freed before it has
been handed back to the system (:func:`release_freed_memory`). Process RSS alone
would mostly measure the PyTorch runtime, the same for every mode.

Why both parts: the earlier method reported weights + RSS growth, without either.
glibc keeps freed chunks resident and reuses them, so a request's growth depended on
what ran before it: in an interleaved profile the reference read the same figure on
every request whatever its prompt's length, while alone, released first, the process
grows with the prompt. And continuous batching's paged cache (sized for 16 sequences
of the profile's longest context) is held outside the weights and was never counted,
so that mode looked no bigger than the reference (the figures: docs/results.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import threading
import time
import types
import weakref

import psutil


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)


def release_freed_memory() -> bool:
    """Collect garbage and hand the heap's free pages back to the system, so the RSS
    growth of the window that follows counts the pages *it* touches, whatever ran
    before. False where the C library cannot (the growth then depends on history)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


#: objects a walk over what an engine holds does not enter: code, types, modules and
#: scalars hold no engine memory, and entering modules would reach the whole runtime
_NOT_HELD = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
             threading.Thread, str, bytes, int, float, complex, bool, type(None))


def held_bytes(*roots) -> int:
    """Bytes of every tensor reachable from ``roots`` through attributes and containers
    (shared storage once), packed quantized weights included: what an engine holds
    between requests. A model's weights are only part of it: a draft model, continuous
    batching's paged KV cache and a prefix store's entries live in other objects, and
    the CUDA allocator's counter sees them all; this is the CPU's count of the same."""
    import torch  # lazy: torch is heavy

    seen, storages, total = set(), set(), 0
    stack = [r for r in roots if r is not None]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, _NOT_HELD):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            if o.device.type != "meta":
                st = o.untyped_storage()
                if st.data_ptr() not in storages:
                    storages.add(st.data_ptr())
                    total += st.nbytes()
            continue
        if isinstance(o, torch.nn.Module):
            total += _own_packed_bytes(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        else:
            d = getattr(o, "__dict__", None)
            if isinstance(d, dict):
                stack.append(d)
            for name in getattr(type(o), "__slots__", ()):
                if isinstance(name, str) and hasattr(o, name):
                    stack.append(getattr(o, name))
    return total


def module_bytes(*modules) -> int:
    """Bytes held by the parameters and buffers of modules (shared storage once)."""
    seen, total = set(), 0
    for m in modules:
        if m is None:
            continue
        tensors = list(m.parameters()) + list(m.buffers())
        for t in tensors:
            key = t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)
            if key in seen:
                continue
            seen.add(key)
            total += t.untyped_storage().nbytes()
        total += _packed_bytes(m)
    return total


def _packed_bytes(module) -> int:
    """Weights held in packed form outside parameters/buffers (torch's dynamic int8
    linear keeps them in an opaque ``_packed_params`` object)."""
    return sum(_own_packed_bytes(sub) for sub in module.modules())


#: packed bytes per quantized module: unpacking takes a copy (0.6 s for SmolLM2's
#: linears), and a module's packed weights do not change once quantized
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _own_packed_bytes(sub) -> int:
    """``sub``'s own packed weights (not its children's)."""
    if not (hasattr(sub, "_packed_params") and callable(getattr(sub, "weight", None))):
        return 0
    if sub in _PACKED:
        return _PACKED[sub]
    w = sub.weight()
    total = w.int_repr().numel() * w.int_repr().element_size()
    b = sub.bias()
    if b is not None:
        total += b.numel() * b.element_size()
    _PACKED[sub] = total
    return total


class _PeakSampler:
    """Samples ``_read()`` (bytes) on a thread while the block runs; keeps the first
    reading (``base``) and the largest (``peak``)."""

    def __init__(self, interval_s: float = 0.005):
        self.interval_s = interval_s
        self.base = self.peak = 0
        self._stop = threading.Event()

    def _read(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._read())
            time.sleep(self.interval_s)

    def __enter__(self):
        self.base = self.peak = self._read()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._read())

    @property
    def peak_mb(self) -> float:
        return self.peak / 2**20

    @property
    def peak_growth_mb(self) -> float:
        return max(0, self.peak - self.base) / 2**20


class PeakRSS(_PeakSampler):
    """Process RSS (with ``children``: plus child processes, where vLLM's engine core
    runs); ``peak_growth_mb`` after exit."""

    def __init__(self, interval_s: float = 0.005, children: bool = False):
        super().__init__(interval_s)
        self.proc = psutil.Process()
        self.children = children

    def _read(self) -> int:
        total = self.proc.memory_info().rss
        if self.children:
            for c in self.proc.children(recursive=True):
                try:
                    total += c.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
        return total


class GpuMemoryPeak(_PeakSampler):
    """Peak device memory in use (NVML), sampled while the block runs.

    vLLM's engine core allocates in a child process, so this process's CUDA
    allocator counters do not see it; NVML sees the whole device. ``nvml`` is
    injectable for tests.
    """

    def __init__(self, device_index: int = 0, interval_s: float = 0.005, nvml=None):
        super().__init__(interval_s)
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py
        self.nvml = nvml
        self.nvml.nvmlInit()
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(device_index)

    def _read(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)


class GpuBallast:
    """Takes ``fraction`` of the free device memory before an engine starts: the
    memory-pressure workload, as the study ran it. ``torch`` is injectable for tests."""

    def __init__(self, fraction: float, device_index: int = 0, torch=None):
        if not 0 <= fraction < 1:
            raise ValueError(f"memory pressure {fraction} must be in [0, 1)")
        self.fraction, self.device_index = fraction, device_index
        self._torch = torch
        self.buffer = None
        self.bytes = 0

    def __enter__(self):
        torch = self._torch
        if torch is None:
            import torch  # lazy: torch is heavy
        self._torch = torch
        free, total = torch.cuda.mem_get_info(self.device_index)
        self.bytes = int(free * self.fraction)
        if self.bytes:
            self.buffer = torch.empty(self.bytes, dtype=torch.uint8, device=f"cuda:{self.device_index}")
        free_after, self.total = torch.cuda.mem_get_info(self.device_index)
        self.free_after = free_after
        return self

    def engine_utilization(self, headroom: float = 0.9) -> float:
        """vLLM's ``gpu_memory_utilization`` (a fraction of the total) that fits what is left."""
        return max(0.05, min(0.95, headroom * self.free_after / self.total))

    def __exit__(self, *exc):
        self.buffer = None
        if self._torch is not None and self.bytes:
            self._torch.cuda.empty_cache()
