"""The fake's model of ``managedFields`` (:mod:`fakekcp.managed`) gives the syncer's ownership
rules what they read: which manager wrote the owner label, which one added a finalizer."""

from __future__ import annotations

from typing import Any

from fakekcp.managed import track
from vwserver.syncer.naming import (
    LABEL_RELATED,
    LABEL_SYNCER,
    field_manager,
    finalizer,
    finalizer_owner,
)
from vwserver.syncer.related_plan import owned_copy


def test_an_apply_makes_the_copy_its_managers_and_an_update_adds_a_claim() -> None:
    copy: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s1", "labels": {LABEL_SYNCER: "eu", LABEL_RELATED: "creds"}},
        "data": {"value": "eA=="},
    }
    entries = track([], manager=field_manager("eu"), body=copy, apply=True)
    assert owned_copy({**copy, "metadata": {**copy["metadata"], "managedFields": entries}},
                      syncer="eu", label="creds")  # fmt: skip
    forged = track([], manager="kubectl-edit", body=copy, apply=False)
    assert not owned_copy({**copy, "metadata": {**copy["metadata"], "managedFields": forged}},
                          syncer="eu", label="creds")  # fmt: skip
    # a merge patch adding a finalizer under us's manager: its claim; an apply replaces the
    # manager's Apply entry, an update merges into its Update entry
    patch = {"metadata": {"finalizers": [finalizer("us")]}}
    entries = track(entries, manager=field_manager("us"), body=patch, apply=False)
    assert finalizer_owner([finalizer("us")], managed_fields=entries) == "us"
    again = track(entries, manager=field_manager("us"), body={"spec": {"a": 1}}, apply=False)
    assert finalizer_owner([finalizer("us")], managed_fields=again) == "us"
    assert [e["manager"] for e in again] == [field_manager("eu"), field_manager("us")]
    replaced = track(again, manager=field_manager("eu"), body={"data": {}}, apply=True)
    assert not owned_copy({**copy, "metadata": {**copy["metadata"], "managedFields": replaced}},
                          syncer="eu", label="creds")  # fmt: skip
