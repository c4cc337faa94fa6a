"""Energy meters: arithmetic and NVML handling against a fake NVML device."""

import pytest

from modeswitch.engine.energy import (
    CpuTimeEstimate,
    NvmlCounter,
    NvmlPowerPoll,
    make_meter,
    trapezoid_joules,
)


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class FakeNvml:
    """Test double for the NVML module: a counter in mJ and a power reading in mW."""

    class NVMLError(Exception):
        pass

    def __init__(self, has_counter=True, power_mw=200_000, library=True):
        self.energy_mj = 1_000_000
        self.power_mw = power_mw
        self.has_counter, self.library = has_counter, library

    def nvmlInit(self):
        if not self.library:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"gpu{i}"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.has_counter:
            raise self.NVMLError("Not Supported")
        return self.energy_mj

    def nvmlDeviceGetPowerUsage(self, handle):
        return self.power_mw


def test_counter_reads_millijoules_and_syncs_both_edges():
    nvml, clock, syncs = FakeNvml(), FakeClock(), []
    m = NvmlCounter(nvml, "gpu0", sync=lambda: syncs.append(1), wall=clock)
    m.start()
    nvml.energy_mj += 2_500
    clock.t = 0.5
    r = m.stop()
    assert r.joules == pytest.approx(2.5) and r.source == "nvml_counter"
    assert len(syncs) == 2 and not r.short_window


def test_short_windows_are_flagged():
    nvml, clock = FakeNvml(), FakeClock()
    m = NvmlCounter(nvml, "gpu0", sync=lambda: None, wall=clock)
    m.start()
    clock.t = 0.02
    assert m.stop().short_window


def test_trapezoid_rule():
    assert trapezoid_joules([(0, 100), (1, 200), (3, 200)]) == pytest.approx(150 + 400)
    assert trapezoid_joules([(0, 50)]) == 0


def test_power_poller_integrates_samples():
    nvml = FakeNvml(has_counter=False, power_mw=100_000)
    m = NvmlPowerPoll(nvml, "gpu0", interval_s=0.01, sync=lambda: None)
    m.start()
    import time

    time.sleep(0.08)
    r = m.stop()
    assert r.source == "nvml_power_poll"
    assert len(m.samples) >= 3
    assert r.joules == pytest.approx(100 * r.seconds, rel=1e-6)


def test_meter_choice_falls_back_cleanly():
    assert isinstance(make_meter("cuda", nvml=FakeNvml()), NvmlCounter)
    assert isinstance(make_meter("cuda", nvml=FakeNvml(has_counter=False)), NvmlPowerPoll)
    assert isinstance(make_meter("cuda", nvml=FakeNvml(library=False)), CpuTimeEstimate)
    assert isinstance(make_meter("cpu"), CpuTimeEstimate)


def test_cpu_estimate_is_cpu_time_times_watts():
    cpu, wall = FakeClock(), FakeClock()
    m = CpuTimeEstimate(watts_per_core=5.0, clock=cpu, wall=wall)
    m.start()
    cpu.t, wall.t = 3.0, 2.0  # two cores busy for 1.5 s
    r = m.stop()
    assert r.joules == pytest.approx(15.0) and r.source == "estimate" and r.seconds == 2.0
