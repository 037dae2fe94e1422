"""Exponential backoff with jitter: how long the n-th consecutive failure waits.

One curve for every retry in the control loops — a reflector whose list or watch fails, a work
queue key whose reconcile fails, the slice controller waiting for its own endpoint — so that a kcp
outage never becomes a tight loop, and many clients that failed together do not retry together.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """``initial * 2**(n-1)``, capped at ``maximum``, of which the last ``jitter`` fraction is
    random: with the default 0.5 a delay lies in ``[ceiling/2, ceiling]``; 0 is deterministic."""

    initial: float = 0.5
    maximum: float = 30.0
    jitter: float = 0.5
    rand: Callable[[], float] = random.random

    def delay(self, failures: int) -> float:
        """The wait before retry number ``failures`` (1-based; 0 counts as 1)."""
        ceiling = min(self.maximum, self.initial * 2.0 ** max(0, failures - 1))
        if not self.jitter:
            return float(ceiling)
        return ceiling * (1 - self.jitter) + float(self.rand()) * ceiling * self.jitter
