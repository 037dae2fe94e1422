"""A fake kcp APIExport virtual workspace, for fault injection, fast tests and benchmarks.

It lives beside the ``vwserver`` package, not in it: it is test support and never ships (the
wheel and the container image are checked for that). The real upstream in the e2e tests is kcp
itself; this fake models kcp's behaviour where a test needs to break it on purpose (stalls,
garbage, dropped watches) or needs thousands of objects in milliseconds. ``python -m
fakekcp.upstream --help`` runs it as a process (the benchmarks do).

Modules import in one direction: ``upstream`` (the server) → ``http`` (handlers per verb) →
``watch`` (one streaming watch) → ``render``, ``requests``, ``patch`` → ``store`` → ``status``.
"""
