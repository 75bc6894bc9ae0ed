"""A front end's connection to an engine: calls cross in groups (what request threads queued while the last send
was in flight goes as one message), and each answer of the engine's grouped replies reaches the thread that
waits on it."""

from __future__ import annotations

import contextvars
import itertools
import logging
import math
import os
import threading
import time
from pathlib import Path

import zmq

from latlab.server.errors import ModelNotReady, RequestTimeout
from latlab.server.processes.hop import Answered, group_message, pack, recv_frames, send_frames, unpack, unstacked
from latlab.server.processes.shared import EngineStatus, endpoint

log = logging.getLogger("latlab.server.processes.client")
POLL_S = 0.05
"""How often a request waiting on the engine looks whether the engine is still the one it asked."""
CONNECT_WAIT_S = 2.0
"""How long a request waits for the hop to connect to a running engine before it is refused."""
RETRY_MS = 5
"""While the engine is not connected (or has not answered hello), how often the hop thread tries again."""
HOLD_S = 0.001
"""Longest a group waits for the requests admitted in this process that are still being read and decoded."""
_COMING = contextvars.ContextVar("latlab_hop_coming", default=None)
"""The client a request was admitted for, until it calls it (or leaves without calling)."""
FORWARD_WAIT_S = 30.0
NOBLOCK, POLLIN, EVENTS = int(zmq.NOBLOCK), int(zmq.POLLIN), int(zmq.EVENTS)
"""As plain ints: combining pyzmq's enum flags costs more than the call they qualify."""


class Call:
    """One call waiting for its answer: `done` is held until the hop thread (or the thread that adopted its work)
    puts the answer in; or, for an asynchronous call (`answered`), that thread calls `answered` with it."""

    __slots__ = (
        *("header", "key", "arrays", "hold_s", "done", "sent", "answer", "frames", "answered", "generation"),
        "members",
    )

    def __init__(
        self,
        header: dict,
        key: str,
        arrays: dict | None,
        hold_s: float,
        answered: Answered | None = None,
        generation: int = 0,
    ) -> None:
        self.header, self.key, self.arrays, self.hold_s = header, key, arrays, hold_s
        self.answered, self.generation = answered, generation
        self.members: list[Call] | None = None
        """A stack's calls (hop.stacked): the stack is sent, each of them waited on and answered."""
        self.sent = False
        self.answer: dict = {}
        self.frames: list = []
        if answered is None:
            self.done = threading.Lock()
            self.done.acquire()


