"""Route table replacement and retirement (vwserver.routes)."""

from __future__ import annotations

from vwserver.proxy.paths import PREFIX, split_slice_path
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector


def route(name: str, url: str = "https://a") -> Route:
    return Route(cluster="c", name=name, selector=Selector.parse("env=prod"), upstream_url=url)


def test_replace_retires_removed_and_changed_routes_only() -> None:
    keep, drop, move = route("keep"), route("drop"), route("move")
    routes = Routes(RouteTable([keep, drop, move]))
    routes.replace(RouteTable([route("keep"), route("move", "https://b"), route("new")]))
    assert routes.table.lookup("c", "keep") is keep  # same identity: not retired
    assert not keep.retired.is_set()
    assert drop.retired.is_set()
    assert move.retired.is_set()
    moved = routes.table.lookup("c", "move")
    assert moved is not None
    assert moved.upstream_url == "https://b"
    assert routes.table.lookup("c", "drop") is None


def test_a_ready_route_replaced_by_a_not_ready_one_is_retired() -> None:
    """A revoked grant (or a vanished export) turns a served slice into a 503: the watches
    opened on the ready route must end, or they would go on streaming the export."""
    ready = route("prod")
    routes = Routes(RouteTable([ready]))
    refused = Route(
        cluster="c", name="prod", selector=ready.selector, upstream_url="", not_ready="refused"
    )
    routes.replace(RouteTable([refused]))
    assert ready.retired.is_set()
    assert routes.table.lookup("c", "prod") is refused
    assert not refused.retired.is_set()


def test_shard_segment_in_paths() -> None:
    p = split_slice_path(PREFIX + "c/n/shards/0a1b2c/clusters/*/api")
    assert p is not None
    assert (p.slice_cluster, p.slice_name, p.shard, p.cluster, p.api_path) == (
        "c",
        "n",
        "0a1b2c",
        "*",
        "/api",
    )
    plain = split_slice_path(PREFIX + "c/n/clusters/x/api")
    assert plain is not None
    assert plain.shard == ""
