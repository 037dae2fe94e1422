"""The authenticated caller, as kcp's ``user.Info`` describes it.

``extra`` matters as much as the name: kcp puts workspace scopes into it (a service account
token of workspace X carries ``authentication.kcp.io/scopes: [cluster:X]``, verified against kcp
v0.32), and kcp's authorizer denies a scoped user everywhere else. Forwarding ``extra`` unchanged
into the SubjectAccessReview keeps that restriction; dropping it would widen what the caller may
do through vwserver compared with kcp itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Identity:
    """A caller. Immutable and hashable, so it can be part of a cache key as it is."""

    user: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """``user.Info.Extra`` as sorted ``(key, values)`` pairs; see :meth:`create`."""

    @classmethod
    def create(
        cls,
        user: str,
        *,
        uid: str = "",
        groups: Iterable[str] = (),
        extra: Mapping[str, Iterable[str]] | None = None,
    ) -> Identity:
        """Normalise ``extra`` (sorted keys, values in order) so equal identities compare equal."""
        pairs = tuple(sorted((k, tuple(v)) for k, v in (extra or {}).items()))
        return cls(user=user, uid=uid, groups=tuple(groups), extra=pairs)

    def extra_dict(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.extra}
