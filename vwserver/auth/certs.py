"""The identity in a verified client certificate: CN = user, O = groups (Kubernetes' x509 rule).

Only certificates signed by the configured client CA ever get here: the serving context asks
for a certificate with ``CERT_OPTIONAL``, and OpenSSL then aborts the handshake when a client
presents one it cannot verify (for a client certificate it also requires the ``clientAuth``
extended key usage when the certificate has one). Python hands out the decoded certificate
(``peercert``) only after successful verification, so an empty or missing one means "no
certificate", never "unverified certificate".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from vwserver.auth.identity import Identity

AUTHENTICATED_GROUP = "system:authenticated"


def identity_from_peercert(peercert: Mapping[str, Any] | None) -> Identity | None:
    """The identity of a decoded, verified certificate (``SSLSocket.getpeercert()`` shape).

    None without a certificate or without a common name (the apiserver refuses those too), or
    with a name or group that is not printable text (see the module docstring).
    """
    if not peercert:
        return None
    user = ""
    groups: list[str] = []
    # subject is a tuple of RDNs, each a tuple of (attribute, value) pairs.
    for rdn in peercert.get("subject", ()):
        for attribute, value in rdn:
            if attribute == "commonName" and not user:
                user = str(value)
            elif attribute == "organizationName":
                groups.append(str(value))
    if not user or not all(name.isprintable() for name in (user, *groups)):
        return None
    # Every authenticated user is in system:authenticated (the apiserver's AuthenticatedGroupAdder
    # does this for all authenticators; kcp's TokenReview answers already contain it).
    if AUTHENTICATED_GROUP not in groups:
        groups.append(AUTHENTICATED_GROUP)
    return Identity.create(user, groups=groups)


def client_certificate_identity(request: web.Request) -> Identity | None:
    """The identity of the request's verified client certificate, if it sent one."""
    transport = request.transport
    if transport is None:
        return None
    peercert = transport.get_extra_info("peercert")
    return identity_from_peercert(peercert if isinstance(peercert, Mapping) else None)
