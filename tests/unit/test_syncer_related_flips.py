"""The flip limit holds for copies of related objects as for primaries (issue #25, §3): a
consumer label another writer keeps changing back on a related object's copy is put back at
most :data:`~vwserver.syncer.sync_loop.FLIP_LIMIT` times, then no longer written, and the
primaries naming the object say so in their ``Synced`` message — never an endless fight.

The pure half (:mod:`vwserver.syncer.related_plan`: a round is recognised, a withheld key is
neither written nor silent) and the controller on fake servers over a fight with a writer that
removes the label from the copy after every apply (:mod:`tests.support.syncer_fakes`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, cast

from tests.support.clock import ManualClock
from tests.support.syncer_fakes import UPSTREAM, ControllerBed, controller_bed, known_namespace
from tests.unit.test_syncer_related import (
    PASSWORD,
    members,
    one,
    primary,
    scope,
    secret,
    stored,
)
from tests.unit.test_syncer_related import config as related_config
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.reflector import Reflector
from vwserver.syncer.naming import LABEL_SYNCER, field_manager, finalizer
from vwserver.syncer.related_io import GroupedCache, _Events, _upstream_group_key
from vwserver.syncer.related_plan import CopyApply, CopyDelete, Inputs, Scope
from vwserver.syncer.related_spec import compile_all
from vwserver.syncer.sync_loop import FLIP_LIMIT
from vwserver.syncer.sync_plan import RelatedCopies

APP = ("labels", "app")


def without_app(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as another writer leaves it: label ``app`` removed, nothing else changed."""
    changed = copy.deepcopy(obj)
    del changed["metadata"]["labels"]["app"]
    return changed


# --- the plan ----------------------------------------------------------------------------------


def test_a_key_put_back_on_a_copy_is_a_round_and_a_withheld_key_is_left_and_reported(
    tmp_path: Path,
) -> None:
    (spec,) = compile_all(related_config(PASSWORD, tmp=tmp_path))
    sources = {"pw": secret("pw")}
    first = one(spec, Inputs(sources=sources, copies={}), members(primary("a", "pw")), scope())
    (created,) = first.down
    assert isinstance(created, CopyApply) and created.create
    assert created.overwritten == frozenset()  # a new copy is no round of a fight
    assert created.body["metadata"]["labels"]["app"] == "db"

    # someone removed the label from our copy of this very intent: putting it back is a round
    fought = {"pw": without_app(stored(created.body))}
    again = one(spec, Inputs(sources=sources, copies=fought), members(primary("a", "pw")), scope())
    (put_back,) = again.down
    assert isinstance(put_back, CopyApply) and not put_back.create
    assert put_back.overwritten == {APP}
    assert put_back.body["metadata"]["labels"]["app"] == "db"
    assert not any("not copied" in note for note in again.notes)

    # withheld (the loop reached the limit): not written, and the primary is told
    withheld = Scope(**{**vars_of(scope()), "withheld": {(spec.name, "pw"): frozenset({APP})}})
    stopped = one(
        spec, Inputs(sources=sources, copies=fought), members(primary("a", "pw")), withheld
    )
    (last,) = stopped.down
    assert isinstance(last, CopyApply) and last.overwritten == frozenset()  # a new intent
    assert "app" not in last.body["metadata"]["labels"]
    assert stopped.notes == [
        "related password default/pw: not copied, written on its copy by others: label app"
    ]
    # once applied, the copy is in step: nothing more to write, the note stays
    settled = {"pw": stored(last.body)}
    quiet = one(
        spec, Inputs(sources=sources, copies=settled), members(primary("a", "pw")), withheld
    )
    assert quiet.down == [] and quiet.notes == stopped.notes
    # a primary that does not reference the copy is not told
    other = one(
        spec,
        Inputs(sources=sources, copies=fought),
        members(primary("a", "pw"), primary("b", "other")),
        Scope(**{**vars_of(withheld), "current": scope("b").current}),
    )
    assert other.notes == ["related password default/other: not found"]


def vars_of(sc: Scope) -> dict[str, Any]:
    return {f: getattr(sc, f) for f in Scope.__dataclass_fields__}


def test_a_label_another_manager_owns_on_the_copy_is_left_to_it_and_reported(
    tmp_path: Path,
) -> None:
    (spec,) = compile_all(related_config(PASSWORD, tmp=tmp_path))
    sources = {"pw": secret("pw")}
    first = one(spec, Inputs(sources=sources, copies={}), members(primary("a", "pw")), scope())
    theirs = stored(first.down[0].body)  # type: ignore[union-attr]
    theirs["metadata"]["labels"]["app"] = "operator"
    theirs["metadata"]["managedFields"].append(
        {
            "manager": "operator",
            "operation": "Update",
            "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}},
        }
    )
    result = one(
        spec, Inputs(sources=sources, copies={"pw": theirs}), members(primary("a", "pw")), scope()
    )
    (apply,) = result.down  # the intent without the label: its digest changed
    assert isinstance(apply, CopyApply) and "app" not in apply.body["metadata"]["labels"]
    assert apply.overwritten == frozenset()
    assert any("written on its copy by others: label app" in n for n in result.notes)


