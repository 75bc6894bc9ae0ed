"""The closed loop's Python per answer, alone: a loop sender's read callback over a socket stand-in that hands it
mlp-shaped answers (three body lengths in turn, the Date header fixed) and takes each next request at once.

    .venv/bin/python benchmarks/answer_chain.py [--calls 200000] [--repeats 5]
    PYTHONPATH=/tmp/before/pkg .venv/bin/python benchmarks/answer_chain.py   # another version's code (run from
                                                                           # a folder without ./latlab)

Times `RawConnection._readable` (the read, the answer's figures, the finished request kept, the next request
sent) and prints the best of the repeats in µs an answer. No socket, no event loop: what the interpreter spends on
the chain where its caches are warm, a floor under what it spends in a load (docs/measurement.md)."""

from __future__ import annotations

import argparse
import itertools
import timeit

from latlab.loadtest.loop_sender import LoopSender
from latlab.loadtest.raw_http import RawConnection

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\nserver: granian\r\n"
HEAD += b"date: Thu, 01 Jan 1970 00:00:00 GMT\r\n\r\n"


class _Socket:
    """Answers each recv with the next of `answers`; every send goes whole."""

    def __init__(self, answers: list[bytes]) -> None:
        self.recv = lambda _size, following=itertools.cycle(answers).__next__: following()

    def send(self, raw: bytes) -> int:
        return len(raw)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    connection = RawConnection.__new__(RawConnection)  # its watchers need an event loop: set up by hand instead
    connection.__dict__.update(_buffer=bytearray(), _pending=b"", _answered=None, closed=False, got_bytes=False)
    connection.__dict__.update(_before_length=b"\x00", _after_length=b"", _length_at=0)  # the cut's, if present
    connection.sock = _Socket([HEAD % n + b"x" * n for n in (116, 117, 118)])
    sender = LoopSender(("127.0.0.1", 0), lambda: b"request")
    sender._connection = connection
    sender._send_next()
    best = min(timeit.repeat(connection._readable, number=args.calls, repeat=args.repeats))
    print(f"{best / args.calls * 1e6:.2f} µs an answer (best of {args.repeats} x {args.calls})")


if __name__ == "__main__":
    main()
