"""Accept negotiation and query checking (vwserver.proxy.negotiation, vwserver.proxy.options)."""

from __future__ import annotations

import pytest

from vwserver.errors import BadRequest, NotAcceptable
from vwserver.proxy.negotiation import (
    PLAIN,
    Representation,
    Shape,
    negotiate,
    negotiate_discovery,
)
from vwserver.proxy.options import check, watch_requested
from vwserver.proxy.paths import Verb

KUBECTL_GET = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


@pytest.mark.parametrize(
    ("accept", "verb", "expected"),
    [
        (None, Verb.GET, PLAIN),
        ("*/*", Verb.LIST, PLAIN),
        ("application/json, */*", Verb.WATCH, PLAIN),
        (KUBECTL_GET, Verb.LIST, Representation(shape=Shape.TABLE, version="v1")),
        (KUBECTL_GET, Verb.WATCH, Representation(shape=Shape.TABLE, version="v1")),
        (
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
            Verb.LIST,
            Representation(shape=Shape.PARTIAL_LIST, version="v1"),
        ),
        (
            "application/vnd.kubernetes.protobuf, application/json",
            Verb.GET,
            PLAIN,
        ),
        ("application/yaml", Verb.GET, Representation(yaml=True)),
        ("application/yaml;q=0.5, application/json", Verb.GET, PLAIN),
        # a shape the verb cannot produce is skipped for the next entry
        (
            "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io, application/json",
            Verb.GET,
            PLAIN,
        ),
    ],
)
def test_negotiate(accept: str | None, verb: Verb, expected: Representation) -> None:
    assert negotiate(accept, verb=verb) == expected


@pytest.mark.parametrize(
    ("accept", "verb"),
    [
        ("text/html", Verb.GET),
        ("application/yaml", Verb.WATCH),
        ("application/yaml", Verb.CREATE),
        ("application/json;as=Table;v=v2;g=meta.k8s.io", Verb.LIST),
        ("application/json;as=Table;v=v1;g=evil.io", Verb.LIST),
        ("application/json;as=Secret;v=v1;g=meta.k8s.io", Verb.LIST),
        ("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io", Verb.GET),
        ("application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io", Verb.LIST),
        ("application/json;q=0", Verb.GET),
        ("application/json;junk", Verb.GET),
        (",".join(["application/json"] * 40), Verb.GET),
    ],
)
def test_unservable_representations_are_406(accept: str, verb: Verb) -> None:
    with pytest.raises(NotAcceptable):
        negotiate(accept, verb=verb)


def test_upstream_accept_is_one_canonical_entry() -> None:
    rep = negotiate(KUBECTL_GET, verb=Verb.LIST)
    assert rep.upstream_accept == "application/json;as=Table;v=v1;g=meta.k8s.io"
    assert negotiate("application/yaml", verb=Verb.GET).upstream_accept == "application/json"


def test_discovery_accept_keeps_only_well_formed_known_entries() -> None:
    accept = (
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
        "text/evil;x=y,application/json;as=a b,application/json"
    )
    assert negotiate_discovery(accept).upstream_accept == (
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
    )
    assert negotiate_discovery(None).upstream_accept == "application/json"


@pytest.mark.parametrize(
    ("query", "watch"),
    [([], False), ([("watch", "true")], True), ([("watch", "1")], True), ([("watch", "0")], False)],
)
def test_watch_requested(query: list[tuple[str, str]], watch: bool) -> None:
    assert watch_requested(query) is watch


@pytest.mark.parametrize(
    "query",
    [
        [("watch", "yes")],
        [("watch", "")],
        [("watch", "1"), ("watch", "1")],
        # strconv.ParseBool: false; the apiserver's option decoder: true (not "0" or "false")
        [("watch", "F")],
        [("watch", "f")],
    ],
)
def test_watch_values_that_are_not_one_boolean_are_400(query: list[tuple[str, str]]) -> None:
    with pytest.raises(BadRequest):
        watch_requested(query)


def test_check_keeps_known_options_in_order() -> None:
    query = [("labelSelector", "a=b"), ("limit", "500"), ("timeout", "32s")]
    options = check(query, verb=Verb.LIST)
    assert options.items == tuple(query)
    assert options.get("limit") == "500" and "timeout" in options


@pytest.mark.parametrize(
    ("query", "verb"),
    [
        ([("labelSelector", "a"), ("labelSelector", "b")], Verb.LIST),
        ([("force", "true")], Verb.UPDATE),
        ([("dryRun", "Some")], Verb.PATCH),
        ([("limit", "ten")], Verb.LIST),
        ([("gracePeriodSeconds", "x")], Verb.DELETE),
        ([("ignoreStoreReadErrorWithClusterBreakingPotential", "true")], Verb.DELETE),
        ([("continue", "a\nb")], Verb.LIST),
        ([("fieldManager", "x" * 129)], Verb.CREATE),
        ([("labelSelector", "a" * 5000)], Verb.LIST),
        ([("resourceVersion", "1;2")], Verb.GET),
    ],
)
def test_check_refuses(query: list[tuple[str, str]], verb: Verb) -> None:
    with pytest.raises(BadRequest):
        check(query, verb=verb)


def test_discovery_takes_only_common_options() -> None:
    assert check([("timeout", "32s")], verb=Verb.GET, discovery=True).items
    with pytest.raises(BadRequest):
        check([("labelSelector", "a=b")], verb=Verb.GET, discovery=True)
