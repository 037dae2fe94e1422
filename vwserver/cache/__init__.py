"""The shared watch cache: one upstream LIST+WATCH per resource, per-client views in process.

kube-apiserver does not give each watcher its own etcd watch: its *cacher* keeps one watch per
resource and computes every client's events from it. vwserver does the same in front of kcp's
APIExport virtual workspace, for the same reasons: a thousand informers on a slice must not be a
thousand upstream watches, and a slice's membership must be able to depend on more than a label
selector (the graceful handoff between slices needs finalizers and an annotation).

Layout (pure logic separated from I/O):

* :mod:`~vwserver.cache.entries` — what is stored: an object's raw bytes and its decoded
  metadata (:class:`Meta`), decoded once when the object arrives; a :class:`Change` of the
  bounded event window.
* :mod:`~vwserver.cache.store` — pure: the objects of one resource at the latest
  resourceVersion, the window of recent changes, snapshots at an older resourceVersion for
  paged lists, 410 Expired when a resourceVersion left the window.
* :mod:`~vwserver.cache.views` — pure: membership (:func:`visible`, from metadata alone), a
  client's own label and field selectors, and the watch transition of one change for one client.
* :mod:`~vwserver.cache.shared` — I/O: one :class:`SharedResource` per (upstream virtual
  workspace URL, group/version/resource): the reflector feeding the store, and the fan-out of
  changes to per-client bounded queues.
* :mod:`~vwserver.cache.registry` — starts a shared resource on first use and stops it after an
  idle period without clients.

Layer: below ``proxy`` (which serves LIST and WATCH from it), above ``k8s`` (whose reflector it
runs) and ``selector``.
"""
