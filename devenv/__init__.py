"""The development environment behind ``make run`` and the kcp e2e tests: build and start a
local kcp, bootstrap the demo workspaces, print the lines to try.

It lives beside the ``vwserver`` package and never ships: it needs the repository (the kcp build
script, ``config/demo/``, ``manifests/``), which an installed package or the image does not have.
"""