# --- the controller over a fight ---------------------------------------------------------------


def related_bed(tmp_path: Path, clock: ManualClock) -> ControllerBed:
    """A controller for Things whose ``spec.users[*].passwordSecretRef.name`` Secrets are
    copied down; the related sources' cache at the endpoint is filled by the test, and the
    downstream fake stores what the syncer applies as a server would (our field manager owns
    the owner label), so that the copy is recognised as ours."""
    resource = {
        "group": "g.io",
        "version": "v1",
        "resource": "things",
        "kind": "Thing",
        "related": [PASSWORD],
    }
    bed = controller_bed(tmp_path, clock=clock, resources=[resource])
    (watch,) = bed.controller.related
    watch.reflectors[UPSTREAM] = Reflector(
        name="upstream secrets",
        client=cast(KubeClient, bed.upstream),
        url=f"{UPSTREAM}/clusters/*/api/v1/secrets",
        handler=GroupedCache(
            key=_upstream_group_key,
            handler=_Events(lambda o: _pair(o), bed.controller._related_changed),
        ),
        clock=clock,
    )
    for reflector in watch.all_reflectors():  # listed already (the test fills the caches)
        reflector.synced.set()
    downstream = bed.downstream

    async def apply(url: str, body: JSON, *, field_manager: str, force: bool = True) -> JSON:
        downstream.calls.append(("apply", url, body))
        return with_fields(body, field_manager)

    async def delete(url: str, *, uid: str | None = None) -> None:
        downstream.calls.append(("delete", url, uid))

    downstream.apply = apply  # type: ignore[method-assign]
    downstream.delete = delete  # type: ignore[attr-defined]
    return bed


def _pair(obj: JSON) -> tuple[str, str] | None:
    key = _upstream_group_key(obj)
    return None if key is None else key[0]  # type: ignore[return-value]


def with_fields(body: JSON, manager: str) -> JSON:
    obj = copy.deepcopy(body)
    obj["metadata"]["uid"] = f"uid-copy-{obj['metadata']['name']}"
    labels: dict[str, Any] = {f"f:{k}": {} for k in obj["metadata"].get("labels") or {}}
    obj["metadata"]["managedFields"] = [
        {"manager": manager, "operation": "Apply", "fieldsV1": {"f:metadata": {"f:labels": labels}}}
    ]
    return obj


async def run_queued(bed: ControllerBed, *, limit: int = 50) -> None:
    queue = bed.controller.queue
    for _ in range(limit):
        if not len(queue):
            return
        key = await queue.get()
        try:
            await bed.controller._process(key)
        finally:
            queue.done(key)
    raise AssertionError(f"still queued after {limit} syncs")


def secret_applies(bed: ControllerBed) -> list[JSON]:
    return [body for m, url, body in bed.downstream.calls if m == "apply" and "/secrets/" in url]


async def test_a_label_removed_from_a_copy_again_and_again_is_put_back_flip_limit_times(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    bed = related_bed(tmp_path, clock)
    controller = bed.controller
    (watch,) = controller.related
    pw = secret("pw")
    watch.reflectors[UPSTREAM].handler.on_list([pw], "1")
    thing = primary("a", "pw")
    thing["metadata"].update(resourceVersion="5", generation=1)
    thing["metadata"]["finalizers"] = [finalizer("eu")]
    thing["metadata"]["managedFields"][0]["manager"] = field_manager("eu")
    (key,) = bed.list_upstream(thing)
    known_namespace(bed, key)
    copies = watch.downstream_reflector.handler

    await run_queued(bed)
    assert len(secret_applies(bed)) == 1  # the copy is made
    for _ in range(FLIP_LIMIT + 3):  # the other writer removes the label after every apply
        (name_key,) = [k for k in copies.objects]
        current = copies.objects[name_key]
        if "app" in current["metadata"]["labels"]:
            copies.on_event("MODIFIED", without_app(current))
        await run_queued(bed)
    applies = secret_applies(bed)
    # the creation, FLIP_LIMIT - 1 rounds of putting it back, then one apply without it
    assert len(applies) == 1 + (FLIP_LIMIT - 1) + 1, [a["metadata"]["labels"] for a in applies]
    assert all(a["metadata"]["labels"]["app"] == "db" for a in applies[:-1])
    assert "app" not in applies[-1]["metadata"]["labels"]
    assert applies[-1]["metadata"]["labels"][LABEL_SYNCER] == "eu"
    pair = (key.cluster, key.namespace)
    assert controller.related_withheld[pair] == {("password", "pw"): frozenset({APP})}
    statuses = [str(p) for m, _, p in bed.upstream.calls if m == "merge_patch"]
    assert "written on its copy by others: label app" in statuses[-1]

    # the copy deleted (nothing references it any more): a new copy writes every key again
    gone = CopyDelete("password", True, applies[-1]["metadata"]["namespace"], "pw", "uid")
    await controller._execute(key, RelatedCopies((gone,)), endpoint=UPSTREAM)
    assert bed.downstream.calls[-1][0] == "delete"
    assert pair not in controller.related_withheld and pair not in controller._related_flips
