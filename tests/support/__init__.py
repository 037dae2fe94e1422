"""Helpers the tests share: a fake clock, kubectl as a subprocess, vwserver served in process."""
