"""Path parsing and request classification (vwserver.proxy.paths)."""

from __future__ import annotations

import pytest

from vwserver.errors import BadRequest, MethodNotAllowed, NotFound
from vwserver.proxy.paths import PREFIX, ApiRequest, Verb, classify, split_slice_path


def test_split_slice_path() -> None:
    p = split_slice_path(PREFIX + "abc123/prod/clusters/xyz789/apis/example.io/v1alpha1/widgets")
    assert p is not None
    assert (p.slice_cluster, p.slice_name, p.cluster) == ("abc123", "prod", "xyz789")
    assert p.api_path == "/apis/example.io/v1alpha1/widgets"
    assert not p.wildcard
    w = split_slice_path(PREFIX + "abc123/prod/clusters/*/api")
    assert w is not None and w.wildcard and w.api_path == "/api"
    # client-go sends the wildcard percent-encoded
    assert split_slice_path(PREFIX + "abc123/prod/clusters/%2A/api") == w


def test_not_below_prefix() -> None:
    assert split_slice_path("/services/apiexport/a/b/clusters/c/api") is None


@pytest.mark.parametrize(
    "tail",
    [
        "abc/prod/clusters/xyz/apis/example.io/v1/namespaces/%2F/widgets",
        "abc/prod/clusters/xyz/apis/example.io/v1/namespaces/a%2fb/widgets",
        "abc/prod/clusters/xyz/apis/example.io/../v1/widgets",
        "abc/prod/clusters/xyz/apis//v1/widgets",
        "abc/prod/clusters/xyz/apis/./v1/widgets",
        "abc/prod/clusters/root:org/api",
        "ABC/prod/clusters/xyz/api",
        "abc/Prod/clusters/xyz/api",
        "abc/prod/cluster/xyz/api",
        "abc/prod",
        "abc/prod/clusters/-x/api",
        "abc/prod/clusters/**/api",
    ],
)
def test_malformed_paths_are_bad_requests(tail: str) -> None:
    with pytest.raises(BadRequest):
        split_slice_path(PREFIX + tail)


@pytest.mark.parametrize(
    ("path", "method", "watch", "expected"),
    [
        ("/api", "GET", False, ApiRequest(discovery=True, verb=Verb.GET, discovery_path="/api")),
        ("/apis", "GET", False, ApiRequest(discovery=True, verb=Verb.GET, discovery_path="/apis")),
        (
            "/openapi/v3",
            "GET",
            False,
            ApiRequest(discovery=True, verb=Verb.GET, discovery_path="/openapi/v3"),
        ),
        (
            "/apis/example.io/v1alpha1",
            "GET",
            False,
            ApiRequest(
                discovery=True,
                verb=Verb.GET,
                group="example.io",
                discovery_path="/apis/example.io/v1alpha1",
            ),
        ),
        (
            "/apis/example.io/v1alpha1/widgets",
            "GET",
            False,
            ApiRequest(False, Verb.LIST, "example.io", "v1alpha1", "", "widgets"),
        ),
        (
            "/apis/example.io/v1alpha1/widgets",
            "GET",
            True,
            ApiRequest(False, Verb.WATCH, "example.io", "v1alpha1", "", "widgets"),
        ),
        (
            "/apis/example.io/v1alpha1/namespaces/ns1/widgets",
            "POST",
            False,
            ApiRequest(False, Verb.CREATE, "example.io", "v1alpha1", "ns1", "widgets"),
        ),
        (
            "/apis/example.io/v1alpha1/namespaces/ns1/widgets/w1",
            "GET",
            False,
            ApiRequest(False, Verb.GET, "example.io", "v1alpha1", "ns1", "widgets", "w1"),
        ),
        (
            "/apis/example.io/v1alpha1/namespaces/ns1/widgets/w1/status",
            "PATCH",
            False,
            ApiRequest(
                False, Verb.PATCH, "example.io", "v1alpha1", "ns1", "widgets", "w1", "status"
            ),
        ),
        (
            "/apis/example.io/v1alpha1/namespaces/ns1/widgets",
            "DELETE",
            False,
            ApiRequest(False, Verb.DELETECOLLECTION, "example.io", "v1alpha1", "ns1", "widgets"),
        ),
        (
            "/api/v1/namespaces/ns1/configmaps/c",
            "PUT",
            False,
            ApiRequest(False, Verb.UPDATE, "", "v1", "ns1", "configmaps", "c"),
        ),
        (
            "/api/v1/namespaces/ns1",
            "GET",
            False,
            ApiRequest(False, Verb.GET, "", "v1", "", "namespaces", "ns1"),
        ),
    ],
)
def test_classify(path: str, method: str, watch: bool, expected: ApiRequest) -> None:
    assert classify(path, method=method, watch=watch) == expected


