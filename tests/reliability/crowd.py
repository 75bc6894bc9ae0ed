"""Load and probes for the overload tests beside the load generator: a crowd of polite connections that follows
the generator's burst, probes that time the server's observer routes, and the connections the server holds."""

from __future__ import annotations

import http.client
import threading
import time

import orjson
import psutil
import requests

CROWD = 200
BODY = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]})
INFER = "/v2/models/slow/infer"


class Probe(threading.Thread):
    """GETs one URL every `interval_s` until stopped: (wall-clock start, seconds, status or error, body)."""

    def __init__(self, url: str, interval_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url, self.interval_s = url, interval_s
        self.samples: list[tuple[float, float, object, str]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        session = requests.Session()
        while not self.stopping.is_set():
            started, clock = time.time(), time.monotonic()
            try:
                response = session.get(self.url, timeout=30)
                outcome, text = response.status_code, response.text
            except requests.RequestException as exc:
                outcome, text = type(exc).__name__, ""
            seconds = time.monotonic() - clock
            self.samples.append((started, seconds, outcome, text))
            self.stopping.wait(max(0.0, self.interval_s - seconds))

    def during(self, start: float, end: float) -> list[tuple[float, float, object, str]]:
        return [s for s in self.samples if start <= s[0] <= end]


class Crowd:
    """CROWD connections that, while `active`, each send an infer request a second, or after Retry-After when
    refused; every answer is counted (status, with Retry-After or not), every failure too."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.active = threading.Event()
        self.stopping = threading.Event()
        self.answers: list[tuple[int, bool]] = []
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._member, daemon=True) for _ in range(CROWD)]
        for thread in self._threads:
            thread.start()

    def _member(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self.stopping.is_set():
            if not self.active.wait(0.1):
                continue
            try:
                connection.request("POST", INFER, BODY, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
            except OSError as exc:
                self.failures.append(type(exc).__name__)
                connection.close()
                continue
            retry_after = response.getheader("Retry-After")
            self.answers.append((response.status, retry_after is not None))
            self.stopping.wait(float(retry_after or 1))

    def stop(self) -> None:
        self.active.clear()
        self.stopping.set()
        for thread in self._threads:
            thread.join(90)


def follow_the_burst(crowd: Crowd, loadgen: str, burst_rps: float, done: threading.Event) -> None:
    """Start the crowd when the generator's target rate reaches the burst's, stop it when the burst ends."""
    while not done.wait(0.1):
        try:
            text = requests.get(loadgen, timeout=2).text
        except requests.RequestException:
            continue
        target = max(
            (
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("latlab_loadtest_target_rps{")
            ),
            default=0.0,
        )
        if target >= 0.9 * burst_rps:
            crowd.active.set()
        elif crowd.active.is_set():
            crowd.active.clear()


def crowd_process(port: int, loadgen: str, burst_rps: float, server_pid: int, stop, results) -> None:
    """The crowd, its trigger and the connection count, in a process of their own: 200 client threads in the
    test's process would slow its probes (the GIL) and the probes would time the client, not the server."""
    crowd, done, peaks = Crowd(port), threading.Event(), []
    for target, args in (
        (follow_the_burst, (crowd, loadgen, burst_rps, done)),
        (peak_connections, (psutil.Process(server_pid), port, done, peaks)),
    ):
        threading.Thread(target=target, args=args, daemon=True).start()
    stop.wait()
    done.set()
    crowd.stop()
    results.put({"answers": crowd.answers, "failures": crowd.failures, "peaks": peaks})


def peak_connections(server, port: int, stop: threading.Event, peaks: list[int]) -> None:
    """The most established connections to the main port, sampled from every process of the server (the one
    Granian worker, or each front end: a connection is counted once, whichever processes hold it)."""
    while not stop.wait(0.25):
        try:
            held = set()
            for process in [server, *server.children(recursive=True)]:
                held.update(
                    (c.laddr, c.raddr)
                    for c in process.net_connections("tcp")
                    if c.laddr and c.laddr.port == port and c.status == "ESTABLISHED"
                )
            peaks.append(len(held))
        except Exception:  # noqa: BLE001 - a server gone is asserted elsewhere
            return
