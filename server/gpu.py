"""GPU utilisation and memory from NVML, read at scrape time; no GPU (or no driver) reads as 0 devices."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("latlab.server.gpu")


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML names it."""

    index: int
    name: str
    memory_total_bytes: int


def nvml_gpus() -> list[GpuInfo] | None:
    """Every GPU NVML sees; None when NVML cannot answer at all (no library, no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver: the caller may try nvidia-smi
        log.debug("NVML unavailable: %s", exc)
        return None
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name  # older bindings return bytes
            found.append(GpuInfo(index, name, int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)))
        return found
    except Exception as exc:  # a device that fails mid-query: report what NVML could not do
        log.warning("NVML query failed: %s", exc)
        return None
    finally:
        pynvml.nvmlShutdown()  # nvmlInit counts references: this does not disturb GpuCollector's handle


class GpuCollector(Collector):
    """Exposes latlab_gpu_devices always, and per-GPU utilisation and memory when NVML answers."""

    def __init__(self) -> None:
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:  # no library, no driver, no device: all mean "no GPU metrics"
            log.info("NVML unavailable (%s): GPU metrics report 0 devices", exc)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        devices = GaugeMetricFamily("latlab_gpu_devices", "GPUs visible through NVML (0 without a GPU or driver).")
        utilization = GaugeMetricFamily(
            "latlab_gpu_utilization_ratio", "Fraction of the last sample period the GPU was busy.", labels=["gpu"]
        )
        used = GaugeMetricFamily("latlab_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu"])
        total = GaugeMetricFamily("latlab_gpu_memory_total_bytes", "GPU memory in all.", labels=["gpu"])
        count = 0
        if self._nvml is not None:
            nvml = self._nvml
            try:
                count = nvml.nvmlDeviceGetCount()
                for index in range(count):
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                    utilization.add_metric([str(index)], rates.gpu / 100.0)
                    used.add_metric([str(index)], float(memory.used))
                    total.add_metric([str(index)], float(memory.total))
            except Exception as exc:  # a GPU that vanished mid-scrape must not break /metrics
                log.warning("NVML read failed: %s", exc)
        devices.add_metric([], float(count))
        yield devices
        yield utilization
        yield used
        yield total
