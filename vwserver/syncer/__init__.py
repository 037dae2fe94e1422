"""The syncer (``vwserver sync``): kcp objects into a downstream cluster, status back.

Modules, pure logic apart from I/O: ``config`` (the YAML file), ``naming`` (downstream
namespaces, link metadata, metadata filtering), ``sync_plan`` (the decision table: what to do
for one object), ``sync_loop`` (one resource type: reflectors, caches, work queue and workers,
all from :mod:`vwserver.k8s`), ``endpoints`` (endpoint slices), ``metrics``/``health``
(Prometheus, probes), ``runner`` (one syncer process, leader election with
:mod:`vwserver.k8s.lease`), ``cli`` (``vwserver sync``).
"""