class EngineClient:
    """Calls to engine `engine` from any thread, over two sockets (ZeroMQ sockets are not thread-safe): requests
    leave on `tx`, sent by whichever thread holds the sending turn (a flag under a lock): the thread that queues
    a call when no send is in flight sends it, with every call queued meanwhile, as one message, and goes on
    until the queue is empty; answers arrive on `rx`, which the hop thread owns: it hands each answer of the
    engine's grouped replies to the call waiting on it (a lock each) and says hello to every new engine, so that
    the engine knows where to answer before any request reaches it.

    A group also waits (up to its calls' `hold_s`, timed by the hop thread) for the requests admitted here
    (`expect`) that have not called yet: other threads of this interpreter are reading and decoding them, one
    after another, and each would cost a message and a wake-up on both sides of the hop if sent alone."""

    def __init__(self, run_dir: Path, status: EngineStatus, engine: int = 0) -> None:
        self.address = endpoint(run_dir, engine)
        self.status = status
        self.context = zmq.Context()
        self._ids = itertools.count(1)
        self._waiting: dict[int, Call] = {}
        self._queue: list[Call] = []
        self._lock = threading.Lock()
        self._sending = False
        """A thread holds the sending turn: only it touches `tx`."""
        self._holding = False
        self._send_by = 0.0
        self._retry = False
        """Calls wait queued: a send found the engine not connected, or the engine has not answered the hello yet;
        the hop thread sends them once it can (`before_poll`)."""
        self._coming = 0
        self._ready: int | None = None
        """The engine generation that answered this client's hello."""
        self._asked: int | None = None
        """The engine generation the latest asynchronous calls went to: when another is up, the hop thread fails
        those still waiting."""
        self._unheard_since: float | None = None
        """Since when asynchronous calls wait, queued, for the running engine to answer this client's hello."""
        self._closing = False
        self._rx_id = f"{os.getpid()}-{engine}-{os.urandom(4).hex()}".encode()
        self._rx: zmq.Socket | None = None
        """The socket answers arrive on: the hop thread's, or the adopting thread's (`adopt`)."""
        self._adopted = False
        self._tx = self._socket()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._hop, name=f"latlab-hop-{engine}", daemon=True)
        self._thread.start()

    def _socket(self, routing_id: bytes | None = None) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for an engine not connected: refuse instead
        if routing_id is not None:
            sock.setsockopt(zmq.ROUTING_ID, routing_id)
        sock.connect(self.address)
        return sock

    def call(
        self, header: dict, arrays: dict | None = None, wait_s: float = FORWARD_WAIT_S, hold_s: float = 0.0
    ) -> tuple[dict, list]:
        """Send one call (its arrays described as its "inputs") and wait for its answer: (header, data frames).
        ModelNotReady (503) when no engine runs, or when the one asked stopped before answering (the request is
        not answered, never silently lost); RequestTimeout when no answer came within `wait_s`. `hold_s`: how
        long its group may wait for requests still coming."""
        generation = self.status.up()
        if generation is None:
            self.arrived()
            raise ModelNotReady(NOT_RUNNING)
        if self._ready != generation:
            self._await_hello(generation)
        call = Call(header, "inputs", arrays, hold_s)
        request_id = header["id"] = next(self._ids)
        self._waiting[request_id] = call
        coming = _COMING.get() is self
        with self._lock:
            self._queue.append(call)
            if coming:
                self._coming -= 1
            turn = self._turn(hold_s)
        if coming:
            _COMING.set(None)
        if turn is None:
            os.eventfd_write(self._wake, 1)  # the hop thread times the hold
        elif turn:
            self._send_queued()
        return self._wait(call, request_id, generation, wait_s)

    def _turn(self, hold_s: float) -> bool | None:
        """Under the lock, for a call just queued: True: the caller sends now (it holds the turn); False: a send
        in flight or a hold takes it; None: a hold starts."""
        if self._sending or self._retry:
            return False
        if self._coming > 0 and hold_s > 0:
            if self._holding:
                return False
            self._holding, self._send_by = True, time.monotonic() + hold_s
            return None
        self._sending, self._holding = True, False
        return True

    def send_many(self, calls: list[tuple[dict, dict | None, Answered | list[tuple[dict, Answered]]]]) -> None:
        """Send calls (header, arrays, answered) without waiting: each `answered` is called on the thread that reads
        the answers (the hop thread, or the one that adopted its work) with its answer, or with ModelNotReady when
        the engine that held it stops. A stack (hop.stacked: its requests' (header, answered) in place of one
        `answered`) is sent as one call and waited on as its requests, each with an id of its own (its own answer,
        `forget` and failure). Raises ModelNotReady (none sent) when no engine runs. Calls to an engine that has not
        answered this client's hello yet (a restart, for milliseconds) wait queued until it does, or are answered
        ModelNotReady after CONNECT_WAIT_S, as a request thread's call is. The caller keeps its own time limit
        (`forget` a call it gave up on)."""
        generation = self.status.up()
        if generation is None:
            raise ModelNotReady(NOT_RUNNING)
        if self._asked is None:  # else: the hop thread has yet to fail the calls an earlier engine held
            self._asked = generation
        queued = []
        for header, arrays, answered in calls:
            if isinstance(answered, list):  # a stack (hop.stacked): one call to send, one per request to wait on
                call = Call(header, "inputs", arrays, 0.0, _sent_as_stack, generation)
                call.members = [Call(own, "inputs", None, 0.0, each, generation) for own, each in answered]
                header["ids"] = [self._wait_on(member) for member in call.members]
            else:
                call = Call(header, "inputs", arrays, 0.0, answered, generation)
                self._wait_on(call)
            queued.append(call)
        heard = self._ready == generation
        with self._lock:
            self._queue.extend(queued)
            if heard:
                turn = self._turn(0.0)
            else:  # sent once the engine answers the hello (its answers could not reach this client before)
                turn, self._retry = False, True
        if turn:
            self._send_queued()
        elif not heard and self._unheard_since is None:
            self._unheard_since = time.monotonic()
            os.eventfd_write(self._wake, 1)

    def _wait_on(self, call: Call) -> int:
        request_id = call.header["id"] = next(self._ids)
        self._waiting[request_id] = call
        return request_id

    def forget(self, request_id: int) -> bool:
        """Stop waiting for an asynchronous call (its caller's time limit passed): True when it was still
        waited on, so that its `answered` is never called."""
        return self._waiting.pop(request_id, None) is not None

    def expect(self) -> None:
        """A request was admitted for this engine: its call is coming (from this thread or task's context)."""
        with self._lock:
            self._coming += 1
        _COMING.set(self)

    def arrived(self) -> None:
        """The request admitted here leaves; if it never called (refused, or failed before), it is not coming."""
        if _COMING.get() is not self:
            return
        _COMING.set(None)
        with self._lock:
            self._coming -= 1
            turn = self._holding and self._coming <= 0 and not self._sending and bool(self._queue)
            if turn:
                self._sending, self._holding = True, False
        if turn:
            self._send_queued()

    def _await_hello(self, generation: int) -> None:
        """Wait until this engine answered the hop thread's hello (it knows where to send answers)."""
        deadline = time.monotonic() + CONNECT_WAIT_S
        while self._ready != generation:
            if time.monotonic() > deadline or self.status.up() != generation:
                self.arrived()
                raise ModelNotReady(UNREACHABLE)
            os.eventfd_write(self._wake, 1)
            time.sleep(RETRY_MS / 1000)

    def _send_queued(self) -> None:
        """With the sending turn: send every queued call still waited on, as few messages as a group's bounds
        allow, until the queue is empty; then give the turn up. Calls the engine cannot take yet (not connected)
        go back to the queue for the hop thread to try again."""
        while True:
            with self._lock:
                calls = [c for c in self._queue if self._waited_on(c)]
                self._queue.clear()
                if not calls:
                    self._sending = False
                    return
            while calls:
                frames, taken = group_message([(c.header, c.key, c.arrays) for c in calls], self._rx_id)
                try:
                    send_frames(self._tx, frames, NOBLOCK)
                except zmq.Again:
                    with self._lock:
                        self._queue[:0] = calls
                        self._sending, self._retry = False, True
                    os.eventfd_write(self._wake, 1)
                    return
                for call in calls[:taken]:
                    call.sent = True
                    for member in call.members or ():
                        member.sent = True
                calls = calls[taken:]

    def _waited_on(self, call: Call) -> bool:
        """Whether a queued call is still waited on (a stack: any of its requests)."""
        if call.members is None:
            return call.header["id"] in self._waiting
        return any(member.header["id"] in self._waiting for member in call.members)

    def _wait(self, call: Call, request_id: int, generation: int, wait_s: float) -> tuple[dict, list]:
        started = time.monotonic()
        while not call.done.acquire(True, POLL_S):
            now = time.monotonic()
            if self.status.up() != generation:
                failure = engine_lost(call.sent)
            elif not call.sent and now - started > CONNECT_WAIT_S:
                failure = ModelNotReady(UNREACHABLE)
            elif now - started > wait_s:
                failure = no_answer(wait_s)
            else:
                continue
            if self._waiting.pop(request_id, None) is not None:
                raise failure
            call.done.acquire()  # the answer came in meanwhile: it is this request's
            break
        return call.answer, call.frames

    def _hop(self) -> None:
        """Read answers on `rx`; say hello to each new engine; send what a hold or a refused send left queued
        (until closed, or until another thread adopts this work: `adopt`)."""
        self._rx = self._socket(self._rx_id)
        poller = zmq.Poller()
        self.register(poller)
        try:
            while not self._closing and not self._adopted:
                self.after_poll(dict(poller.poll(self.before_poll())))
        except zmq.ContextTerminated:
            pass
        finally:
            if not self._adopted:
                self._rx.close(0)

    def adopt(self) -> None:
        """From now on the calling thread does the hop thread's work (which then ends): it polls what `register`
        adds beside its own descriptors, calling `before_poll` before each poll and `after_poll` after it, so that
        a native front end's one thread takes requests and reads answers in one wait (one wake-up for both, no
        interpreter lock handed between two threads)."""
        self._adopted = True
        os.eventfd_write(self._wake, 1)
        self._thread.join()

    def register(self, poller: zmq.Poller) -> None:
        poller.register(self._rx, POLLIN)
        poller.register(self._wake, POLLIN)

    def before_poll(self) -> float:
        """Say hello to a new engine, fail what a stopped one held, send what is due; how long the poll may wait
        (ms)."""
        generation = self.status.up()
        if generation is not None and generation != self._ready:
            try:  # answered once the engine knows this socket: then answers can reach it
                send_frames(
                    self._rx, [pack({"group": [{"kind": "hello", "id": 0, "generation": generation}]})], NOBLOCK
                )
            except zmq.Again:
                pass
        if self._asked is not None and generation != self._asked:
            self._fail_asked(generation)
        if generation is None:  # no engine: nothing to send; every call still waiting was failed above
            self._unheard_since = None
            return POLL_S * 1000
        if generation != self._ready:  # the hello is asked again shortly; queued calls wait for its answer
            if self._unheard_since is not None and time.monotonic() - self._unheard_since > CONNECT_WAIT_S:
                self._fail_unheard()
            return RETRY_MS
        self._unheard_since = None
        return self._send_due()

    def after_poll(self, events: dict) -> None:
        """What the poll found for this client: a wake-up (consumed), answers (each handed to its call)."""
        if self._wake in events:
            try:
                os.eventfd_read(self._wake)
            except BlockingIOError:
                pass
        if self._rx in events:
            self._receive(self._rx)

    def _send_due(self) -> float:
        """Send what a hold or a refused send kept queued once it is due; returns how long to wait (ms) until the
        next look."""
        with self._lock:
            now = time.monotonic()
            due = self._retry or (self._holding and (now >= self._send_by or self._coming <= 0))
            turn = due and not self._sending
            if turn:
                self._holding = self._retry = False
                self._sending = bool(self._queue)
                turn = self._sending
            holding, retry, send_by = self._holding, self._retry, self._send_by
        if turn:
            self._send_queued()
        if retry:
            return RETRY_MS
        if holding:  # whole milliseconds: pyzmq rounds a fraction down, and 0 would spin
            return max(1, math.ceil((send_by - now) * 1000))
        return POLL_S * 1000

    def _receive(self, sock: zmq.Socket) -> None:
        """Every answer waiting on the socket, each handed to its call (one whose request gave up is dropped)."""
        waiting = self._waiting
        try:
            message = recv_frames(sock, NOBLOCK)  # the poll said one waits: asking again costs a system call
        except zmq.Again:
            return
        while True:
            frames = message[1:]
            for answer in unpack(message[0])["group"]:
                if "ids" in answer:  # a stack's answer: each of its requests gets its own part
                    for part in unstacked(answer):
                        call = waiting.pop(part["id"], None)
                        if call is not None:
                            _deliver(call.answered, part, frames, None)
                    continue
                call = waiting.pop(answer.get("id"), None)
                if call is None:
                    if "generation" in answer:  # the hello's answer
                        self._ready = answer["generation"]
                elif call.answered is not None:
                    _deliver(call.answered, answer, frames, None)
                else:
                    call.answer, call.frames = answer, frames
                    call.done.release()
            if not sock.get(EVENTS) & POLLIN:
                return
            message = recv_frames(sock, NOBLOCK)

    def _fail_asked(self, generation: int | None) -> None:
        """The engine the asynchronous calls went to stopped (or another one is up): each still waiting is
        answered ModelNotReady, never left waiting for model runs that will not happen."""
        self._asked = generation
        for request_id, call in list(self._waiting.items()):
            if call.answered is None or call.generation == generation:
                continue
            if self._waiting.pop(request_id, None) is not None:
                _deliver(call.answered, {}, [], engine_lost(call.sent))

    def _fail_unheard(self) -> None:
        """The running engine did not answer the hello within CONNECT_WAIT_S: every asynchronous call still queued
        for it is answered ModelNotReady (as a call from a request thread is after the same wait)."""
        self._unheard_since = None
        for request_id, call in list(self._waiting.items()):
            if call.answered is not None and not call.sent and self._waiting.pop(request_id, None) is not None:
                _deliver(call.answered, {}, [], ModelNotReady(UNREACHABLE))

    def close(self) -> None:
        self._closing = True
        os.eventfd_write(self._wake, 1)
        self._thread.join(5)
        if self._adopted and self._rx is not None:
            self._rx.close(0)
        self.context.destroy(0)
        os.close(self._wake)


