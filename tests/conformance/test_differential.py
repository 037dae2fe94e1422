"""Through a slice, every read shows what kcp's own APIExport virtual workspace shows with the
slice's selector (see :mod:`tests.conformance.harness`). Adding a case is one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.conformance.allowlist import ALLOWED
from tests.conformance.conftest import SELECTOR, Pair
from tests.conformance.harness import (
    Answer,
    Case,
    combined_query,
    fetch,
    matches,
    without_annotations,
)

W = "/apis/example.io/v1alpha1"
NS = "team-red"
OBJ = f"{W}/namespaces/{NS}/widgets"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
TABLE_BETA = "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
POM = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
POM_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
KUBECTL = f"{TABLE},{TABLE_BETA},application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf,application/json"
A = "consumer-a"

CASES = [
    # LIST, every representation, wildcard and one cluster
    Case("list-all", f"{W}/widgets"),
    Case("list-all-kubectl", f"{W}/widgets", accept=KUBECTL),
    Case("list-table-v1beta1", f"{W}/widgets", accept=TABLE_BETA),
    Case("list-table-object", f"{W}/widgets", (("includeObject", "Object"),), TABLE),
    Case("list-table-metadata", f"{W}/widgets", (("includeObject", "Metadata"),), TABLE),
    Case("list-table-none", f"{W}/widgets", (("includeObject", "None"),), TABLE),
    Case("list-pom", f"{W}/widgets", accept=POM_LIST),
    Case("list-yaml", f"{W}/widgets", accept=YAML),
    Case("list-protobuf", f"{W}/widgets", accept=PROTOBUF),
    Case("list-cluster", f"{W}/widgets", cluster=A),
    Case("list-namespace", OBJ, cluster=A),
    Case("list-namespace-table", OBJ, accept=KUBECTL, cluster=A),
    Case("list-namespace-wildcard", OBJ),
    Case("list-client-selector", f"{W}/widgets", (("labelSelector", "region=eu"),)),
    Case("list-client-notin", f"{W}/widgets", (("labelSelector", "region notin (us)"),)),
    Case("list-field-name", f"{W}/widgets", (("fieldSelector", "metadata.name=prod-eu"),)),
    Case("list-field-namespace", f"{W}/widgets", (("fieldSelector", f"metadata.namespace={NS}"),)),
    Case("list-limit", f"{W}/widgets", (("limit", "2"),)),
    Case("list-limit-table", f"{W}/widgets", (("limit", "2"),), KUBECTL),
    Case("list-rv0", f"{W}/widgets", (("resourceVersion", "0"),)),
    # GET of one object: visible, outside the slice, missing; every representation
    *(
        Case(f"get-{name}-{label}", f"{OBJ}/{name}", accept=accept, cluster=A, single_object=True)
        for name in ("prod-eu", "dev-eu", "nope")
        for label, accept in (
            ("plain", None),
            ("kubectl", KUBECTL),
            ("table-beta", TABLE_BETA),
            ("pom", POM),
            ("yaml", YAML),
            ("protobuf", PROTOBUF),
        )
    ),
    Case("get-table-none", f"{OBJ}/prod-eu", (("includeObject", "None"),), TABLE, A, True),
    Case("get-status", f"{OBJ}/prod-eu/status", cluster=A, single_object=True),
    Case("get-status-foreign", f"{OBJ}/dev-eu/status", cluster=A, single_object=True),
    Case("get-wildcard-object", f"{OBJ}/prod-eu"),
    # discovery and the unfiltered apibindings
    Case("discovery-group-version", W, cluster=A),
    Case("discovery-api", "/api", cluster=A),
]

UNFILTERED = {"discovery-group-version", "discovery-api"}

# Tables (kubectl get) at resourceVersion=0: the cache always answers these (a consistent read
# falls back to kcp whenever kcp's resourceVersion moved with writes the cache has not heard
# of), so they prove the cache's Tables equal kcp's.
FROM_CACHE = [
    Case("table-rv0-kubectl", f"{W}/widgets", (("resourceVersion", "0"),), KUBECTL),
    Case("table-rv0-beta", f"{W}/widgets", (("resourceVersion", "0"),), TABLE_BETA),
    Case(
        "table-rv0-object",
        f"{W}/widgets",
        (("resourceVersion", "0"), ("includeObject", "Object")),
        TABLE,
    ),
    Case(
        "table-rv0-none",
        f"{W}/widgets",
        (("resourceVersion", "0"), ("includeObject", "None")),
        TABLE,
    ),
    Case(
        "table-rv0-selector",
        f"{W}/widgets",
        (("resourceVersion", "0"), ("labelSelector", "region=eu")),
        KUBECTL,
    ),
    Case("table-rv0-namespace", OBJ, (("resourceVersion", "0"),), KUBECTL, A),
    Case("table-rv0-limit", f"{W}/widgets", (("resourceVersion", "0"), ("limit", "2")), TABLE),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_slice_equals_kcp_with_the_selector(pair: Pair, case: Case) -> None:
    await compare_with_kcp(pair, case)


@pytest.mark.parametrize("case", FROM_CACHE, ids=lambda c: c.id)
async def test_tables_from_the_cache_equal_kcps(pair: Pair, case: Case) -> None:
    before = await pair.cache_reads("list", "served")
    await compare_with_kcp(pair, case)
    await pair.served_from_cache("list", before)


async def compare_with_kcp(
    pair: Pair, case: Case, *, ignore_annotations: frozenset[str] = frozenset()
) -> None:
    """The case through the slice equals kcp's answer with the slice's selector (with the
    annotations ``ignore_annotations`` removed from both: reviewed differences)."""
    through = await fetch(
        pair.session,
        pair.slice_url(case.cluster) + case.path,
        query=case.query,
        accept=case.accept,
        headers=case.headers,
        token=pair.token,
    )
    expected = await _kcp_with_selector(pair, case)
    if ignore_annotations:
        through = replace(through, body=without_annotations(through.body, ignore_annotations))
        expected = replace(expected, body=without_annotations(expected.body, ignore_annotations))
    if case.id in ALLOWED:
        assert through != expected, f"{case.id} no longer differs: remove it from ALLOWED"
        return
    assert through.status == expected.status, (through, expected)
    assert through.content_type == expected.content_type, (through, expected)
    assert through.body == expected.body


async def _kcp_with_selector(pair: Pair, case: Case) -> Answer:
    url = pair.direct_url(case.cluster) + case.path
    kw = {"accept": case.accept, "headers": case.headers, "token": pair.token}
    if case.id in UNFILTERED:
        return await fetch(pair.session, url, query=case.query, **kw)
    if not case.single_object:
        return await fetch(pair.session, url, query=combined_query(case.query, SELECTOR), **kw)
    answer = await fetch(pair.session, url, query=case.query, **kw)
    parts = case.path.split("/")
    resource = parts[parts.index("namespaces") + 2]  # .../namespaces/<ns>/<resource>/<name>
    name = parts[parts.index(resource) + 1]
    plain = await fetch(
        pair.session,
        url.split(f"/{resource}/{name}")[0] + f"/{resource}/{name}",
        query=(),
        accept=None,
        headers={},
        token=pair.token,
    )
    if answer.status != 200 or matches(plain.body, SELECTOR):
        return answer
    # kcp shows the object: with the selector it would be missing. Ask kcp for a missing one.
    missing = f"{name}-missing"
    return await fetch(
        pair.session,
        url.replace(f"/{resource}/{name}", f"/{resource}/{missing}", 1),
        query=case.query,
        rename=(missing, name),
        **kw,
    )
