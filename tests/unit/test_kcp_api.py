"""kcp's API in one module (vwserver.k8s.kcp): resource types and every URL vwserver builds."""

from __future__ import annotations

from vwserver.k8s import kcp


def test_workspace_urls_replace_a_workspace_the_server_names() -> None:
    assert kcp.workspace("root:org") == "/clusters/root:org"
    assert (
        kcp.workspace("root:org", server="https://kcp:6443") == "https://kcp:6443/clusters/root:org"
    )
    assert (
        kcp.workspace("root:b", server="https://kcp:6443/clusters/root:a/")
        == "https://kcp:6443/clusters/root:b"
    )
    assert kcp.origin("https://kcp:6443/clusters/root:a") == "https://kcp:6443"


def test_virtual_workspace_urls() -> None:
    vw = kcp.export_virtual_workspace("https://kcp:6443/clusters/root", cluster="abc", name="w.io")
    assert vw == "https://kcp:6443/services/apiexport/abc/w.io"
    assert kcp.clusters(vw + "/") == vw + "/clusters/*"
    assert kcp.SLICES.item(kcp.clusters(vw, "c1"), None, "s", subresource="status") == (
        vw
        + "/clusters/c1/apis/sync.edge-connect.eu/v1alpha1/filteredapiexportendpointslices/s/status"
    )
    assert kcp.APIEXPORTS.item(kcp.workspace("root"), None, "w.io") == (
        "/clusters/root/apis/apis.kcp.io/v1alpha2/apiexports/w.io"
    )


def test_endpoint_urls_are_distinct_and_without_trailing_slash() -> None:
    eps = {
        "status": {
            "endpoints": [{"url": "https://a/"}, {"url": "https://a"}, {}, {"url": "https://b"}]
        }
    }
    assert kcp.endpoint_urls(eps) == ["https://a", "https://b"]
    assert kcp.endpoint_urls(None) == [] == kcp.endpoint_urls({"status": {}})


def test_logical_cluster() -> None:
    assert (
        kcp.logical_cluster({"metadata": {"annotations": {kcp.CLUSTER_ANNOTATION: "c1"}}}) == "c1"
    )
    assert kcp.logical_cluster({"metadata": {}}) == ""
