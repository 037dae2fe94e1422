"""kcp facts the pass-through LIST's selector push-down relies on (vwserver.proxy.lists),
verified on kcp's APIExport virtual workspace."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.widgets import API, make_namespace, remove_namespace, widget


def _token(text: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    return doc


async def test_probe(kcp: KcpInstance, world: Bootstrap) -> None:
    ws = world.consumers[0]
    ns, ns2 = f"p-{uuid.uuid4().hex[:5]}", ""
    ns2 = ns + "-x"
    await make_namespace(kcp, [ws], ns)
    await make_namespace(kcp, [ws], ns2)
    try:
        async with kcp.http_session(timeout=60) as s:
            for n, names in ((ns, ["a", "b", "c", "d"]), (ns2, ["a"])):
                url = f"{world.vw_url}/clusters/{ws.cluster}/{API}/namespaces/{n}/widgets"
                for name in names:
                    lab = {"k": "yes" if name in ("a", "c") else "no", "probe": ns}
                    async with s.post(url, json=widget(name, n, lab)) as r:
                        assert r.status == 201, await r.text()
            base = f"{world.vw_url}/clusters/{ws.cluster}/{API}/widgets"
            wild = f"{world.vw_url}/clusters/*/{API}/widgets"
            nsurl = f"{world.vw_url}/clusters/{ws.cluster}/{API}/namespaces/{ns}/widgets"
            for label, url, q in (
                ("cluster", base, {"labelSelector": f"probe={ns}"}),
                ("wild", wild, {"labelSelector": f"probe={ns}"}),
                ("ns", nsurl, {"labelSelector": f"probe={ns}"}),
            ):
                async with s.get(url, params=q) as r:
                    doc = await r.json()
                print(
                    label,
                    [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in doc["items"]],
                )
                async with s.get(url, params={**q, "limit": "1"}) as r:
                    doc = await r.json()
                print(label, "limit1 token", _token(doc["metadata"]["continue"]))
            # hasMore semantics: selector k=yes, limit=1 in ns: matches a, c
            for lim, sel in (("2", "k=yes"), ("1", "k=no"), ("2", "k=no")):
                async with s.get(
                    nsurl, params={"labelSelector": f"k={sel[2:]},probe={ns}", "limit": lim}
                ) as r:
                    doc = await r.json()
                print(
                    "hasMore",
                    sel,
                    lim,
                    [i["metadata"]["name"] for i in doc["items"]],
                    doc["metadata"].get("continue"),
                )
            # token reuse across selectors
            async with s.get(
                nsurl, params={"labelSelector": f"k=yes,probe={ns}", "limit": "1"}
            ) as r:
                doc = await r.json()
            tok = doc["metadata"]["continue"]
            async with s.get(
                nsurl, params={"labelSelector": f"k=no,probe={ns}", "limit": "5", "continue": tok}
            ) as r:
                print(
                    "reuse",
                    r.status,
                    [i["metadata"]["name"] for i in (await r.json()).get("items", [])],
                )
            # exact rv read with limit
            rv = doc["metadata"]["resourceVersion"]
            async with s.get(
                nsurl,
                params={
                    "labelSelector": f"k=no,probe={ns}",
                    "limit": "5",
                    "resourceVersion": rv,
                    "resourceVersionMatch": "Exact",
                },
            ) as r:
                print(
                    "exact",
                    r.status,
                    [i["metadata"]["name"] for i in (await r.json()).get("items", [])],
                )
            # whitespace in field selectors
            for fs in (
                " metadata.namespace = " + ns + " ",
                "metadata.namespace=" + ns,
                "metadata.namespace= " + ns,
            ):
                async with s.get(
                    base, params={"fieldSelector": fs, "labelSelector": f"probe={ns}"}
                ) as r:
                    body = await r.json()
                    print(
                        "fs",
                        repr(fs),
                        r.status,
                        body.get("message") or [i["metadata"]["name"] for i in body["items"]],
                    )
    finally:
        await remove_namespace(kcp, [ws], ns)
        await remove_namespace(kcp, [ws], ns2)
