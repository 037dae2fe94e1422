"""Who may use a slice: authentication, authorization and the serving TLS of vwserver.

A filtered endpoint is how a provider gives a team access to *part* of an export, so every slice
is a security boundary. vwserver itself holds no user database and no policy: it asks
kcp, exactly like an aggregated apiserver delegates to its main apiserver —

* **who** the caller is: a verified client certificate (:mod:`~vwserver.auth.certs`: CN = user,
  O = groups) or a bearer token that kcp accepts in a ``TokenReview``
  (:mod:`~vwserver.auth.tokens`);
* **what** the caller may do: a ``SubjectAccessReview`` in the slice's workspace for the request's
  verb on ``sync.edge-connect.eu`` ``filteredapiexportendpointslices/content`` named like the
  slice (:mod:`~vwserver.auth.access`), the model of the Go filtered-APIExport peer.

:class:`~vwserver.auth.guard.Guard` combines both and runs before anything is sent upstream.
Answers are cached briefly (:mod:`~vwserver.auth.cache`; keys hold an HMAC of a token, never the
token). :mod:`~vwserver.auth.tls` serves TLS from files that are reloaded in place when they
change, so certificate rotation needs no restart and cuts no open watch.
"""
