"""The kcp facts the pass-through LIST's selector push-down relies on (vwserver.proxy.lists),
checked on kcp's APIExport virtual workspace directly:

* list order is etcd's key order, the bytes of ``<cluster>/<namespace>/<name>`` (``ns-x`` before
  ``ns``: ``-`` sorts before ``/``), and a continue token names the key it follows;
* a continue token is given whenever any object follows the page's last entry, matching the
  label selector or not (etcd's ``hasMore``), and none after the collection's last object;
* a continue token carries no selector: issued for one label selector, it resumes a list with
  another after the same key (one token serves the selected and the held list);
* a field selector's terms are not trimmed (the one parser, vwserver.cache.views).
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from devenv.bootstrap import Bootstrap
from devenv.kcp import KcpInstance
from tests.support.widgets import API, make_namespace, remove_namespace, widget


def _start(token: str) -> str:
    doc: dict[str, Any] = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    return str(doc["start"])


async def test_what_kcp_lists_and_continue_tokens_say(kcp: KcpInstance, world: Bootstrap) -> None:
    ws = world.consumers[0]
    ns = f"order-{uuid.uuid4().hex[:5]}"
    longer = f"{ns}-x"  # sorts before ns in etcd's order
    await make_namespace(kcp, [ws], ns)
    await make_namespace(kcp, [ws], longer)
    try:
        async with kcp.http_session(timeout=60) as s:

            async def names(url: str, **query: str) -> tuple[list[str], str, int]:
                async with s.get(url, params=query) as r:
                    body = await r.json()
                    if r.status != 200:
                        return [body.get("message", "")], "", r.status
                items = [
                    f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in body["items"]
                ]
                return items, body["metadata"].get("continue", ""), r.status

            for namespace, objects in ((ns, "abcd"), (longer, "a")):
                url = f"{world.vw_url}/clusters/{ws.cluster}/{API}/namespaces/{namespace}/widgets"
                for name in objects:
                    labels = {"k": "yes" if name in "ac" else "no", "probe": ns}
                    async with s.post(url, json=widget(name, namespace, labels)) as r:
                        assert r.status == 201, await r.text()
            everywhere = f"{world.vw_url}/clusters/{ws.cluster}/{API}/widgets"
            wildcard = f"{world.vw_url}/clusters/*/{API}/widgets"
            one = f"{world.vw_url}/clusters/{ws.cluster}/{API}/namespaces/{ns}/widgets"
            probe = f"probe={ns}"
            in_order = [f"{longer}/a", f"{ns}/a", f"{ns}/b", f"{ns}/c", f"{ns}/d"]
            for url in (everywhere, wildcard):
                assert (await names(url, labelSelector=probe))[0] == in_order
            _, token, _ = await names(wildcard, labelSelector=probe, limit="1")
            assert _start(token) == f"/{ws.cluster}/{longer}/a\0"
            # hasMore: c is followed by d (not matching): a token; d is the last object: none
            got, token, _ = await names(one, labelSelector=f"k=yes,{probe}", limit="2")
            assert got == [f"{ns}/a", f"{ns}/c"] and _start(token) == "/c\0"
            got, last, _ = await names(one, labelSelector=f"k=no,{probe}", limit="2")
            assert got == [f"{ns}/b", f"{ns}/d"] and last == ""
            # a token resumes a list with another selector after the same key
            _, after_a, _ = await names(one, labelSelector=f"k=yes,{probe}", limit="1")
            got, _, _ = await names(
                one, labelSelector=f"k=no,{probe}", limit="5", **{"continue": after_a}
            )
            assert got == [f"{ns}/b", f"{ns}/d"]
            # field selectors: nothing trimmed
            got, _, status = await names(
                everywhere, labelSelector=probe, fieldSelector=f" metadata.namespace = {ns} "
            )
            assert status == 400 and got == ["field label not supported:  metadata.namespace "]
            got, _, status = await names(
                everywhere, labelSelector=probe, fieldSelector=f"metadata.namespace= {ns}"
            )
            assert status == 200 and got == []
    finally:
        await remove_namespace(kcp, [ws], ns)
        await remove_namespace(kcp, [ws], longer)
