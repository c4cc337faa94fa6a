"""GPU memory helpers against fake device objects (no GPU here): the ballast that
applies memory pressure before a vLLM engine starts, and the NVML peak sampler."""

import types

import pytest

from modeswitch.engine.memory import GpuBallast, GpuMemoryPeak


class FakeTorch:
    """torch.cuda.mem_get_info / empty / empty_cache over a 100 GiB device with 80 free."""

    uint8 = "uint8"

    def __init__(self):
        self.total, self.free = 100 * 2**30, 80 * 2**30
        self.allocated = []
        self.cuda = types.SimpleNamespace(mem_get_info=lambda i=0: (self.free, self.total),
                                          empty_cache=lambda: None)

    def empty(self, n, dtype, device):
        self.free -= n
        self.allocated.append((n, dtype, device))
        return object()


def test_ballast_takes_a_fraction_of_free_memory_and_sizes_the_engine():
    t = FakeTorch()
    with GpuBallast(0.5, 1, torch=t) as b:
        assert b.bytes == 40 * 2**30 and t.allocated == [(40 * 2**30, "uint8", "cuda:1")]
        # 40 GiB of 100 left; vLLM's utilization is a fraction of the total, with headroom
        assert b.engine_utilization() == pytest.approx(0.9 * 0.4)
    assert b.buffer is None
    with pytest.raises(ValueError, match="must be in"):
        GpuBallast(1.0)


def test_gpu_memory_peak_samples_nvml():
    used = iter([1000, 5000, 3000] + [2000] * 10_000)

    class FakeNvml:
        def nvmlInit(self):
            pass

        def nvmlDeviceGetHandleByIndex(self, i):
            return i

        def nvmlDeviceGetMemoryInfo(self, h):
            return types.SimpleNamespace(used=next(used))

    with GpuMemoryPeak(0, interval_s=0.001, nvml=FakeNvml()) as s:
        import time

        time.sleep(0.02)
    assert s.peak == 5000 and s.peak_mb == pytest.approx(5000 / 2**20)
