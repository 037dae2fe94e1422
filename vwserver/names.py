"""The shapes of names kcp and Kubernetes accept — pure, one definition each.

Every place that checks a name before it goes into a URL or an object (the proxy's path parser,
the config files, the kubeconfig command) uses these, so a name one of them accepts is a name the
others accept too.
"""

from __future__ import annotations

import re
from typing import Final

_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_SUBDOMAIN_PART = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"

LOGICAL_CLUSTER_RE: Final = re.compile(rf"^{_LABEL}$")
"""A kcp logical-cluster name: an ID such as ``2fx3m0rnxzbs8mq9``, or ``root``. Workspace *paths*
(``root:org``) are not valid where kcp wants a logical cluster (virtual-workspace URLs)."""

WORKSPACE_RE: Final = re.compile(rf"^{_LABEL}(:{_LABEL})*$")
"""A workspace path (``root:org:team``) or a logical-cluster ID: what ``/clusters/<ws>`` takes."""

DNS_LABEL_RE: Final = LOGICAL_CLUSTER_RE
"""A DNS-1123 label (≤ 63 characters): namespaces, versions, resource plurals. Logical-cluster
names have the same shape."""

OBJECT_NAME_RE: Final = re.compile(rf"^{_SUBDOMAIN_PART}(\.{_SUBDOMAIN_PART})*$")
"""A DNS-1123 subdomain: object names (slices, exports), API groups. The 253-character limit is
checked where it matters, apart from the pattern."""