def test_apibindings_are_recognised() -> None:
    api = classify("/apis/apis.kcp.io/v1alpha2/apibindings", method="GET", watch=False)
    assert api.is_apibindings


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/apis", "POST"),
        ("/apis/example.io/v1alpha1/widgets", "PUT"),
        ("/apis/example.io/v1alpha1/widgets/w1", "POST"),
    ],
)
def test_methods_not_allowed(path: str, method: str) -> None:
    with pytest.raises(MethodNotAllowed):
        classify(path, method=method, watch=False)


@pytest.mark.parametrize(
    "path",
    [
        "/apis/Example.io/v1/widgets",
        "/apis/example.io/v1/namespaces/NS/widgets",
        "/apis/example.io/v1/widgets/a/b/c/d",
        "/apis/example.io/v1/watch",
        "/apis/example.io/v1/watch/namespaces/ns1/widgets/w1/status",
        "/apis/example.io/v1/watch/widgets/w1/extra",
        "/",
    ],
)
def test_bad_api_paths(path: str) -> None:
    with pytest.raises(BadRequest):
        classify(path, method="GET", watch=False)


@pytest.mark.parametrize(
    "path",
    ["/foo", "/openapi/v4", "/version/x", "/openapi/v3/apis/example.io", "/healthz"],
)
def test_unknown_documents_are_not_found(path: str) -> None:
    with pytest.raises(NotFound):
        classify(path, method="GET", watch=False)


def test_only_the_status_subresource_exists() -> None:
    with pytest.raises(NotFound):
        classify("/apis/example.io/v1/namespaces/ns1/widgets/w1/scale", method="GET", watch=False)
    api = classify(
        "/apis/example.io/v1/namespaces/ns1/widgets/w1/status", method="GET", watch=False
    )
    assert api.path == "/apis/example.io/v1/namespaces/ns1/widgets/w1/status"


@pytest.mark.parametrize(
    ("path", "name", "upstream_path"),
    [
        ("/apis/example.io/v1/watch/widgets", "", "/apis/example.io/v1/widgets"),
        (
            "/apis/example.io/v1/watch/namespaces/ns1/widgets",
            "",
            "/apis/example.io/v1/namespaces/ns1/widgets",
        ),
        (
            "/apis/example.io/v1/watch/namespaces/ns1/widgets/w1",
            "w1",
            "/apis/example.io/v1/namespaces/ns1/widgets",
        ),
        ("/api/v1/watch/namespaces/ns1/configmaps/c", "c", "/api/v1/namespaces/ns1/configmaps"),
    ],
)
def test_deprecated_watch_paths_are_watches_of_the_collection(
    path: str, name: str, upstream_path: str
) -> None:
    """The apiserver still serves /watch/ paths; the proxy serves them as the watches they are
    and sends the upstream the collection path (the name becomes a field selector)."""
    api = classify(path, method="GET", watch=False)
    assert api.verb is Verb.WATCH and api.legacy_watch and api.name == name
    assert api.path == upstream_path


def test_a_get_of_one_object_ignores_watch() -> None:
    # The apiserver's RequestInfo: "watch" is a list option; GET <name>?watch=1 is a GET.
    api = classify("/apis/example.io/v1/namespaces/ns1/widgets/w1", method="GET", watch=True)
    assert api.verb is Verb.GET


def test_upstream_path_is_rebuilt_not_copied() -> None:
    api = classify("/apis/example.io/v1//namespaces/ns1/widgets/w1/", method="PUT", watch=False)
    assert api.path == "/apis/example.io/v1/namespaces/ns1/widgets/w1"
