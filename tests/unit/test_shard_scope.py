"""Shard-scoped replicas (``controller.shards``): the pure part — which endpoints, routes and
conditions a replica set's status holds, what it owns according to ``managedFields``, and the
config's validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_config import good, write
from tests.unit.test_slice_status import found, slice_obj
from vwserver.config import load_config
from vwserver.controller.scope import ShardScope, merged, own_part, owned, same_part
from vwserver.controller.slice_status import desired
from vwserver.errors import ConfigError
from vwserver.k8s.kcp import shard_id, slice_endpoint_urls
from vwserver.routes import Routes, RouteTable
from vwserver.server import build_controller, lease_name

VW1 = "https://shard-1:6443/services/apiexport/exp123/widgets.example.io"
VW2 = "https://shard-2:6443/services/apiexport/exp123/widgets.example.io"
ONE = ShardScope(name="one", virtual_workspace_urls=("https://shard-1:6443",))
TWO = ShardScope(name="two", virtual_workspace_urls=("https://shard-2:6443/",))
EXT = "https://vw.example"


def test_serves_by_the_shards_virtual_workspace_url() -> None:
    assert ONE.serves(VW1) and not ONE.serves(VW2)
    assert TWO.serves(VW2)
    assert not ONE.serves("https://shard-1:64430/services/apiexport/x/y")  # not a prefix match
    assert ONE.field_manager == "vwserver-one"


def test_each_scope_publishes_its_shards_url_of_the_whole_slice() -> None:
    every = slice_endpoint_urls(
        external_url=EXT, cluster="slicews", name="prod", upstreams=[VW1, VW2]
    )
    one = desired(slice_obj(), lookup=found(VW1, VW2), external_url=EXT, now="T", scope=ONE)
    two = desired(slice_obj(), lookup=found(VW1, VW2), external_url=EXT, now="T", scope=TWO)
    assert [e["url"] for e in one.status["endpoints"]] == [every[0]]
    assert [e["url"] for e in two.status["endpoints"]] == [every[1]]
    assert every[0].endswith(f"/shards/{shard_id(VW1)}")  # the /shards/ form, as unscoped
    # The route serves only the scope's shard: another shard's id is unknown here.
    assert one.route.shards == {shard_id(VW1): VW1} and one.route.upstream_url == VW1
    assert {c["type"] for c in one.status["conditions"]} == {
        "one/SelectorValid",
        "one/APIExportValid",
        "one/Ready",
    }


def test_a_scope_without_a_binding_on_its_shards_is_not_ready() -> None:
    out = desired(slice_obj(), lookup=found(VW1), external_url=EXT, now="T", scope=TWO)
    ready = next(c for c in out.status["conditions"] if c["type"] == "two/Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NoServedShard")
    assert out.status["endpoints"] == [] and out.route.not_ready is not None
    assert out.route.shards == {}


def managed(manager: str, urls: list[str], types: list[str]) -> dict[str, Any]:
    status: dict[str, Any] = {}
    status["f:endpoints"] = {f'k:{{"url":"{u}"}}': {".": {}, "f:url": {}} for u in urls}
    status["f:conditions"] = {f'k:{{"type":"{t}"}}': {".": {}} for t in types}
    return {
        "manager": manager,
        "operation": "Update",  # kcp's VW records an apply so (see vwserver.controller.scope)
        "subresource": "status",
        "fieldsV1": {"f:status": status},
    }


def test_own_part_is_what_the_manager_owns_in_any_order() -> None:
    one = desired(slice_obj(), lookup=found(VW1, VW2), external_url=EXT, now="T", scope=ONE)
    two = desired(slice_obj(), lookup=found(VW1, VW2), external_url=EXT, now="T", scope=TWO)
    whole = {
        "observedGeneration": 3,
        "endpoints": two.status["endpoints"] + one.status["endpoints"],
        "conditions": list(reversed(two.status["conditions"] + one.status["conditions"])),
    }
    obj = slice_obj()
    obj["metadata"]["managedFields"] = [
        managed(
            "vwserver-one",
            [e["url"] for e in one.status["endpoints"]],
            [c["type"] for c in one.status["conditions"]],
        ),
        managed(
            "vwserver-two",
            [e["url"] for e in two.status["endpoints"]],
            [c["type"] for c in two.status["conditions"]],
        ),
        {"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:status": {}}},
    ]
    mine = owned(obj, "vwserver-one")
    assert same_part(own_part(whole, mine), one.status)  # idle: nothing to write
    assert not same_part(own_part(whole, owned(obj, "vwserver-three")), one.status)
    # An endpoint it owned and no longer wants: a write (the apply drops it).
    fewer = desired(slice_obj(), lookup=found(VW2), external_url=EXT, now="T", scope=ONE)
    assert not same_part(own_part(whole, mine), fewer.status)
    # Writing: the other manager's entries stay as they are, this one's are replaced ...
    out = merged(whole, mine, fewer.status)
    assert [e["url"] for e in out["endpoints"]] == [e["url"] for e in two.status["endpoints"]]
    assert {c["type"] for c in out["conditions"]} == {
        c["type"] for c in two.status["conditions"] + fewer.status["conditions"]
    }
    # ... and retiring (nothing wanted) leaves only the other manager's part.
    gone = merged(whole, mine, {})
    assert gone["endpoints"] == two.status["endpoints"]
    assert gone["conditions"] == [c for c in whole["conditions"] if c["type"].startswith("two/")]
    assert gone["observedGeneration"] == 3


def scoped(tmp_path: Path, shards: Any) -> dict[str, Any]:
    doc = good()
    doc["externalURL"] = EXT
    doc["controller"] = {"export": {"path": "root:vwserver"}, "shards": shards}
    return doc


def test_the_config_builds_a_scoped_controller(tmp_path: Path) -> None:
    doc = scoped(tmp_path, {"name": "one", "virtualWorkspaceURLs": ["https://shard-1:6443/"]})
    config = load_config(write(tmp_path, doc))
    assert config.controller is not None and config.controller.shards is not None
    assert config.controller.shards.virtual_workspace_urls == ["https://shard-1:6443/"]


@pytest.mark.parametrize(
    ("shards", "field", "problem"),
    [
        ({"name": "One", "virtualWorkspaceURLs": ["https://a"]}, "$.controller.shards.name", "DNS"),
        ({"name": "one", "virtualWorkspaceURLs": []}, "virtualWorkspaceURLs", "at least one"),
        (
            {"name": "one", "virtualWorkspaceURLs": ["https://a", "shard-2:6443"]},
            "$.controller.shards.virtualWorkspaceURLs[1]",
            "not an http(s) URL",
        ),
        (
            {"name": "one", "virtualWorkspaceURLs": ["https://a", "https://a/"]},
            "$.controller.shards.virtualWorkspaceURLs[1]",
            "twice",
        ),
        (
            {"name": "one", "virtualWorkspaceURLs": ["https://u:p@a"]},
            "$.controller.shards.virtualWorkspaceURLs[0]",
            "credentials",
        ),
        ({"name": "one"}, "virtualWorkspaceURLs", "missing required field"),
    ],
)
def test_bad_shards_are_named(tmp_path: Path, shards: Any, field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, scoped(tmp_path, shards)))
    assert field in str(info.value)
    assert problem.lower() in str(info.value).lower()


def test_build_controller_passes_the_scope(tmp_path: Path) -> None:
    doc = scoped(tmp_path, {"name": "one", "virtualWorkspaceURLs": ["https://shard-1:6443/"]})
    config = load_config(write(tmp_path, doc))
    controller = build_controller(
        config,
        client=None,  # type: ignore[arg-type]  # not used before run()
        routes=Routes(),
        static=RouteTable(),
    )
    assert controller._settings.scope == ONE


def test_each_replica_set_has_a_lease_of_its_own() -> None:
    assert lease_name("vwserver-controller", ONE) == "vwserver-controller-one"
    assert lease_name("vwserver-controller", None) == "vwserver-controller"
    assert lease_name("mine", ONE) == "mine"  # a name given is kept
