"""Writing files that hold a secret (a private key, a token, a kubeconfig with a token).

Such a file is readable by its owner only (mode 0600) from its first byte on: created with
that mode (``O_CREAT | O_EXCL``, so a name planted by someone else — a symlink, a file of
theirs — makes the write fail instead of writing through it), never created readable and
``chmod``-ed afterwards, when another user may already have opened it. An existing regular file
(also one a symlink points at) is replaced by renaming a new private file over it, so that a
process that had the old file open keeps reading the old content and the file's old, possibly
wider mode is gone with it. A path that is neither (``/dev/stdout``, a pipe) is written to as it
is: it has no mode to keep private.

``write_text``, ``open(..., "w")`` and trustme's ``write_to_path`` create files with the umask's
mode (0644 by default): the project writes keys, kubeconfigs and token lists only through
:func:`write_private`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

PRIVATE_MODE = 0o600
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC


def write_private(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path``, readable and writable by its owner only."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        existing = os.stat(path)  # follows a symlink: the file it names is replaced
    except FileNotFoundError:
        _create(Path(path), raw)
        return
    if not stat.S_ISREG(existing.st_mode):
        with open(path, "wb") as f:  # a device or pipe: a stream, not a file to keep
            f.write(raw)
        return
    target = Path(os.path.realpath(path))
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    _create(temporary, raw)
    try:
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _create(path: Path, raw: bytes) -> None:
    """A new file at ``path`` with mode :data:`PRIVATE_MODE` (less if the umask says so)."""
    fd = os.open(path, _CREATE, PRIVATE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
