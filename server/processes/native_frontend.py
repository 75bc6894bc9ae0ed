"""Front ends under the native interface ([server] interface = "native" with frontends = N): N processes, each the
one-process native server (server/http/native.py) with the engine process in place of its batchers. A front end's
dispatcher decodes every infer request of a take and sends them to the engine together, without waiting (one
message per take and engine); the same thread reads the engine's grouped answers (it adopts the client's hop
thread's work) and encodes and writes each to its connection. No thread waits on a request, as in one native
process, and one Python thread does a request's work on this side of the hop.

Each front end listens on a socket of its own bound to the server's port (SO_REUSEPORT: the kernel spreads new
connections over them); this module's parent process holds every socket, so that the front end that replaces one
that died takes over the connections its socket had queued."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import zmq

from latlab.server.config import served_config
from latlab.server.errors import ConfigError, ServingError
from latlab.server.http.fastpath import Ledger
from latlab.server.http.native import DRAIN_LIMIT_S, POLL_MS, NativeServer, Waiting, library, listening_socket
from latlab.server.metrics import use_multiprocess_values
from latlab.server.processes.client import no_answer
from latlab.server.processes.frontend import FrontState, Forward, outputs_of
from latlab.server.processes.hop import stacked
from latlab.server.processes.shared import CONFIG_ENV, LOG_FORMAT, RUN_DIR_ENV, metrics_folder

log = logging.getLogger("latlab.server.processes.native_frontend")
RESPAWN_S = 0.5
"""How soon a front end that died is replaced (as Granian's front ends are)."""
LOOK_S = 0.1
"""How often the parent looks whether its front ends still run."""
STOP_MARGIN_S = 10.0
"""Past a front end's own drain limit, how long the parent waits for it to exit before it kills it."""


class NativeFrontEnd(NativeServer):
    """The native server over a front end's RemoteDeployments: a take's infer calls go to their engine's client
    together (`send_many`); each answer is written by the same thread (serve_forever); the other routes are forwarded
    (Forward) on the route threads, liveness alone answered on the dispatcher."""

    _dispatcher = 0
    """The thread that serves: answers it writes wait for the end of its pass's stage (`_flush`)."""

    def serve_forever(self) -> None:
        """One thread takes requests and reads the engines' answers: it adopts each client's hop thread and waits
        on the native side's arrivals and every client's sockets at once, taking every request queued when told
        of one and handing every answer waiting on a socket to its call, until stop() and the drain. The
        requests' metric writes are gathered over each stage of a pass and written once (fastpath.Ledger), before
        the stage's answers go out (`_flush`)."""
        self._ledger, self._replies = Ledger(), []
        self._dispatcher = threading.get_ident()
        clients = self.state.engines.clients
        for client in clients:
            client.adopt()
        arrivals = self.lib.nh_notify(self.handle)
        if arrivals < 0:
            raise OSError("the native HTTP side gave no arrival descriptor")
        poller = zmq.Poller()
        poller.register(arrivals, zmq.POLLIN)
        for client in clients:
            client.register(poller)
        while True:
            timeout = min([POLL_MS, *(client.before_poll() for client in clients)])
            events = dict(poller.poll(timeout))
            if arrivals in events:
                try:
                    os.eventfd_read(arrivals)
                except BlockingIOError:
                    pass
                while self._take(0):  # until the queue is empty: a take stops where its buffer is full
                    pass
                self._flush()
            for client in clients:
                client.after_poll(events)
            self._flush()
            over = self._pass_over()
            self._flush()
            if over:
                return

    def _flush(self) -> None:
        """Write the metrics gathered since the last flush, then the answers held meanwhile."""
        self._ledger.flush()
        replies, self._replies = self._replies, []
        for reply in replies:
            reply()

    def _reply_ok(self, token: int, body: bytes, close: bool) -> None:
        if threading.get_ident() == self._dispatcher:  # held for the pass's metric writes (`_flush`)
            self._replies.append(partial(NativeServer._reply_ok, self, token, body, close))
        else:
            super()._reply_ok(token, body, close)

    def _reply(self, token: int, *arguments, **options) -> None:
        if threading.get_ident() == self._dispatcher:
            self._replies.append(partial(NativeServer._reply, self, token, *arguments, **options))
        else:
            super()._reply(token, *arguments, **options)

    def _queue(self, call: Waiting, groups: dict) -> None:
        deployment = call.deployment
        call.header, inputs = deployment.call(call.request)
        client = deployment.client
        share = groups.get(id(client))
        if share is None:
            share = groups[id(client)] = (client, [], [])
        share[1].append(call)
        share[2].append(
            (call.header, inputs, lambda answer, frames, error, c=call: self._reached(c, answer, frames, error))
        )

    def _send(self, groups: dict, count: int) -> None:
        """Each engine's calls of the take in one message, those of one deployment and shape stacked (hop.stacked:
        the engine queues, runs and answers a stack as one request)."""
        for client, calls, items in groups.values():
            for call in calls:  # held before they leave: an answer may come back before send_many returns
                self._hold(id(call.deployment), call.deployment.wait_s, (call,))
            rows = {call.deployment.config.name: call.deployment.config.batcher.max_batch_size for call in calls}
            try:
                client.send_many(stacked(items, rows))
            except ServingError as exc:
                for call in calls:
                    if self.waiting.pop(call.token, None) is call:
                        self._finish(call, None, exc)

    def _reached(self, call: Waiting, answer: dict, frames: list, error: BaseException | None) -> None:
        """On the thread that reads the answers: the engine's answer to `call` (or why none will come) goes out
        from here."""
        if self.waiting.pop(call.token, None) is not call:
            return  # its caller's time limit passed first: answered already
        try:
            if error is not None:
                raise error
            outputs = outputs_of(answer, frames)
        except Exception as exc:  # noqa: BLE001 - the request's error is its answer
            self._finish(call, None, exc)
            return
        self._finish(call, outputs, None)

    def _give_up(self, call: Waiting) -> None:
        call.deployment.client.forget(call.header["id"])
        self._finish(call, None, no_answer(call.deployment.wait_s))

    def _inline(self, method: str, path: str, body: bytes) -> bool:
        """Liveness alone: every other route asks an engine, which must not hold the dispatcher."""
        return not body and method in ("GET", "HEAD") and path == "/v2/health/live"


def main() -> None:
    """A front-end process: `python -m latlab.server.processes.native_frontend FD` (FD: its listening socket)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    sock = socket.socket(fileno=int(sys.argv[1]))
    try:
        config = served_config(os.environ[CONFIG_ENV])
        run_dir = Path(os.environ[RUN_DIR_ENV])
        use_multiprocess_values(metrics_folder(run_dir))
        state = FrontState(config, run_dir, announce=False)
    except ConfigError as exc:
        log.error("%s", exc)
        raise SystemExit(2) from None
    try:
        server = NativeFrontEnd(state, Forward(state.engines), sock)
    except ConfigError as exc:
        log.error("%s", exc)
        state.close()
        raise SystemExit(2) from None
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.stop())
    try:
        server.serve_forever()
    finally:
        server.close()
        sock.close()
        state.close()


def serve_native_frontends(address: str, port: int, count: int) -> None:
    """Run `count` native front-end processes on address:port until SIGINT/SIGTERM, replacing any that dies; on
    the signal each drains what it holds, then this returns (the caller stops the engines after them)."""
    lib, why = library()
    if lib is None:
        log.error('[server] interface = "native" needs its native part built: %s', why)
        raise SystemExit(2)
    try:
        sockets = port_sockets(address, port, count)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", address, port, exc.strerror)
        raise SystemExit(2) from None
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    children = [_spawn(sock) for sock in sockets]
    log.info("serving on http://%s:%d (native interface, %d front-end processes)", address, port, count)
    try:
        while not stopping.wait(LOOK_S):
            for index, child in enumerate(children):
                if child.poll() is not None and not stopping.wait(RESPAWN_S):
                    log.warning("front end %d exited (code %s): replaced", child.pid, child.returncode)
                    children[index] = _spawn(sockets[index])
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(DRAIN_LIMIT_S + STOP_MARGIN_S)
            except subprocess.TimeoutExpired:
                log.error("front end %d did not stop: killed", child.pid)
                child.kill()
                child.wait()
        for sock in sockets:
            sock.close()


def port_sockets(address: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening sockets on one port (the first chooses it when `port` is 0), SO_REUSEPORT on each."""
    first = listening_socket(address, port, reuse_port=True)
    port = first.getsockname()[1]
    sockets = [first]
    try:
        sockets += [listening_socket(address, port, reuse_port=True) for _ in range(count - 1)]
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _spawn(sock: socket.socket) -> subprocess.Popen:
    fd = sock.fileno()
    return subprocess.Popen([sys.executable, "-m", "latlab.server.processes.native_frontend", str(fd)], pass_fds=(fd,))


if __name__ == "__main__":
    main()
