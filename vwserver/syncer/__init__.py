"""The syncer (``vwserver sync``): kcp objects into a downstream cluster, status back.

Modules, pure logic apart from I/O: ``config`` (the YAML file), ``naming`` (downstream
namespaces, link metadata, metadata filtering), ``sync_plan`` (the decision table: what to do
for one object), ``sync_loop`` (one resource type: reflectors, caches, work queue and workers,
all from :mod:`vwserver.k8s`), ``endpoints`` (endpoint slices and the connection to their
URLs), ``clients`` (the three connections: kcp, endpoints, downstream), ``checks`` (configured
resources against discovery before syncing), ``metrics``/``health`` (Prometheus, probes),
``runner`` (one syncer process, leader election with :mod:`vwserver.k8s.lease`, outages
survived), ``decommission`` (``--decommission``: finalizers and downstream copies of a syncer
stopped for good), ``cli`` (``vwserver sync``).
"""
