"""The generator's calibration before a sweep: the floor (floor.py) measured through the sweep's own users.

Import this module after `latlab.loadtest.driver` (Locust's gevent patching comes first)."""

from __future__ import annotations

import time
from typing import Callable

import gevent

from latlab.loadtest.driver import LoadDriver
from latlab.loadtest.floor import CALIBRATION, ROUTE, calibration_rates, floor_line


WARMUP_S = 0.5


def calibrate(
    driver: LoadDriver, loads: list[float], max_rate: float, seconds: float, progress: Callable[[str], None]
) -> dict:
    """Measure the floor at calibration_rates through the driver's users; the record a results file keeps."""
    recorder = driver.state.recorder
    rows = []
    for rate in calibration_rates(loads, max_rate, driver.processes, seconds):
        driver.set_load(CALIBRATION, rate, route=ROUTE)
        gevent.sleep(WARMUP_S)
        driver.generator_cpu()
        start = time.time()
        gevent.sleep(seconds)
        cpu = driver.generator_cpu()
        end = start + seconds
        gevent.sleep(driver.lag_s)
        driver.await_answers(end)
        stats, _, _ = recorder.window_detail(start, end, time.time())
        recorder.forget_before(end)
        figures = stats.as_dict()
        answered = max(figures["ok"], 1)
        rows.append(
            {
                "target_rps": rate,
                "achieved_rps": figures["achieved_rps"],
                "requests": figures["sent"],
                "errors": figures["errors"],
                "p50_s": figures["p50_s"],
                "p99_s": figures["p99_s"],
                "mean_s": figures["mean_s"],
                "send_lateness_p50_s": figures["send_lateness_p50_s"],
                "send_lateness_p99_s": figures["send_lateness_p99_s"],
                "generator_cpu_percent": cpu,
                "cpu_per_request_s": cpu / 100.0 * seconds / answered,
                "too_few_samples": figures["too_few_samples"],
            }
        )
    driver.drain()
    floor = {"route": ROUTE, "seconds": seconds, "processes": driver.processes, "rates": rows}
    progress(floor_line(floor))
    return floor
