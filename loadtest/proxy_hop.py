"""What a fleet's proxy adds to a lone request: the load's own infer requests in pairs, one through the proxy and
one straight to a replica (the address the fleet's targets file names), measured before a deployment's steps."""

from __future__ import annotations

import time

from latlab.loadtest.fleet import FleetTargets
from latlab.loadtest.lean_http import LeanClient
from latlab.loadtest.plan import PayloadOptions
from latlab.loadtest.single import lone_requests, summary, timed

PAIRS = 300
"""Lone requests sent each way: as many as the one-at-a-time probe sends."""
PAIRS_BUDGET_S = 20.0
"""A deployment slower than this per PAIRS pairs gets fewer; the result says how many it got."""


def proxy_added(host: str, targets: FleetTargets, deployment: str, options: PayloadOptions) -> dict | None:
    """The latency the proxy adds to a lone request: PAIRS pairs of the load's own infer requests, one through the
    proxy (`host`) and one straight to the fleet's first replica, which goes first alternating, each sent after the
    previous answer (nothing queued: the difference is the proxy's hop, not a queue). Each side's one-at-a-time
    figures and the differences of their p50 and p99; None where the targets file names no replica's serving
    address (written before it did)."""
    if not targets.serving:
        return None
    replica, address = targets.serving[0]
    proxied, direct = LeanClient(host), LeanClient(f"http://{address}")
    latencies: dict[str, list[float]] = {"proxy": [], "direct": []}
    errors = {"proxy": 0, "direct": 0}
    try:
        sides = {"proxy": proxied, "direct": direct}
        bodies = {side: lone_requests(client, host, deployment, options) for side, client in sides.items()}
        for side, client in sides.items():
            client.send(bodies[side][0])  # a fresh connection's set-up is neither side's latency
        deadline = time.monotonic() + PAIRS_BUDGET_S
        for i in range(PAIRS):
            if time.monotonic() >= deadline:
                break
            for side in ("proxy", "direct") if i % 2 == 0 else ("direct", "proxy"):
                seconds, ok = timed(sides[side], bodies[side][i % len(bodies[side])])
                latencies[side].append(seconds)
                errors[side] += not ok
    finally:
        proxied.close()
        direct.close()
    found = {side: summary(latencies[side], errors[side]) for side in latencies}
    return {"replica": replica, "pairs": len(latencies["proxy"]), **found, **_added(found)}


def _added(found: dict) -> dict:
    proxy, direct = found["proxy"], found["direct"]
    return {
        f"added_{q}_s": proxy[f"{q}_s"] - direct[f"{q}_s"] if None not in (proxy[f"{q}_s"], direct[f"{q}_s"]) else None
        for q in ("p50", "p99")
    }


def proxy_line(deployment: str, added: dict | None) -> str:
    """The progress line and the report's sentence of the proxy's added latency; '' without a measurement."""
    if not added or added.get("added_p50_s") is None:
        return ""
    proxy, direct = added["proxy"], added["direct"]
    return (
        f"{deployment}: the proxy added p50 {added['added_p50_s'] * 1e3:+.2f} ms, p99 {added['added_p99_s'] * 1e3:+.2f}"
        f" ms to a lone request ({added['pairs']} pairs: through it p50 {proxy['p50_s'] * 1e3:.2f} / p99 "
        f"{proxy['p99_s'] * 1e3:.2f} ms, {added['replica']} direct {direct['p50_s'] * 1e3:.2f} / "
        f"{direct['p99_s'] * 1e3:.2f} ms)"
    )
