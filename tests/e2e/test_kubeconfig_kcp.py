"""``vwserver kubeconfig --slice`` against real kcp, and kubectl with what it wrote.

A fresh workspace gets the FilteredAPIExportEndpointSlice API as a plain CRD
(``manifests/crd/``), so this test needs neither vwserver's APIExport nor its controller: it
writes a slice whose ``status.endpoints[0].url`` is the demo export's own virtual-workspace URL
(vwserver's URLs have the same shape). The command reads the slice from kcp with the admin
kubeconfig's credentials and CA, and kubectl then lists widgets through the kubeconfig it wrote —
real kcp checks the carried-over token and certificate authority on both requests.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import yaml

from devenv.bootstrap import Bootstrap, apply_retrying, wait_workspace_ready
from devenv.kcp import KcpInstance
from tests.integration.test_kubeconfig_cmd import vwserver_kubeconfig

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "manifests" / "crd" / "filteredapiexportendpointslices.yaml"


async def test_slice_lookup_and_kubectl_against_kcp(
    kcp: KcpInstance, world: Bootstrap, tmp_path: Path
) -> None:
    name = f"kubeconfig-{uuid.uuid4().hex[:6]}"
    workspace = {
        "apiVersion": "tenancy.kcp.io/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": name},
    }
    await apply_retrying(kcp, kcp.cluster_url("root"), json.dumps(workspace), within=60)
    ws = await wait_workspace_ready(kcp, name, within=60)
    await apply_retrying(kcp, ws.url, CRD, within=60)
    await kcp.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRD), server=ws.url
    )
    slice_ = {
        "apiVersion": "sync.edge-connect.eu/v1alpha1",
        "kind": "FilteredAPIExportEndpointSlice",
        "metadata": {"name": "prod"},
        "spec": {
            "export": {"path": world.provider.path, "name": world.export_name},
            "objectSelector": {"matchLabels": {"env": "prod"}},
        },
    }
    await apply_retrying(kcp, ws.url, json.dumps(slice_), within=30)
    status = {"status": {"endpoints": [{"url": world.vw_url}]}}
    await kcp.kubectl(
        "patch", "filteredapiexportendpointslice", "prod", "--subresource=status",
        "--type=merge", "-p", json.dumps(status), server=ws.url,
    )  # fmt: skip

    out = tmp_path / "prod.kubeconfig"
    code, err = await vwserver_kubeconfig(
        "--slice", "prod", "--workspace", ws.path, "--kubeconfig", str(kcp.kubeconfig),
        "--context", kcp.admin_context, "-o", str(out), timeout=60,
    )  # fmt: skip
    assert (code, err) == (0, "")
    doc = yaml.safe_load(out.read_text())
    assert doc["clusters"][0]["cluster"]["server"] == f"{world.vw_url}/clusters/*"
    result = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", str(out), "--cache-dir", str(tmp_path / "cache"),
        "get", "widgets", "-A", "-o", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(result.communicate(), 60)
    assert result.returncode == 0, stderr.decode()
    names = {i["metadata"]["name"] for i in json.loads(stdout)["items"]}
    assert {w.name for w in world.widgets} <= names  # other tests may add their own

    # a slice that does not exist: one line naming --slice
    code, err = await vwserver_kubeconfig(
        "--slice", "nope", "--workspace", ws.path, "--kubeconfig", str(kcp.kubeconfig),
        "--context", kcp.admin_context, timeout=60,
    )  # fmt: skip
    assert code == 2
    assert (
        err
        == f"vwserver kubeconfig: --slice: no FilteredAPIExportEndpointSlice 'nope' in {ws.path}\n"
    )
