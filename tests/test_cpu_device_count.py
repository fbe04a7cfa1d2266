"""pjrt-cpu's device count: from the argument or PJRT_CPU_DEVICE_COUNT, with a clear error for
counts the CPU plugin cannot serve in reasonable time."""
import pytest

import pjrt_cpu


def test_device_count_from_argument_and_environment(monkeypatch):
    monkeypatch.delenv(pjrt_cpu.DEVICE_COUNT_ENV, raising=False)
    assert pjrt_cpu.client_options() == {}
    assert pjrt_cpu.client_options(3) == {"cpu_device_count": 3}
    monkeypatch.setenv(pjrt_cpu.DEVICE_COUNT_ENV, "5")
    assert pjrt_cpu.client_options() == {"cpu_device_count": 5}


@pytest.mark.parametrize("count", [pjrt_cpu.MAX_DEVICES + 1, 100_000])
def test_a_device_count_too_large_to_create_is_refused_at_once(count, monkeypatch):
    with pytest.raises(ValueError, match=f"{count} CPU devices asked for.*square of the device"):
        pjrt_cpu.client_options(count)
    monkeypatch.setenv(pjrt_cpu.DEVICE_COUNT_ENV, str(count))
    with pytest.raises(ValueError, match=f"Ask for {pjrt_cpu.MAX_DEVICES} or fewer"):
        pjrt_cpu.client_options()


def test_the_largest_allowed_count_is_accepted():
    assert pjrt_cpu.client_options(pjrt_cpu.MAX_DEVICES) == {"cpu_device_count": pjrt_cpu.MAX_DEVICES}
