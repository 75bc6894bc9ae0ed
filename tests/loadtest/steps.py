"""Simulated steps for tests of the logic that reads them (search, overload, the generator's metrics)."""

from __future__ import annotations

from latlab.loadtest.results import Step


def simulated(**figures: object) -> Step:
    """A Step with the figures a test gives; of the ones a Step cannot lack, the load is the rate asked for (else
    the offered one), answered in full, without errors, its percentiles unknown."""
    offered = figures.get("offered_rps", figures.get("target_rps") or 0.0)
    load = figures.get("target_rps") or offered
    required = {
        "target": load,
        "offered_rps": offered,
        "achieved_rps": offered,
        "errors": 0,
        "p50_s": None,
        "p90_s": None,
        "p99_s": None,
        "max_s": None,
    }
    return Step(**{**required, **figures})
