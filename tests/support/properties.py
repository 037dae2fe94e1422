"""Hypothesis settings for the bounded property tests (tests/security).

Those tests drive a real server (in process, or in front of kcp) from hypothesis' worker thread,
so each example costs I/O: they want a fixed number of examples, no per-example deadline, the
same examples on every run (a failure replays; a count set from the environment grows the run
without reshuffling it), no example database left behind, and no health check (a slow or
filtered example is the nature of these tests, not a mistake in the strategy). Shrinking is off
by default: a failing example is reported as found, the test collects every failure, and
shrinking one against a live server would rerun it many times.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings


def bounded_settings(examples: int, *, shrink: bool = False) -> settings:
    """Settings for ``examples`` derandomized examples; explicit ``@example``s run first."""
    base = settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    return base if shrink else settings(base, phases=(Phase.explicit, Phase.generate))
