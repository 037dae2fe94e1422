"""The syncer's startup checks (vwserver.syncer.checks): discovery documents in, a ConfigError
naming the field out — or nothing when the resource is served as configured."""

from __future__ import annotations

from typing import Any

import pytest

from vwserver.errors import ConfigError
from vwserver.k8s.resources import ResourceType
from vwserver.syncer.checks import Discovery, Wanted, downstream_wanted, problems
from vwserver.syncer.config import DownstreamType, ResourceConfig

URL = "https://vw.example/services/x/clusters/*"


def resource_list(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "APIResourceList", "groupVersion": "example.io/v1", "resources": list(entries)}


WIDGETS = {
    "name": "widgets",
    "singularName": "widget",
    "namespaced": True,
    "kind": "Widget",
    "shortNames": ["wd"],
    "verbs": ["get", "list", "watch"],
}
GADGETS = {"name": "gadgets", "singularName": "gadget", "namespaced": False, "kind": "Gadget"}
SERVED = Discovery(resource_list(WIDGETS, {**WIDGETS, "name": "widgets/status"}, GADGETS))


def wanted(resource: str = "widgets", kind: str = "Widget", **kw: str) -> Wanted:
    t = ResourceType(kw.get("group", "example.io"), kw.get("version", "v1"), resource, kind)
    return Wanted("$.resources[0]", t)


def only(errors: list[ConfigError]) -> ConfigError:
    assert len(errors) == 1, errors
    return errors[0]


def test_served_as_configured_is_fine() -> None:
    assert problems(wanted(), SERVED, where=URL) == []


@pytest.mark.parametrize("typo", ["widget", "Widget", "wd", "widgts"])
def test_a_typo_in_the_plural_names_the_field_and_suggests(typo: str) -> None:
    error = only(problems(wanted(typo), SERVED, where=URL))
    assert error.field == "$.resources[0].resource"
    assert str(error) == (
        f'$.resources[0].resource: "{typo}" is not served by {URL} (example.io/v1); '
        'did you mean "widgets"?'
    )


def test_nothing_close_suggests_nothing() -> None:
    error = only(problems(wanted("databases"), SERVED, where=URL))
    assert "did you mean" not in str(error)


def test_wrong_kind_and_cluster_scope() -> None:
    error = only(problems(wanted(kind="Widgt"), SERVED, where=URL))
    assert error.field == "$.resources[0].kind" and '"Widget"' in error.problem
    error = only(problems(wanted("gadgets", "Gadget"), SERVED, where=URL))
    assert error.field == "$.resources[0]" and "cluster-scoped" in error.problem


def test_version_and_group_not_served() -> None:
    group = {"name": "example.io", "versions": [{"groupVersion": "example.io/v1", "version": "v1"}]}
    error = only(problems(wanted(version="v2"), Discovery(None, group=group), where=URL))
    assert error.field == "$.resources[0].version"
    assert "(served: v1)" in error.problem
    groups = {"groups": [{"name": "example.io"}, {"name": "apis.kcp.io"}]}
    error = only(problems(wanted(group="exmple.io"), Discovery(None, groups=groups), where=URL))
    assert error.field == "$.resources[0].group"
    assert error.problem.endswith('did you mean "example.io"?')


def test_downstream_fields_name_the_downstream_section() -> None:
    same = ResourceConfig(group="g.io", version="v1", resource="things", kind="Thing")
    other = ResourceConfig(
        group="g.io",
        version="v1",
        resource="things",
        kind="Thing",
        downstream=DownstreamType(group="d.io", version="v1", resource="copies", kind="Copy"),
    )
    fields = [w.field for w in downstream_wanted([same, other])]
    assert fields == ["$.resources[0]", "$.resources[1].downstream"]
    assert downstream_wanted([other])[0].type.resource == "copies"
