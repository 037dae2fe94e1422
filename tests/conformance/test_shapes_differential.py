"""The differential harness over the shapes export (:mod:`tests.support.shapes`): custom
resources with top-level ``object``/``rows`` members, one preserving unknown fields, one of kind
``Table``. Through the slice, every read equals kcp's own answer with the slice's selector —
which judges each object by its own labels — in every representation; a planted ``env=dev``
object dressed up with ``env=prod`` members is outside the slice like any other."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from devenv.bootstrap import Bootstrap, apply_retrying
from devenv.kcp import KcpInstance
from tests.conformance.conftest import SELECTOR, SLICE, Pair
from tests.conformance.harness import Case
from tests.conformance.test_differential import compare_with_kcp
from tests.support.shapes import API, KINDS, planted, shapes_world
from tests.support.slices import slices_over_kcp
from vwserver.k8s.kubeconfig import load_kubeconfig

NS = "shapes-conformance"
A = "consumer-a"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
KUBECTL = f"{TABLE},application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
POM = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
POM_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
YAML = "application/yaml"


def _cases() -> list[Case]:
    cases: list[Case] = []
    for resource in KINDS:
        listing = f"/{API}/namespaces/{NS}/{resource}"
        field = (("fieldSelector", f"metadata.namespace={NS}"),)
        for label, accept in (("plain", None), ("kubectl", KUBECTL), ("pom", POM_LIST)):
            cases.append(Case(f"{resource}-list-{label}", listing, accept=accept, cluster=A))
            cases.append(Case(f"{resource}-list-field-{label}", listing, field, accept, A))
        cases.append(Case(f"{resource}-list-yaml", listing, accept=YAML, cluster=A))
        cases.append(Case(f"{resource}-list-wildcard", f"/{API}/{resource}"))
        for name in ("control", "planted"):
            for label, accept in (("plain", None), ("kubectl", KUBECTL), ("pom", POM)):
                cases.append(
                    Case(
                        f"{resource}-get-{name}-{label}",
                        f"{listing}/{name}",
                        accept=accept,
                        cluster=A,
                        single_object=True,
                    )
                )
    return cases


CASES = _cases()


@pytest_asyncio.fixture(scope="module", loop_scope="session", params=["passthrough", "cache"])
async def shapes_pair(
    request: pytest.FixtureRequest, kcp: KcpInstance, world: Bootstrap
) -> AsyncIterator[Pair]:
    shapes = await shapes_world(kcp, world)
    ws = shapes.consumers[0]
    objects = [
        planted(
            resource,
            name,
            NS,
            labels={"env": env},
            looks_like={"env": "prod"},
            cluster=ws.cluster,
            secret="s3cret" if env == "dev" else "none",
        )
        for resource in KINDS
        for name, env in (("control", "prod"), ("planted", "dev"))
    ]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": [namespace, *objects]})
    await apply_retrying(kcp, ws.url, doc, within=60)
    auth = await load_kubeconfig(kcp.kubeconfig, context=kcp.admin_context)
    async with (
        slices_over_kcp(
            kcp, shapes, slices={SLICE: SELECTOR}, page_size=2, cache=request.param == "cache"
        ) as base,
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=auth.ssl_context()),
            timeout=aiohttp.ClientTimeout(total=60),
        ) as session,
    ):
        yield Pair(base, kcp, shapes, auth, session, cached=request.param == "cache")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_shapes_through_the_slice_equal_kcp_with_the_selector(
    shapes_pair: Pair, case: Case
) -> None:
    ignore: frozenset[str] = frozenset()
    if shapes_pair.cached and case.accept == POM_LIST:
        # Seen on kcp v0.32.3, and not this change's: the shared cache's PartialObjectMetadata
        # always carries kcp.io/original-api-version (kcp's has it for the demo's widgets), kcp's
        # own lacks it for these resources. Everything else must be equal.
        ignore = frozenset({"kcp.io/original-api-version"})
    await compare_with_kcp(shapes_pair, case, ignore_annotations=ignore)
