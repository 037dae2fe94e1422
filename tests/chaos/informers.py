"""The Go informers of the chaos tests, what kcp holds, and the checks between the two.

Each test attaches cluster-aware client-go informers (``vwclient informer``, watch-list on and
off) to slices of a vwserver on ``clusters/*``, lets writes and chaos happen, then requires:

* **convergence**: each informer's view of the test's namespace becomes exactly kcp's objects
  in the slice (keys, resourceVersions, labels) — a timeout is a failure that says what differs;
* **history**: each object's handler calls fit its writes (:mod:`tests.chaos.history`);
* its final cache (printed at SIGTERM) is that same set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devenv.bootstrap import Workspace
from devenv.kcp import KcpInstance
from tests.chaos.bed import TOKEN, ChaosKcp, in_slice
from tests.chaos.history import Verdict, check_object, read_client
from tests.chaos.writes import API, Planned
from tests.support.go_clients import GoClient, State, informer_args, view
from tests.support.vwserver_process import Reaper

SYNC_TIMEOUT = 60.0
CONVERGE_WITHIN = 120.0
"""Seconds informers get to converge once the writes are done. Not vwserver's latency:
client-go's reflector waits between two list+watch attempts with a backoff that grows with
every failed one (connection refused while a server is down) up to 30 s, plus up to 100 %
jitter, so a client that failed a few times may wait a minute before it relists."""
RESOURCE = "widgets"


@dataclass(frozen=True)
class Informer:
    client: GoClient
    slice: str
    watch_list: bool

    @property
    def name(self) -> str:
        return self.client.name


async def start_informers(
    binary: Path,
    add: Callable[[GoClient], GoClient],
    *,
    bed: ChaosKcp,
    base: str,
    slices: Sequence[str],
    logs: Path,
    reaper: Reaper,
) -> list[Informer]:
    """Two informers (watch-list on, off) per slice of the vwserver at ``base``, synced."""
    informers = []
    for name in slices:
        for watch_list in (True, False):
            label = f"{name}-watchlist-{'on' if watch_list else 'off'}"
            args = informer_args(
                bed.slice_url(base, name=name), f"--token={TOKEN}", watch_list=watch_list
            )
            client = add(await GoClient.start(binary, label, args, logs))
            reaper.add(client.proc)
            informers.append(Informer(client, name, watch_list))
    for informer in informers:
        await informer.client.wait_until("cache sync", informer.client.synced, within=SYNC_TIMEOUT)
    return informers


async def read_truth(bed: ChaosKcp, namespace: str) -> dict[str, State]:
    """kcp's objects of ``namespace`` in the slice (both consumers), read directly."""
    return await read_truth_in(bed.kcp, bed.world.consumers, namespace)


async def read_truth_in(
    kcp: KcpInstance, workspaces: Iterable[Workspace], namespace: str
) -> dict[str, State]:
    """kcp's objects of ``namespace`` in the slice (env=prod) in ``workspaces``, read directly
    from kcp (a sharded kcp: through its front-proxy), keyed as the Go informer keys them."""
    truth: dict[str, State] = {}
    async with kcp.http_session(timeout=30) as session:
        for ws in workspaces:
            async with session.get(f"{ws.url}/{API}/namespaces/{namespace}/widgets") as resp:
                assert resp.status == 200, await resp.text()
                items = (await resp.json())["items"]
            for item in items:
                meta = item["metadata"]
                labels = meta.get("labels") or {}
                if in_slice(labels):
                    truth[f"{ws.cluster}|{namespace}/{meta['name']}"] = (
                        meta["resourceVersion"],
                        labels,
                    )
    return truth


def difference(held: Mapping[str, State], truth: Mapping[str, State]) -> str:
    """What an informer holds that kcp does not, and the reverse, in a few lines."""
    missing = sorted(set(truth) - set(held))
    extra = sorted(set(held) - set(truth))
    stale = sorted(k for k in set(held) & set(truth) if held[k] != truth[k])
    parts = [
        f"missing {len(missing)} {missing[:5]}" if missing else "",
        f"extra {len(extra)} {extra[:5]}" if extra else "",
        f"stale {len(stale)} " + ", ".join(f"{k}: {held[k]} != {truth[k]}" for k in stale[:5])
        if stale
        else "",
    ]
    return "; ".join(p for p in parts if p) or "nothing"


async def converge(
    informers: Iterable[Informer],
    namespace: str,
    truth: Mapping[str, State],
    *,
    within: float = CONVERGE_WITHIN,
) -> float:
    """Until every informer's view of ``namespace`` is ``truth``; the seconds it took. Fails
    naming what each informer still differs in."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    pending = list(informers)
    while pending:
        pending = [i for i in pending if view(i.client, namespace) != truth]
        if not pending:
            break
        if loop.time() - started > within:
            report = "\n".join(
                f"  {i.name}: {difference(view(i.client, namespace), truth)}" for i in pending
            )
            raise AssertionError(f"informers did not converge within {within:.0f}s:\n{report}")
        await asyncio.sleep(0.25)
    return loop.time() - started


def final_cache(informer: Informer, namespace: str) -> dict[str, State]:
    return {
        item["key"]: (item["resourceVersion"], item["labels"])
        for item in informer.client.final_cache()
        if item["namespace"] == namespace
    }


def check_history(
    informer: Informer, plan: Sequence[Planned], namespace: str
) -> tuple[Verdict, int]:
    """Every object's handler calls against its writes; and the relists the informer made."""
    log = read_client(informer.client.lines, namespace=namespace, resource=RESOURCE)
    verdict = Verdict()
    keys = {obj.key for obj in plan}
    for key in set(log.by_key) - keys:
        verdict.problems.append(f"{key}: an object nobody wrote: {log.by_key[key]}")
    for obj in plan:
        verdict.add(
            check_object(
                obj.key,
                obj.versions,
                log.by_key.get(obj.key, []),
                member=in_slice,
                synced_epoch=log.synced_epoch,
                final_epoch=log.final_epoch,
            )
        )
    return verdict, log.relists


def assert_histories(
    informers: Iterable[Informer], plan: Sequence[Planned], namespace: str
) -> dict[str, str]:
    """:func:`check_history` of each informer must find no problem; a line of figures each."""
    figures = {}
    for informer in informers:
        verdict, relists = check_history(informer, plan, namespace)
        shown = "\n".join(verdict.problems[:5])
        assert not verdict.problems, (
            f"{informer.name}: {len(verdict.problems)} object(s) whose events do not fit "
            f"their writes:\n{shown}"
        )
        figures[informer.name] = (
            f"{verdict.events} events, {relists} relists, {verdict.skipped} folded by a relist, "
            f"{verdict.replays} replayed by a relist"
        )
    return figures
