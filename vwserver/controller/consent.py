"""Which exports a slice may serve: the consent of the export's owner — pure, no I/O.

vwserver reads every export with its own identity. Without a check, a FilteredAPIExportEndpointSlice
in *any* workspace that binds vwserver's API could name *any* APIExport and have vwserver serve it
(a confused deputy): the slice's author grants himself the slice's ``content`` and reads the
provider's objects through vwserver. So a slice serves an export only when the export's owner
agreed:

* the slice lives in the export's own logical cluster (its ``kcp.io/cluster`` annotation equals
  the export's; kcp sets that annotation itself, a client cannot choose it) — consent implied; or
* the export's workspace grants the slice's workspace. vwserver asks kcp with a
  SubjectAccessReview in the export's logical cluster for the synthetic user
  ``system:vwserver:workspace:<slice logical cluster>`` (no groups), verb ``filter`` on
  ``apis.kcp.io`` ``apiexports`` named like the export.

Verified against kcp v0.32.3: kcp evaluates the review with its whole authorizer chain, so the
synthetic user also needs verb ``access`` on non-resource URL ``/`` in the export's workspace (its
workspace content authorizer); with only one of the two rules the answer is no.
``manifests/rbac/export-grants-slice-workspace.yaml`` grants both. ``filter`` is a verb no kcp
code checks: the grant gives the synthetic user (which no credential carries) nothing it could
use, and no one else anything at all. The review has no groups, not even
``system:authenticated``, so a grant to a group never counts as consent.

The controller asks on every reconcile and resync and caches nothing: a revoked grant ends the
slice's routes at the next resync.
"""

from __future__ import annotations

from typing import Any

from vwserver.k8s.kcp import APIEXPORTS

SUBJECT_PREFIX = "system:vwserver:workspace:"
VERB = "filter"
GROUP = APIEXPORTS.group
RESOURCE = APIEXPORTS.resource
GRANT_EXAMPLE = "manifests/rbac/export-grants-slice-workspace.yaml"


def subject(slice_cluster: str) -> str:
    """The synthetic user that stands for a slice's workspace in the consent review."""
    return f"{SUBJECT_PREFIX}{slice_cluster}"


def implied(*, slice_cluster: str, export_cluster: str) -> bool:
    """A slice in the export's own logical cluster needs no grant."""
    return bool(slice_cluster) and slice_cluster == export_cluster


def review(*, slice_cluster: str, export_name: str) -> dict[str, Any]:
    """The SubjectAccessReview to POST in the export's logical cluster."""
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": subject(slice_cluster),
            "resourceAttributes": {
                "verb": VERB,
                "group": GROUP,
                "resource": RESOURCE,
                "name": export_name,
            },
        },
    }


def missing_grant(*, slice_cluster: str, export_path: str, export_name: str) -> str:
    """What the export's owner must grant, for the slice's status (names only, no secrets)."""
    return (
        f"workspace {export_path} has not granted workspace {slice_cluster} filtered views of "
        f"APIExport {export_name}: a slice outside the export's workspace is served only if, "
        f'in {export_path}, user "{subject(slice_cluster)}" may "{VERB}" {GROUP} {RESOURCE} '
        f'"{export_name}" and "access" "/" (see {GRANT_EXAMPLE}); until then vwserver reads '
        "nothing of the export and tells nothing about it, not even whether it exists"
    )
