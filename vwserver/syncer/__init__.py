"""The syncer (``vwserver sync``, issue #6): kcp objects into a downstream cluster, status back.

Modules, pure logic apart from I/O: ``config`` (the YAML file), ``naming`` (downstream
namespaces, link metadata, metadata filtering), ``reconcile`` (the decision table),
``queue`` (work queue), ``client`` (REST calls on :mod:`vwserver.k8s.client`), ``informer``
(list+watch cache), ``controller`` (one resource type), ``lease`` (leader election),
``endpoints`` (endpoint slices), ``metrics``/``health`` (Prometheus, probes), ``runner`` (one
syncer process), ``cli`` (``vwserver sync``).
"""
