"""Fixtures of the soak test: the reaper that kills what a test started if it is cut short."""

from __future__ import annotations

from tests.support.vwserver_process import reaper

__all__ = ["reaper"]