NOT_RUNNING = "the server's engine is not running (starting or restarting); retry shortly"
UNREACHABLE = "the server's engine is not reachable (restarting); retry shortly"


def engine_lost(sent: bool) -> ModelNotReady:
    """The error of a call whose engine stopped before answering it: held (`sent`) or never reached."""
    if sent:
        return ModelNotReady(
            "the server's engine stopped while it held this request, which was not computed or not answered; retry"
        )
    return ModelNotReady(UNREACHABLE)


def no_answer(wait_s: float) -> RequestTimeout:
    """The error of a call its caller stopped waiting for after `wait_s`."""
    return RequestTimeout(f"no answer from the engine within {wait_s:.3f} s")


def _sent_as_stack(answer: dict, frames: list, error: BaseException | None) -> None:
    """A stack's own `answered`: never called, since its requests are waited on and answered each."""


def _deliver(answered: Answered, answer: dict, frames: list, error: BaseException | None) -> None:
    try:
        answered(answer, frames, error)
    except Exception:  # noqa: BLE001 - one caller's failure must not stop the hop thread
        log.exception("an asynchronous call's answer could not be delivered")


class Announcing:
    """A deployment's admission (enter, leave, count, limit) that tells its engine's client, on entry, that one
    more request is coming: what a group waits for (EngineClient)."""

    __slots__ = ("admission", "client")

    def __init__(self, admission, client: EngineClient) -> None:
        self.admission, self.client = admission, client

    @property
    def limit(self) -> int | None:
        return self.admission.limit

    @property
    def count(self) -> int:
        return self.admission.count

    def enter(self) -> None:
        self.admission.enter()
        self.client.expect()

    def leave(self) -> None:
        self.client.arrived()
        self.admission.leave()
