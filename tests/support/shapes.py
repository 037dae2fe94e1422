"""An export whose objects look like other representations: the shapes a filter must not guess.

A custom resource's own top-level fields may be called ``object``, ``rows`` or ``items``, hold
``metadata``-like documents, or be anything at all (``x-kubernetes-preserve-unknown-fields``);
its kind may even be ``Table``. A filter that finds an object's labels by looking at what the
bytes contain — "it has an ``object`` member, so it is a Table row", "its kind is Table, so its
``rows`` embed the objects" — reads the labels an attacker planted instead of the object's own.

:func:`shapes_world` adds such an export (``shapes.example.io``: ``parcels`` with declared
``object``/``rows``/``items``/``spec.metadata`` fields, ``blobs`` preserving unknown fields,
``tables`` of kind ``Table``) to the test bed's provider workspace and binds it in the first
consumer, and answers a :class:`~devenv.bootstrap.Bootstrap` for it, so that
:func:`tests.support.slices.slices_over_kcp` serves slices of it. :func:`planted` builds an
object of any of them whose own labels say one thing and whose planted members another.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Final

from devenv.bootstrap import Bootstrap, apply_retrying, get_field, poll
from devenv.kcp import KcpInstance

GROUP: Final = "shapes.example.io"
VERSION: Final = "v1"
EXPORT: Final = "shapes.example.io"
API: Final = f"apis/{GROUP}/{VERSION}"
HOLDS: Final = "sync.edge-connect.eu/holds"
KINDS: Final = {"parcels": "Parcel", "blobs": "Blob", "tables": "Table"}
"""Resource → kind. ``tables`` is a custom resource of kind ``Table`` (not meta.k8s.io's)."""

_ANY: Final = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_DECLARED: Final = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "object": _ANY,
        "rows": {"type": "array", "items": _ANY},
        "items": {"type": "array", "items": _ANY},
        "columnDefinitions": {"type": "array", "items": _ANY},
        "type": {"type": "string"},
        "spec": {
            "type": "object",
            "properties": {"metadata": _ANY, "secret": {"type": "string"}},
        },
    },
}
_OPEN: Final = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
    },
}


def _schema(resource: str) -> dict[str, Any]:
    kind = KINDS[resource]
    return {
        "apiVersion": "apis.kcp.io/v1alpha1",
        "kind": "APIResourceSchema",
        "metadata": {"name": f"v1.{resource}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": resource,
                "singular": kind.lower(),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": _OPEN if resource == "blobs" else _DECLARED,
                }
            ],
        },
    }


def _provider_manifests() -> str:
    export = {
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIExport",
        "metadata": {"name": EXPORT},
        "spec": {
            "resources": [
                {"group": GROUP, "name": r, "schema": f"v1.{r}.{GROUP}", "storage": {"crd": {}}}
                for r in KINDS
            ]
        },
    }
    items = [*(_schema(r) for r in KINDS), export]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def _binding(provider_path: str) -> str:
    return json.dumps(
        {
            "apiVersion": "apis.kcp.io/v1alpha2",
            "kind": "APIBinding",
            "metadata": {"name": EXPORT},
            "spec": {"reference": {"export": {"path": provider_path, "name": EXPORT}}},
        }
    )


async def shapes_world(kcp: KcpInstance, world: Bootstrap, *, within: float = 120.0) -> Bootstrap:
    """The shapes export in ``world``'s provider, bound in its first consumer (idempotent)."""
    provider, consumer = world.provider, world.consumers[0]
    await apply_retrying(kcp, provider.url, _provider_manifests(), within=within)
    await poll(
        f"APIExport {EXPORT} status.identityHash",
        lambda: get_field(kcp, provider.url, "apiexport", EXPORT, "status", "identityHash"),
        within=within,
    )
    await apply_retrying(kcp, consumer.url, _binding(provider.path), within=within)

    async def bound() -> bool | None:
        phase = await get_field(kcp, consumer.url, "apibinding", EXPORT, "status", "phase")
        return True if phase == "Bound" else None

    await poll(f"APIBinding {EXPORT} Bound", bound, within=within)

    async def urls() -> tuple[str, ...] | None:
        endpoints = await get_field(
            kcp, provider.url, "apiexportendpointslice", EXPORT, "status", "endpoints"
        )
        found = tuple(e["url"] for e in endpoints or [] if e.get("url"))
        return found or None

    vw_urls = await poll(f"APIExportEndpointSlice {EXPORT} URLs", urls, within=within)
    async with kcp.http_session(timeout=10) as session:

        async def serves() -> bool | None:
            for resource in KINDS:
                url = f"{vw_urls[0]}/clusters/{consumer.cluster}/{API}/{resource}"
                async with session.get(url) as resp:
                    if resp.status != 200:
                        return None
            return True

        await poll(f"APIExport VW of {EXPORT} serving", serves, within=within)
    return dataclasses.replace(
        world,
        export_name=EXPORT,
        group=GROUP,
        version=VERSION,
        resource="parcels",
        vw_urls=vw_urls,
        widgets=(),
    )


def mimic(*, labels: dict[str, str], name: str, namespace: str, cluster: str) -> dict[str, Any]:
    """A ``metadata`` document that looks like another object's: its labels, the holds
    annotation's name, a ``kcp.io/cluster``."""
    return {
        "name": name,
        "namespace": namespace,
        "uid": "00000000-0000-0000-0000-000000000000",
        "resourceVersion": "1",
        "labels": labels,
        "annotations": {HOLDS: "{}", "kcp.io/cluster": cluster},
    }


def planted(
    resource: str,
    name: str,
    namespace: str,
    *,
    labels: dict[str, str],
    looks_like: dict[str, str],
    cluster: str,
    secret: str,
) -> dict[str, Any]:
    """An object of ``resource`` labelled ``labels`` whose planted members — a top-level
    ``object``, ``rows[].object``, ``spec.metadata`` — carry ``looks_like`` labels and the
    holds annotation's name; ``secret`` in ``spec``.

    No top-level ``items``: the apiserver's unstructured decoder takes any document with an
    ``items`` member for a list, and kcp answers the create with 500 "... is not a list: no
    Items field in this object" (observed on kcp v0.32.3) — such objects cannot exist."""
    fake = mimic(labels=looks_like, name=name, namespace=namespace, cluster=cluster)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KINDS[resource],
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            # the holds annotation's name in the bytes, as a harmless annotation value
            "annotations": {"note": f"mentions {HOLDS}"},
        },
        "type": "ADDED",
        "object": {"kind": "PartialObjectMetadata", "metadata": fake},
        "rows": [{"cells": [name], "object": {"metadata": fake}}],
        "columnDefinitions": [{"name": "Name", "type": "string"}],
        "spec": {"metadata": fake, "secret": secret},
    }
