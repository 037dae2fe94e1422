"""The serving TLS context, reloaded in place when the certificate files change.

Certificates are rotated by replacing files (cert-manager, a Kubernetes Secret volume). A restart
to pick them up would cut every open watch, so vwserver keeps *one* ``SSLContext`` for its
listener and calls ``load_cert_chain`` on it again when the files' content changes. OpenSSL
copies the certificate into each connection when the connection is created (``SSL_new``), so
connections that are already open keep the certificate they started with and new handshakes get
the new one.

A rotation is not atomic: the certificate and the key are two files, and a poll may see one new
and one old. The new pair is therefore first loaded into a scratch context, from a private
snapshot of the bytes that were read; only a pair that loads there is loaded into the serving
context (a failed ``load_cert_chain`` on the live context could leave it with a certificate that
does not match its key). A bad pair is logged and retried at the next poll; the old one stays.

The client CA (``tls.clientCAFile``) is read once at start: OpenSSL can add CAs to a live
context but never remove one, so reloading it in place could only ever widen trust.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_RELOAD_INTERVAL = 10.0


class ServingTLS:
    """A server ``SSLContext`` (TLS 1.2 minimum) whose certificate follows its two files.

    Raises ``OSError``/``ssl.SSLError`` when the initial files are unusable.
    """

    def __init__(
        self, *, cert_file: Path, key_file: Path, client_ca_file: Path | None = None
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        if client_ca_file is not None:
            self.context.load_verify_locations(cafile=str(client_ca_file))
            # Optional: bearer-token clients send no certificate; one that does must verify.
            self.context.verify_mode = ssl.CERT_OPTIONAL
        self._fingerprint = b""
        self._failed = b""
        self.reload()

    def reload(self) -> bool:
        """Load the files if their content changed since the last load; True if it did.

        Raises ``OSError``/``ssl.SSLError`` for unreadable or unusable files; the context keeps
        its current certificate then.
        """
        cert, key = self.cert_file.read_bytes(), self.key_file.read_bytes()
        fingerprint = hashlib.sha256(len(cert).to_bytes(8, "big") + cert + key).digest()
        if fingerprint == self._fingerprint:
            return False
        with tempfile.TemporaryDirectory(prefix="vwserver-tls-") as tmp:
            cert_path, key_path = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert_path.write_bytes(cert)
            key_path.touch(mode=0o600)
            key_path.write_bytes(key)
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path)
            self.context.load_cert_chain(cert_path, key_path)
        self._fingerprint = fingerprint
        return True

    async def watch(self, *, interval: float = DEFAULT_RELOAD_INTERVAL) -> None:
        """Poll the files every ``interval`` seconds and reload them on change, until cancelled.

        Runs on the event loop's thread on purpose: the context must not change while the loop
        creates a connection from it, and reading two small files takes microseconds.
        """
        while True:
            await asyncio.sleep(interval)
            try:
                if self.reload():
                    log.info("reloaded the serving certificate from %s", self.cert_file)
            except (OSError, ssl.SSLError) as e:
                # Log a broken pair once, not every poll; a later good pair is loaded as usual.
                marker = repr(e).encode()
                if marker != self._failed:
                    self._failed = marker
                    log.warning(
                        "serving certificate %s / %s not reloaded (keeping the current one): %s",
                        self.cert_file,
                        self.key_file,
                        e,
                    )
            else:
                self._failed = b""
