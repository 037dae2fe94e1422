"""Fuzz the running proxy in front of the fake upstream: random and mutated requests, checked
against the invariants a slice promises whatever a client sends.

Each request is made from a seeded generator (``random.Random(f"{seed}:{index}")``) and sent on
its own — one at a time, so that everything the fake upstream records and every change to its
store between sending a request and reading its whole response is that request's doing. What is
generated: paths (collections, objects, subresources, deprecated ``/watch/`` forms,
apibindings, discovery, other groups; mutated with ``..``, ``.``, ``%2F``, ``%2e``, empty and
extra segments, odd names), query strings (``watch=<anything>``, repeated and malformed
selectors, resourceVersion/limit/continue garbage, unknown and misspelt parameters), headers
(``Accept`` with YAML, protobuf, ``as=Table`` v1/v1beta1, PartialObjectMetadata(List),
garbage; content types; identity headers), methods, and bodies (objects, deep JSON, garbage,
JSON/merge/strategic/apply patches, DeleteOptions). Objects outside every slice, and some
written ones, carry members shaped like other representations (a top-level ``object``, ``rows``,
``spec.metadata``, with labels every slice matches and the holds annotation's name).

Invariants, each reported with the failing request:

0. every response is well-formed HTTP; a HEAD response carries no body (HEAD goes over a raw
   connection: a body after a HEAD response would be read by a client as the start of the
   next response on that connection);
1. no response has status 500, and no other 5xx unless the upstream sent it (relayed) or the
   slice is the not-ready one (503);
2. every non-2xx response is a Kubernetes ``Status`` (JSON, or YAML for a YAML client; no body
   for HEAD);
3. no request leaves an ERROR record or a traceback in the logs;
4. a request the proxy refuses on its own (400, 403, 405, 406, 411, 413, 415 not relayed from
   the upstream) made no upstream request at all;
5. no response carries anything of an object outside the request's slice: its token (a random
   string in an annotation and in ``spec``), its uid, its name (unless the request itself
   named it), also not inside a base64 continue token. Objects that were in the slice at any
   time are exempt (a watch from an old resourceVersion replays history);
6. the proxy changes, creates or deletes only objects that were in the request's slice before
   and are in it after the request; objects outside every slice are never touched.

Size: ``VWSERVER_FUZZ_EXAMPLES`` requests (default 6000, about 35 s; the full run is 50000,
about 4 minutes: ``VWSERVER_FUZZ_EXAMPLES=50000 .venv/bin/pytest tests/security/test_fuzz.py``).
``VWSERVER_FUZZ_SEED`` picks another sequence. The requests are a pure function of seed and
index and are sent in order, so a run replays exactly; a failure names the seed, and each
failing request its index (``#1234``) and everything that was sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import random
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import yaml
from multidict import CIMultiDict
from yarl import URL

from fakekcp.upstream import FakeUpstream, start_fake_upstream
from tests.security.support import (
    LogCapture,
    UpstreamAnswer,
    UpstreamRecorder,
    env_int,
    lookalike,
    status_problem,
)
from tests.support.serve import NO_AUTH, serve_app
from vwserver.cache.registry import CacheRegistry
from vwserver.clock import SystemClock
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.proxy.upstream import UpstreamClient
from vwserver.routes import Route, Routes, RouteTable
from vwserver.selector import Selector
from vwserver.server import build_app

EXAMPLES = env_int("VWSERVER_FUZZ_EXAMPLES", 6000)
SEED = env_int("VWSERVER_FUZZ_SEED", 20_240_611)
# A stream (watch) is read until it is quiet this long, or for at most STREAM_MAX seconds.
STREAM_IDLE = 0.08
STREAM_MAX = 0.6
HEADERS_TIMEOUT = 8.0
# Restore the store to its seeded state this often (writes delete and relabel slice objects).
RESET_EVERY = 400
PER_INVARIANT = 6  # failing requests shown per invariant

PREFIX = "/services/filtered-apiexport"
SLICE_CLUSTER = "slicews"
GROUP_VERSION = "/apis/example.io/v1alpha1"
CLUSTERS = ("c1", "c2")
NAMESPACES = ("ns1", "ns2")

Labels = Mapping[str, str]


# --- the world: slices and objects ---------------------------------------------------------------

# The slices the proxy serves, with the test's own (independent) idea of what each one shows.
VISIBLE: dict[str, Callable[[Labels], bool]] = {
    "prod": lambda labels: labels.get("env") == "prod",
    "eu": lambda labels: labels.get("region") == "eu" and labels.get("env") not in ("dev", "qa"),
}
ROUTES = {
    "prod": {"matchLabels": {"env": "prod"}},
    "eu": {
        "matchLabels": {"region": "eu"},
        "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev", "qa"]}],
    },
}
NOT_READY = "broken"

# Objects per (cluster, namespace): kind -> labels. "secret-*" objects are in no slice.
SEEDS: dict[str, dict[str, str]] = {
    "both": {"env": "prod", "region": "eu"},
    "prodonly": {"env": "prod", "region": "us"},
    "euonly": {"region": "eu"},
    "secret-dev": {"env": "dev", "region": "eu"},
    "secret-qa": {"env": "qa", "region": "eu"},
    "secret-bare": {},
    "secret-caps": {"env": "Prod", "region": "us"},
    "secret-near": {"env": "prod-x", "region": "EU", "tier": "prod"},
}


def seed_name(kind: str, cluster: str, ns: str) -> str:
    return f"{kind}-{cluster}{ns}"


SEED_NAMES = [seed_name(k, c, n) for k in SEEDS for c in CLUSTERS for n in NAMESPACES]
SECRET_NAMES = [n for n in SEED_NAMES if n.startswith("secret-")]

Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Stored:
    rv: str
    uid: str
    labels: dict[str, str]
    token: str


def widget(name: str, ns: str, labels: dict[str, str], token: str) -> dict[str, Any]:
    obj = {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": dict(labels),
            "annotations": {"fuzz/token": token},
        },
        "spec": {"size": 1, "color": "red", "token": token},
        "status": {"phase": "Ready", "token": token},
    }
    if name.startswith("secret-"):  # outside every slice, dressed up as inside
        obj |= lookalike(name, ns)
        obj["spec"]["metadata"] = lookalike(name, ns)["object"]["metadata"]
    return obj


# --- requests -----------------------------------------------------------------------------


@dataclass
class FuzzRequest:
    index: int
    method: str
    target: str
    """The raw path and query, exactly as sent."""
    headers: list[tuple[str, str]]
    body: bytes | None
    slice_name: str | None
    """The served slice this request addresses, None if the URL addresses none (then the
    proxy must show nothing)."""

    def describe(self) -> str:
        body = ""
        if self.body is not None:
            shown = self.body[:300]
            body = f"\n    body ({len(self.body)} bytes): {shown!r}"
        headers = "".join(f"\n    {k}: {v}" for k, v in self.headers)
        return f"#{self.index} {self.method} {self.target}{headers}{body}"

    def mentions(self, text: str) -> bool:
        raw = (self.target + "\n" + "\n".join(v for _, v in self.headers)).encode()
        return text.encode() in raw or (self.body is not None and text.encode() in self.body)


ACCEPTS = [
    None,
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/vnd.kubernetes.protobuf, application/json",
    "application/vnd.kubernetes.protobuf;stream=watch",
    "application/json;as=Table;v=v1;g=meta.k8s.io",
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    "application/json;as=Table;v=v1;g=meta.k8s.io;q=0.9, application/yaml",
    "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
    "application/json;as=PartialObjectMetadata;v=v1beta1;g=meta.k8s.io",
    "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
    "application/json;as=PartialObjectMetadataList;v=v1beta1;g=meta.k8s.io",
    "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io",
    "application/json;as=Table;v=v2;g=meta.k8s.io",
    "application/json;as=Table;g=example.io;v=v1",
    "application/json;as=Widget;v=v1alpha1;g=example.io",
    "application/json;as=Table",
    "application/json;q=0",
    "application/json;q=abc",
    "text/html",
    "*/*",
    "application/*",
    "application/json;charset=utf-8",
    "application/json;stream=watch",
    "application/yaml;as=Table;v=v1;g=meta.k8s.io",
    "application/json;;;",
    ";,;",
    "application/json, " * 40,
    "application/com.github.proto-openapi.spec.v3@v1.0+protobuf",
    "application/apply-patch+yaml",
    "application/json;as=APIGroupDiscoveryList;v=v2;g=apidiscovery.k8s.io",
]
CONTENT_TYPES = [
    "application/json",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
    "application/apply-patch+cbor",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/cbor",
    "text/plain",
    "application/json; charset=utf-8",
    "application/merge-patch+json;charset=utf-8",
    "APPLICATION/JSON",
    "",
    "garbage",
]
SELECTORS = [
    "env=dev",
    "env!=prod",
    "!env",
    "env",
    "env in (dev,prod)",
    "env notin (prod)",
    "region=eu",
    "region=us,env=prod",
    "env=prod",
    "env==prod",
    "env=",
    "env in ()",
    "tier=prod",
    "env=Prod",
    "x>1",
    "env=(",
    ",",
    "=",
    "env=prod,",
    "a b",
    "env=dev||env=prod",
    "env=prod\x00",
    "env=" + "p" * 70,
]
FIELD_SELECTORS = [
    "metadata.name={name}",
    "metadata.name=={name}",
    "metadata.name!={name}",
    "metadata.namespace=ns1",
    "metadata.namespace=ns2,metadata.name={name}",
    "spec.color=red",
    "metadata.labels.env=dev",
    "status.phase=Ready",
    "metadata.name",
    "=",
]
QUERY_VALUES = ["", "0", "1", "-1", "true", "false", "True", "yes", "2", "All", "None", "x" * 5]


class Generator:
    """One request per index, from ``random.Random(f"{seed}:{index}")``.

    Every part of a request is well-formed most of the time and garbage some of the time, so
    that about half of the requests get past the proxy's parsing and reach its filters.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def request(self, index: int) -> FuzzRequest:
        r = random.Random(f"{self.seed}:{index}")
        method = self._method(r)
        slice_name, prefix = self._slice(r)
        cluster = self._cluster(r)
        if cluster not in (*CLUSTERS, "*", "%2A", "%2a", "c3"):
            slice_name = None  # not a cluster: nothing may be shown
        api_path, kind = self._api_path(r, method)
        path, mangled = self._mangle(r, f"{prefix}/clusters/{cluster}{api_path}")
        if mangled:
            slice_name = None  # the URL no longer addresses anything a client may see
        query = self._query(r, method, kind)
        target = path + (("?" + query) if query or r.random() < 0.02 else "")
        headers = self._headers(r, method)
        body = self._body(r, method, headers)
        return FuzzRequest(index, method, target, headers, body, slice_name)

    # -- the URL --

    @staticmethod
    def _method(r: random.Random) -> str:
        # Methods the HTTP parser knows (anything else never reaches the proxy's handler).
        return r.choices(
            ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND", "TRACE"],
            weights=[36, 5, 10, 10, 22, 12, 2, 1, 1],
        )[0]

    @staticmethod
    def _slice(r: random.Random) -> tuple[str | None, str]:
        roll = r.random()
        if roll < 0.5:
            return "prod", f"{PREFIX}/{SLICE_CLUSTER}/prod"
        if roll < 0.9:
            return "eu", f"{PREFIX}/{SLICE_CLUSTER}/eu"
        return r.choice(
            [
                (NOT_READY, f"{PREFIX}/{SLICE_CLUSTER}/{NOT_READY}"),
                (None, f"{PREFIX}/{SLICE_CLUSTER}/nosuch"),
                (None, f"{PREFIX}/otherws/prod"),
                (None, f"{PREFIX}/{SLICE_CLUSTER}/prod/shards/abc123"),
                (None, f"{PREFIX}/{SLICE_CLUSTER}/prod/shards/zz"),
                (None, f"{PREFIX}/{SLICE_CLUSTER}/Prod"),
                (None, f"{PREFIX}/{SLICE_CLUSTER}"),
                (None, f"{PREFIX}//prod"),
                (None, f"{PREFIX}/{SLICE_CLUSTER}/prod/x"),
            ]
        )

    @staticmethod
    def _cluster(r: random.Random) -> str:
        roll = r.random()
        if roll < 0.8:
            return r.choice(CLUSTERS)
        if roll < 0.9:
            return r.choice(["*", "*", "%2A"])
        if roll < 0.94:
            return "c3"  # exists as a name, has no APIBinding upstream
        return r.choice(["C1", "c1.x", "-", "*x", "", "%2a"])

    def _name(self, r: random.Random) -> str:
        roll = r.random()
        if roll < 0.4:
            return r.choice(SECRET_NAMES)
        if roll < 0.8:
            return r.choice(SEED_NAMES)
        if roll < 0.95:
            return r.choice(["missing-c1ns1", f"made-{r.randrange(20)}", "w0"])
        return r.choice(
            [
                "a" * r.choice([63, 64, 253, 254, 600]),
                "UPPER",
                "-lead",
                "trail-",
                "dot.ted",
                "a..b",
                "*",
                "%2A",
                "x%00",
                "%E2%98%83",
                "name;v=1",
                "secret-dev-c1ns1%2F..",
                "..",
                ".",
                "watch",
                "status",
                "namespaces",
            ]
        )

    def _namespace(self, r: random.Random) -> str:
        roll = r.random()
        if roll < 0.85:
            return f"/namespaces/{r.choice(NAMESPACES)}"
        if roll < 0.9:
            return "/namespaces/default"
        if roll < 0.95:
            return ""
        return f"/namespaces/{r.choice(['NS1', '-', 'a' * 70, 'ns1.', 'namespaces'])}"

    def _api_path(self, r: random.Random, method: str) -> tuple[str, str]:
        """A path below ``clusters/<cluster>`` and what it addresses (mostly what ``method``
        is meant for: collections for POST, objects for PUT/PATCH/DELETE)."""
        nsp = self._namespace(r)
        gv = GROUP_VERSION
        if r.random() < 0.04:
            gv = r.choice(
                [
                    "/apis/example.io/v1",
                    "/apis/example.io/v1alpha1x",
                    "/api/v1",
                    "/apis/Example.io/v1alpha1",
                ]
            )
        collection = {"POST": 0.8, "PUT": 0.05, "PATCH": 0.05, "DELETE": 0.15}.get(method, 0.3)
        roll = r.random()
        if roll < 0.65:
            if r.random() < collection:
                return f"{gv}{nsp}/widgets", "collection"
            return f"{gv}{nsp}/widgets/{self._name(r)}", "object"
        if roll < 0.75:
            sub = r.choice(["status"] * 6 + ["scale", "foo", "status/x", "proxy", ""])
            return f"{gv}{nsp}/widgets/{self._name(r)}/{sub}", "object"
        if roll < 0.83 and (method in ("GET", "HEAD") or r.random() < 0.1):
            tail = f"/{self._name(r)}" if r.random() < 0.6 else ""
            extra = r.choice(["", "", "", "", "", "/status", "/x/y"])
            return f"{gv}/watch{nsp}/widgets{tail}{extra}", "watch"
        if roll < 0.88:
            tail = r.choice(["", "", "", f"/{self._name(r)}", "/widgets.example.io"])
            return f"/apis/apis.kcp.io/v1alpha1/apibindings{tail}", "collection"
        if roll < 0.94:
            return r.choice(
                [
                    "",
                    "/",
                    "/api",
                    "/api/v1",
                    "/apis",
                    "/apis/example.io",
                    "/apis/example.io/v1alpha1",
                    "/version",
                    "/openapi/v2",
                    "/openapi/v3",
                    "/openapi/v3/apis/example.io/v1alpha1",
                    "/openapi/v3/apis/../../../x",
                    "/healthz",
                    "/metrics",
                    "/apis/apis.kcp.io/v1alpha1",
                ]
            ), "discovery"
        return r.choice(
            [
                f"/api/v1{nsp}/secrets/{self._name(r)}",
                "/api/v1/namespaces",
                f"/apis/example.io/v1alpha1{nsp}/gadgets",
                f"/apis/example.io/v1alpha1{nsp}/widgets/{self._name(r)}/status/extra/more",
                f"/apis/example.io/v1alpha1{nsp}",
                f"/apis/example.io/v1alpha1{nsp}/widgets/a/b/c/d",
                "/apis/example.io/v1alpha1/watch",
                "/apis/example.io/v1alpha1/watch/namespaces",
                f"/apis/example.io/v1alpha1/watch{nsp}",
                "/apis//example.io/v1alpha1/widgets",
                "/apis/example.io/v1alpha1/widgets/",
            ]
        ), "other"

    @staticmethod
    def _mangle(r: random.Random, path: str) -> tuple[str, bool]:
        """Maybe mutate the path. True if the mutation touched the slice or cluster part
        (``/services/filtered-apiexport/<c>/<n>/clusters/<id>``): such a URL addresses no
        slice, and nothing may be shown through it. Mutations further right stay within the
        slice: whatever the proxy makes of them, it must make within the slice."""
        if r.random() > 0.08:
            return path, False
        segments = path.split("/")
        # ["", "services", "filtered-apiexport", <c>, <n>, "clusters", <id>, ...]
        i = r.randrange(3, len(segments) + 1)
        mutation = r.randrange(12)
        if mutation == 0:
            segments.insert(i, "..")
        elif mutation == 1:
            segments.insert(i, ".")
        elif mutation == 2:
            segments.insert(i, "")
        elif mutation == 3 and i < len(segments):
            segments[i] = segments[i] + "%2F.."
        elif mutation == 4 and i < len(segments):
            segments[i] = segments[i].replace("e", "%65", 1)
        elif mutation == 5:
            segments.insert(i, "%2e%2e")
        elif mutation == 6 and i < len(segments):
            segments[i] = segments[i].upper()
        elif mutation == 7:
            segments.insert(i, "extra")
        elif mutation == 8:
            return path + "/..;/x", False
        elif mutation == 9:
            return path.replace("/clusters/", "/clusters/c1/../", 1), True
        elif mutation == 10:
            return path + "%00", False
        else:
            return path + "//", False
        mangled = "/".join(segments)
        # "%2a" and "%2A" are the same "*" (percent-encoding is case-insensitive)
        same = mangled.replace("%2a", "%2A") == path.replace("%2a", "%2A")
        return mangled, not same and i <= 6

    # -- the query --

    def _query(self, r: random.Random, method: str, kind: str) -> str:
        params: list[tuple[str, str]] = []
        count = r.choices([0, 1, 2, 3, 5], weights=[35, 30, 20, 10, 5])[0]
        for _ in range(count):
            if r.random() < 0.85:
                param = self._good_param(r, method, kind)
                if all(param[0] != k for k, _ in params):  # given once, as they should be
                    params.append(param)
            else:
                params.append(self._param(r))
        if method == "PATCH" and r.random() < 0.7 and all(k != "fieldManager" for k, _ in params):
            params.append(("fieldManager", r.choice(["fuzz", "proxy-attacker"])))
        parts = []
        for key, value in params:
            if r.random() < 0.03:
                parts.append(quote(key, safe=""))  # no "="
            else:
                parts.append(f"{quote(key, safe='')}={_quote(value, r)}")
        return "&".join(parts)

    def _good_param(self, r: random.Random, method: str, kind: str) -> tuple[str, str]:
        """A parameter of the right type for what the request probably is."""
        m = method.upper()
        if m in ("GET", "HEAD") and kind == "object":
            return r.choice(
                [
                    ("resourceVersion", r.choice(["0", "", "1"])),
                    ("includeObject", r.choice(["None", "Metadata", "Object"])),
                    ("watch", r.choice(["1", "true", "false"])),
                    ("pretty", "true"),
                ]
            )
        if m in ("GET", "HEAD"):
            return r.choice(
                [
                    ("labelSelector", r.choice(SELECTORS[:14])),
                    ("fieldSelector", r.choice(FIELD_SELECTORS[:5]).format(name=self._name(r))),
                    ("watch", r.choice(["1", "true", "false", "0"])),
                    ("watch", "1"),
                    ("limit", r.choice(["1", "2", "500"])),
                    ("resourceVersion", r.choice(["0", "", "1"])),
                    ("resourceVersionMatch", "NotOlderThan"),
                    ("allowWatchBookmarks", "true"),
                    ("sendInitialEvents", "true"),
                    ("timeoutSeconds", "1"),
                    ("includeObject", r.choice(["None", "Metadata", "Object"])),
                    ("pretty", "true"),
                ]
            )
        if m == "DELETE":
            choices = [
                ("dryRun", "All"),
                ("gracePeriodSeconds", r.choice(["0", "30"])),
                ("propagationPolicy", r.choice(["Orphan", "Background", "Foreground"])),
            ]
            if kind == "collection":
                choices += [
                    ("labelSelector", r.choice(SELECTORS[:14])),
                    ("fieldSelector", r.choice(FIELD_SELECTORS[:5]).format(name=self._name(r))),
                ]
            return r.choice(choices)
        choices = [
            ("dryRun", "All"),
            ("fieldManager", r.choice(["fuzz", "kubectl-edit"])),
            ("fieldValidation", r.choice(["Strict", "Warn", "Ignore"])),
            ("pretty", "1"),
        ]
        if m == "PATCH":
            choices.append(("force", r.choice(["true", "false"])))
        return r.choice(choices)

    def _param(self, r: random.Random) -> tuple[str, str]:
        """Any parameter, any value."""
        roll = r.randrange(22)
        if roll == 0:
            return "watch", r.choice([*QUERY_VALUES, "1", "true", "t"])
        if roll == 1:
            return "labelSelector", r.choice(SELECTORS)
        if roll == 2:
            return "fieldSelector", r.choice(FIELD_SELECTORS).format(name=self._name(r))
        if roll == 3:
            return "resourceVersion", r.choice(["0", "1", "2", "", "abc", "-1", "00", "1.5", " "])
        if roll == 4:
            return "resourceVersionMatch", r.choice(["Exact", "NotOlderThan", "", "exact", "x"])
        if roll == 5:
            return "limit", r.choice(["0", "1", "2", "-1", "x", "99999999999999999999", "1e3"])
        if roll == 6:
            return "continue", r.choice(
                [
                    "",
                    "abc",
                    "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiJjMS9uczEvc2VjcmV0In0",
                    "%%%",
                    "a" * 3000,
                ]
            )
        if roll == 7:
            return "includeObject", r.choice(["None", "Metadata", "Object", "All", "none", ""])
        if roll == 8:
            return "dryRun", r.choice(["All", "all", "", "None", "All,All"])
        if roll == 9:
            return "fieldManager", r.choice(["fuzz", "", "x" * 200, "a\tb", "kubectl"])
        if roll == 10:
            return "force", r.choice(QUERY_VALUES)
        if roll == 11:
            return "allowWatchBookmarks", r.choice(QUERY_VALUES)
        if roll == 12:
            return "sendInitialEvents", r.choice(QUERY_VALUES)
        if roll == 13:
            return "gracePeriodSeconds", r.choice(["0", "-1", "30", "x"])
        if roll == 14:
            return "propagationPolicy", r.choice(["Orphan", "Background", "Foreground", "Never"])
        if roll == 15:
            return "pretty", r.choice(QUERY_VALUES)
        if roll == 16:
            return "timeout", r.choice(["1s", "32s", "1m0s", "x", "-1s"])
        if roll == 17:
            return "fieldValidation", r.choice(["Strict", "Warn", "Ignore", "Bogus"])
        if roll == 18:
            return "hash", r.choice(["abc123", "zz", ""])
        if roll == 19:
            key = r.choice(
                ["labelselector", "watch ", "label%53elector", "", "as", "orphanDependents"]
            )
            return key, "1"
        if roll == 20:
            return "labelSelector", r.choice(SELECTORS)  # likely repeated
        return r.choice(["foo", "x", "impersonate", "$watch", "watch[]"]), r.choice(QUERY_VALUES)

    # -- headers and body --

    @staticmethod
    def _headers(r: random.Random, method: str) -> list[tuple[str, str]]:
        headers: list[tuple[str, str]] = []
        roll = r.random()
        if method not in ("GET", "HEAD"):
            roll -= 0.3  # writes answer JSON: mostly ask for that
        if roll < 0.3:
            pass
        elif roll < 0.5:
            headers.append(("Accept", "application/json"))
        else:
            accept = r.choice(ACCEPTS)
            if accept is not None:
                headers.append(("Accept", accept))
        if r.random() < 0.05:
            headers.append(("Accept", r.choice([a for a in ACCEPTS if a])))  # twice
        if r.random() < 0.15:
            headers.append(("Accept-Encoding", r.choice(["gzip", "gzip, deflate", "br", "*"])))
        if r.random() < 0.04:
            headers.append(
                r.choice(
                    [
                        ("Impersonate-User", "system:admin"),
                        ("Impersonate-Group", "system:masters"),
                        ("X-Remote-User", "admin"),
                        ("Authorization", "Bearer forged"),
                        ("X-Forwarded-Host", "evil"),
                        ("Connection", "Upgrade"),
                        ("Upgrade", "websocket"),
                        ("Expect", "100-continue"),
                    ]
                )
            )
        m = method.upper()
        if m in ("POST", "PUT", "PATCH", "DELETE") or r.random() < 0.03:
            if r.random() < 0.85:
                good = {
                    "POST": ["application/json"],
                    "PUT": ["application/json"],
                    "DELETE": ["application/json"],
                    "PATCH": [
                        "application/json-patch+json",
                        "application/merge-patch+json",
                        "application/apply-patch+yaml",
                        "application/strategic-merge-patch+json",
                    ],
                }.get(m, CONTENT_TYPES)
                headers.append(("Content-Type", r.choice(good)))
            elif r.random() < 0.9:
                headers.append(("Content-Type", r.choice(CONTENT_TYPES)))
        return headers

    def _body(self, r: random.Random, method: str, headers: list[tuple[str, str]]) -> bytes | None:
        m = method.upper()
        if m in ("GET", "HEAD", "OPTIONS", "PROPFIND", "TRACE") and r.random() > 0.03:
            return None
        content_type = next((v for k, v in headers if k == "Content-Type"), "")
        if r.random() < 0.07:
            return self._garbage(r)
        if m == "DELETE":
            return self._delete_options(r)
        if m == "PATCH" or "patch" in content_type:
            return self._patch(r, content_type)
        return json.dumps(self._object(r)).encode()

    @staticmethod
    def _garbage(r: random.Random) -> bytes:
        return r.choice(
            [
                b"",
                b"{",
                b"null",
                b"[]",
                b'"x"',
                b"1e999",
                b"\xff\xfe\x00",
                b"[" * 20000 + b"]" * 20000,
                b'{"a":' * 5000 + b"1" + b"}" * 5000,
                b"a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c]\n",
                b"!!python/object/apply:os.system ['true']",
                b"--- {}\n--- {}\n",
                b'{"metadata": {"name": "x"}, "metadata": {"labels": {"env": "dev"}}}',
                b'{"kind":"Widget","apiVersion":"example.io/v1alpha1","metadata":7}',
                b'{"kind":"Widget","metadata":{"labels":["env","prod"]}}',
                b'{"kind":"Widget","metadata":{"labels":{"env":1}}}',
                b" " * 100,
                b"x" * r.choice([10, 5000]),
                bytes(r.randrange(256) for _ in range(64)),
                b"{}" if r.random() < 0.5 else b"\x00" * 10,
            ]
            + ([b'{"a":"' + b"x" * (4 * 2**20 + 10) + b'"}'] if r.random() < 0.05 else [])
        )

    def _labels(self, r: random.Random) -> dict[str, Any] | None:
        roll = r.random()
        if roll < 0.1:
            return None
        if roll < 0.5:
            return r.choice([{"env": "prod"}, {"env": "prod", "region": "eu"}, {"region": "eu"}])
        labels: dict[str, Any] = {}
        for _ in range(r.randrange(3)):
            key = r.choice(["env", "region", "tier", "Env", "x/y", ""])
            labels[key] = r.choice(["prod", "dev", "eu", "us", "qa", "", "Prod", None, 1])
        return labels

    def _object(self, r: random.Random) -> dict[str, Any]:
        meta: dict[str, Any] = {}
        if r.random() < 0.9:
            meta["name"] = self._name(r) if r.random() < 0.6 else f"made-{r.randrange(30)}"
        if r.random() < 0.5:
            meta["namespace"] = r.choice([*NAMESPACES, "other"])
        labels = self._labels(r)
        if labels is not None:
            meta["labels"] = labels
        if r.random() < 0.2:
            meta["resourceVersion"] = r.choice(["1", "0", "", "abc", "99999"])
        if r.random() < 0.05:
            meta["uid"] = str(uuid.UUID(int=r.getrandbits(128)))
        if r.random() < 0.03:
            meta["generateName"] = "gen-"
        good = r.random() < 0.85
        obj: dict[str, Any] = {
            "apiVersion": "example.io/v1alpha1" if good else r.choice(["v1", "", "example.io/v1"]),
            "kind": "Widget" if good else r.choice(["Secret", "", "widget"]),
            "metadata": meta if r.random() < 0.97 else r.choice(["x", 1, [], None]),
            "spec": {"size": r.choice([1, 2, -1, "x"]), "color": r.choice(["red", "prod", "dev"])},
        }
        if r.random() < 0.2:
            obj["status"] = {"phase": r.choice(["Ready", "x"])}
        if r.random() < 0.1:
            obj |= lookalike(str(meta.get("name", "")), str(meta.get("namespace", "")))
        return obj

    def _patch(self, r: random.Random, content_type: str) -> bytes:
        if "json-patch" in content_type or (not content_type and r.random() < 0.3):
            ops = [self._op(r) for _ in range(r.choice([0, 1, 1, 1, 2, 3]))]
            return json.dumps(ops).encode()
        if "apply" in content_type:
            obj = self._object(r)
            if r.random() < 0.6:
                return yaml.safe_dump(obj).encode()
            return json.dumps(obj).encode()
        patch: dict[str, Any] = {}
        roll = r.random()
        if roll < 0.4:
            patch["metadata"] = {"labels": self._labels(r)}
        elif roll < 0.5:
            patch["metadata"] = None
        elif roll < 0.6:
            patch["metadata"] = {"resourceVersion": r.choice(["1", None, ""])}
        elif roll < 0.7:
            patch["metadata"] = {"labels": None}
        if r.random() < 0.5:
            patch["spec"] = {"color": r.choice(["blue", None])}
        if r.random() < 0.2:
            patch["status"] = {"phase": "x"}
        return json.dumps(patch if r.random() < 0.97 else r.choice([[], 1, None])).encode()

    @staticmethod
    def _op(r: random.Random) -> Any:
        path = r.choice(
            [
                "/metadata/labels/env",
                "/metadata/labels/env",
                "/metadata/labels/region",
                "/metadata/labels",
                "/metadata/labels/x~1y",
                "/metadata/resourceVersion",
                "/metadata",
                "",
                "/",
                "/spec/color",
                "/spec/color",
                "/spec",
                "/status/phase",
                "/metadata/name",
                "/metadata/annotations/fuzz~1token",
                "/kind",
                "/metadata/labels/env/0",
                "metadata/labels/env",
            ]
        )
        op = r.choice(["add", "remove", "replace", "replace", "move", "copy", "test", "bogus"])
        out: dict[str, Any] = {"op": op, "path": path}
        if op in ("move", "copy"):
            out["from"] = r.choice(["/spec/color", "/metadata/labels/env", "/metadata", "/x"])
        if op in ("add", "replace", "test"):
            out["value"] = r.choice(["dev", "prod", "eu", None, {}, {"env": "dev"}, "1", 1])
        if r.random() < 0.03:
            return r.choice(["x", 1, None, [out]])
        return out

    @staticmethod
    def _delete_options(r: random.Random) -> bytes | None:
        roll = r.random()
        if roll < 0.3:
            return None
        options: dict[str, Any] = {}
        if r.random() < 0.3:
            options["kind"] = "DeleteOptions"
            options["apiVersion"] = r.choice(["v1", "meta.k8s.io/v1"])
        if r.random() < 0.6:
            options["preconditions"] = r.choice(
                [{}, {"uid": "x"}, {"resourceVersion": "1"}, {"uid": None}, [], "x", {"foo": 1}]
            )
        if r.random() < 0.2:
            options["dryRun"] = r.choice([["All"], "All", ["x"]])
        if r.random() < 0.2:
            options["propagationPolicy"] = r.choice(["Orphan", "x"])
        if r.random() < 0.05:
            options["ignoreStoreReadErrorWithClusterBreakingPotential"] = True
        return json.dumps(options).encode()


def _quote(value: str, r: random.Random) -> str:
    """Percent-encode a query value, sometimes not at all (raw characters reach the server)."""
    if r.random() < 0.1:
        return "".join(c if c.isalnum() or c in "=,!()-._~" else "%20" for c in value)
    return quote(value, safe="")


# --- running and checking -------------------------------------------------------------------


@dataclass
class Result:
    status: int
    content_type: str
    body: bytes
    upstream_requests: int
    upstream_answers: list[UpstreamAnswer]
    log_problems: list[str]
    truncated: bool
    transport_problem: str | None = None


@dataclass
class FuzzWorld:
    fake: FakeUpstream
    recorder: UpstreamRecorder
    upstream_url: str
    proxy_base: str
    session: aiohttp.ClientSession
    logs: LogCapture
    tokens: dict[Key, str] = field(default_factory=dict)
    snapshot: dict[Key, Stored] = field(default_factory=dict)
    snapshot_rv: int = -1
    ever_visible: dict[str, set[str]] = field(default_factory=dict)
    """Per slice: the uids and names of every object that was ever in it. A watch from an old
    resourceVersion replays history, which may legitimately show such objects again."""

    def seed(self) -> None:
        for kind, labels in SEEDS.items():
            for cluster in CLUSTERS:
                for ns in NAMESPACES:
                    name = seed_name(kind, cluster, ns)
                    token = "tok" + uuid.uuid4().hex[:20]
                    self.tokens[(cluster, ns, name)] = token
                    self.fake.create(cluster=cluster, obj=widget(name, ns, labels, token))

    def reset(self) -> None:
        """Put the seeded objects back as they were; remove everything else."""
        wanted = {
            (c, n, seed_name(k, c, n)): labels
            for k, labels in SEEDS.items()
            for c in CLUSTERS
            for n in NAMESPACES
        }
        for key in self.snapshot:
            if key not in wanted:
                self.fake.delete(cluster=key[0], namespace=key[1], name=key[2])
        for key, labels in wanted.items():
            current = self.snapshot.get(key)
            if current is not None and current.labels == labels and current.token:
                continue
            obj = widget(key[2], key[1], labels, self.tokens[key])
            if current is None:
                self.fake.create(cluster=key[0], obj=obj)
            else:
                self.fake.update(cluster=key[0], obj=obj)

    async def refresh(self) -> dict[Key, Stored]:
        """The store as the fake holds it now, listed from the fake directly (not through
        the proxy, and outside any fuzz request's accounting)."""
        if self.fake.resource_version == self.snapshot_rv:
            return self.snapshot
        url = f"{self.upstream_url}/clusters/*{GROUP_VERSION}/widgets"
        async with self.session.get(url, headers={"Accept": "application/json"}) as response:
            assert response.status == 200, await response.text()
            items = (await response.json())["items"]
        objects: dict[Key, Stored] = {}
        for obj in items:
            meta = obj["metadata"]
            key = (meta["annotations"]["kcp.io/cluster"], meta.get("namespace", ""), meta["name"])
            objects[key] = Stored(
                rv=meta.get("resourceVersion", ""),
                uid=meta.get("uid", ""),
                labels=dict(meta.get("labels") or {}),
                token=(meta.get("annotations") or {}).get("fuzz/token", ""),
            )
        self.snapshot = objects
        self.snapshot_rv = self.fake.resource_version
        for slice_name, visible in VISIBLE.items():
            seen = self.ever_visible.setdefault(slice_name, set())
            for key, stored in objects.items():
                if visible(stored.labels):
                    seen.update((stored.uid, key[2]))
        return objects

    async def drop_unreadable(self) -> dict[Key, Stored]:
        """Remove objects whose labels are not strings. kcp refuses them when it decodes the
        request; the fake stores them, and the proxy then (rightly) cannot read its lists."""
        for key, stored in list(self.snapshot.items()):
            if not all(isinstance(v, str) for v in stored.labels.values()):
                self.fake.delete(cluster=key[0], namespace=key[1], name=key[2])
        return await self.refresh()

    async def send(self, request: FuzzRequest) -> Result:
        requests_before = len(self.fake.faults.requests)
        answers_before = len(self.recorder.answers)
        logs_before = len(self.logs.records)
        if request.method == "HEAD":
            status, content_type, body, problem, truncated = await self._send_raw_head(request)
        else:
            status, content_type, body, problem, truncated = await self._send(request)
        if truncated:
            # Let the proxy notice the disconnect before the next request is counted.
            await asyncio.sleep(0.01)
        return Result(
            status=status,
            content_type=content_type,
            body=body,
            upstream_requests=len(self.fake.faults.requests) - requests_before,
            upstream_answers=self.recorder.answers[answers_before:],
            log_problems=self.logs.problems(logs_before),
            truncated=truncated,
            transport_problem=problem,
        )

    async def _send(self, request: FuzzRequest) -> tuple[int, str, bytes, str | None, bool]:
        url = URL(self.proxy_base + request.target, encoded=True)
        headers = CIMultiDict(request.headers) if request.headers else None
        data: bytes | io.BytesIO | None = request.body
        if request.body is not None and len(request.body) > 2**20:
            data = io.BytesIO(request.body)  # aiohttp warns about large raw bodies
        try:
            async with asyncio.timeout(HEADERS_TIMEOUT):
                response = await self.session.request(
                    request.method,
                    url,
                    headers=headers,
                    data=data,
                    skip_auto_headers=("Accept", "Content-Type", "Accept-Encoding"),
                    allow_redirects=False,
                )
        except TimeoutError:
            return 0, "", b"", f"no response headers within {HEADERS_TIMEOUT}s", True
        except aiohttp.ClientError as e:
            return 0, "", b"", f"unreadable response: {type(e).__name__}: {e}"[:500], False
        problem = None
        truncated = False
        chunks = []
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + STREAM_MAX
            while True:
                try:
                    async with asyncio.timeout(STREAM_IDLE):
                        chunk = await response.content.readany()
                except TimeoutError:
                    truncated = True
                    break
                if not chunk:
                    break
                chunks.append(chunk)
                if loop.time() > deadline:
                    truncated = True
                    break
        except aiohttp.ClientError as e:
            problem = f"broken response body: {type(e).__name__}: {e}"[:500]
        finally:
            response.close()
        content_type = response.headers.get("Content-Type", "")
        return response.status, content_type, b"".join(chunks), problem, truncated

    async def _send_raw_head(
        self, request: FuzzRequest
    ) -> tuple[int, str, bytes, str | None, bool]:
        """HEAD over a raw connection: an HTTP client reads no body after a HEAD response, so a
        server that sends one anyway corrupts the next response on a kept-alive connection
        (aiohttp's client would blame that next request). Here every byte is seen."""
        base = URL(self.proxy_base)
        host, port = base.host or "127.0.0.1", base.port or 80
        lines = [f"HEAD {request.target} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in request.headers]
        if request.body:
            lines.append(f"Content-Length: {len(request.body)}")
        reader, writer = await asyncio.open_connection(host, port)
        data = bytearray()
        truncated = False
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (request.body or b""))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + HEADERS_TIMEOUT
            while True:
                idle = STREAM_IDLE if b"\r\n\r\n" in data else HEADERS_TIMEOUT
                try:
                    async with asyncio.timeout(idle):
                        chunk = await reader.read(65536)
                except TimeoutError:
                    truncated = True
                    break
                if not chunk:
                    break
                data += chunk
                if loop.time() > deadline:
                    truncated = True
                    break
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        head, sep, rest = bytes(data).partition(b"\r\n\r\n")
        while sep and head.startswith(b"HTTP/1.1 1"):  # interim (100 Continue): skip
            head, sep, rest = rest.partition(b"\r\n\r\n")
        if not sep:
            return 0, "", b"", f"no complete HEAD response: {bytes(data)[:200]!r}", truncated
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        content_type = next(
            (
                value.strip()
                for name, _, value in (h.partition(":") for h in header_lines)
                if name.strip().lower() == "content-type"
            ),
            "",
        )
        problem = f"HEAD response carries {len(rest)} body bytes: {rest[:120]!r}" if rest else None
        return status, content_type, b"", problem, truncated


# The proxy's own refusals: answered before the upstream is needed.
STATIC_REFUSALS = frozenset({400, 403, 405, 406, 411, 413, 414, 415, 431})
_CONTINUE_RE = re.compile(
    rb'"continue"\s*:\s*"([A-Za-z0-9_\-+/=]+)"|continue: ([A-Za-z0-9_\-+/=]+)'
)


# Invariant names, as reported.
TRANSPORT = "0. HTTP framing"
NO_500 = "1. no 500, no 5xx made by the proxy"
STATUS = "2. errors are Status objects"
LOGS = "3. no ERROR log record or traceback"
REFUSED = "4. own refusals never reach the upstream"
LEAK = "5. nothing of objects outside the slice in a response"
WRITES = "6. writes only inside the slice"


def check(
    request: FuzzRequest,
    result: Result,
    before: dict[Key, Stored],
    after: dict[Key, Stored],
    ever_visible: dict[str, set[str]],
) -> list[tuple[str, str]]:
    """What ``result`` breaks, as ``(invariant, detail)`` pairs."""
    problems: list[tuple[str, str]] = []
    status = result.status
    if result.transport_problem:
        problems.append((TRANSPORT, result.transport_problem))
    if status == 0:
        return problems
    relayed = any(a.status == status for a in result.upstream_answers)
    # 1. no 500; other 5xx only relayed or for the not-ready slice
    if status == 500:
        origin = "relayed from the upstream" if relayed else "made by the proxy"
        problems.append((NO_500, f"status 500 ({origin})"))
    elif status >= 500 and not relayed and not (status == 503 and request.slice_name == NOT_READY):
        problems.append((NO_500, f"status {status} made by the proxy"))
    # 2. errors are Status objects
    if not 200 <= status < 300:
        problem = status_problem(
            status=status, content_type=result.content_type, body=result.body, method=request.method
        )
        if problem:
            problems.append((STATUS, f"status {status}: {problem}"))
    # 3. logs
    problems.extend((LOGS, p) for p in result.log_problems)
    # 4. own refusals never reach the upstream
    if status in STATIC_REFUSALS and result.upstream_requests and not relayed:
        sent = ", ".join(f"{a.method} {a.path} -> {a.status}" for a in result.upstream_answers)
        problems.append(
            (
                REFUSED,
                f"refused with {status} after {result.upstream_requests} upstream "
                f"request(s): {sent}",
            )
        )
    # 5. nothing of objects outside the slice (now, before, or ever: watches replay history)
    visible = VISIBLE.get(request.slice_name or "")
    seen = ever_visible.get(request.slice_name or "", set())
    text = result.body
    tokens_in_continue = b" ".join(
        _b64(m.group(1) or m.group(2)) for m in _CONTINUE_RE.finditer(text)
    )
    for key in before.keys() | after.keys():
        stored = before.get(key) or after.get(key)
        assert stored is not None
        if stored.uid in seen:
            continue
        name = key[2]
        for what, marker in (("token", stored.token), ("uid", stored.uid)):
            if marker and marker.encode() in text:
                problems.append((LEAK, f"the response shows the {what} of {key}"))
        if not request.mentions(name) and name not in seen:
            pattern = re.compile(
                rb"(?<![A-Za-z0-9.\-])" + re.escape(name.encode()) + rb"(?![A-Za-z0-9.\-])"
            )
            if pattern.search(text):
                problems.append((LEAK, f"the response names {key}"))
            if pattern.search(tokens_in_continue):
                problems.append((LEAK, f"a continue token in the response encodes {key}"))
    # 6. writes stay inside the slice
    for key in before.keys() | after.keys():
        was, now = before.get(key), after.get(key)
        if was is not None and now is not None and was.rv == now.rv:
            continue
        change = "created" if was is None else "deleted" if now is None else "changed"
        if visible is None:
            problems.append((WRITES, f"{key} {change} through a URL that addresses no slice"))
            continue
        if was is not None and not visible(was.labels):
            problems.append((WRITES, f"{key} {change} although outside the slice ({was.labels})"))
        if now is not None and not visible(now.labels):
            problems.append((WRITES, f"{key} {change}: now outside the slice ({now.labels})"))
    return problems


def _b64(token: bytes) -> bytes:
    try:
        return base64.urlsafe_b64decode(token + b"=" * (-len(token) % 4))
    except (ValueError, TypeError):
        return b""


# --- the test -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fuzz_world(
    selectors: Mapping[str, Mapping[str, Any]] = ROUTES,
    *,
    cache: bool = False,
) -> AsyncIterator[FuzzWorld]:
    """The fake upstream, seeded, and the proxy in front of it with ``selectors`` as its
    slices (the test's own idea of what each slice shows is :data:`VISIBLE`); ``cache``: LIST
    and WATCH from the shared watch cache."""
    fake = FakeUpstream(bookmark_interval=0.05, history_size=200)
    recorder = UpstreamRecorder()
    recorder.install(fake)
    async with start_fake_upstream(fake) as (_, vw_url):
        routes = Routes(
            RouteTable(
                [
                    *(
                        Route(
                            cluster=SLICE_CLUSTER,
                            name=name,
                            selector=Selector.from_label_selector(selector),
                            upstream_url=vw_url,
                        )
                        for name, selector in selectors.items()
                    ),
                    Route(
                        cluster=SLICE_CLUSTER,
                        name=NOT_READY,
                        selector=Selector.parse("env=prod"),
                        upstream_url=vw_url,
                        not_ready="APIExport root:nowhere/widgets.example.io not found",
                    ),
                ]
            )
        )
        auth = ClientAuth(server=vw_url.removesuffix(fake.base_path), token="proxy-token")
        client = KubeClient(auth=auth)
        registry = CacheRegistry(client=client, clock=SystemClock()) if cache else None
        app = build_app(
            routes=routes,
            upstream=UpstreamClient(auth=auth),
            page_size=3,
            guard=NO_AUTH,
            cache=registry,
        )
        with LogCapture() as logs:
            async with (
                client,
                contextlib.aclosing(registry) if registry is not None else _nothing(),
                serve_app(app) as proxy,
                aiohttp.ClientSession(auto_decompress=True) as session,
            ):
                world = FuzzWorld(fake, recorder, vw_url, proxy, session, logs)
                world.seed()
                await world.refresh()
                yield world


@contextlib.asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


@pytest.fixture(params=["passthrough", "cache"])
async def world(request: pytest.FixtureRequest) -> AsyncIterator[FuzzWorld]:
    async with fuzz_world(cache=request.param == "cache") as world:
        yield world


async def run_fuzz(
    world: FuzzWorld, examples: int, seed: int
) -> tuple[dict[str, list[str]], set[int], dict[int, int]]:
    """Send ``examples`` generated requests one by one; the broken invariants (with their
    failing requests), the indexes of failing requests, and the count of each status."""
    generator = Generator(seed)
    failures: dict[str, list[str]] = {}
    failed: set[int] = set()
    counts: dict[int, int] = {}
    for index in range(examples):
        if index and index % RESET_EVERY == 0:
            world.reset()
        before = await world.refresh()
        request = generator.request(index)
        result = await world.send(request)
        after = await world.refresh()
        counts[result.status] = counts.get(result.status, 0) + 1
        for invariant, detail in check(request, result, before, after, world.ever_visible):
            failed.add(index)
            failures.setdefault(invariant, []).append(
                f"{request.describe()}\n  -> {result.status} {result.content_type} "
                f"{result.body[:300]!r}\n  {detail}"
            )
        await world.drop_unreadable()
    return failures, failed, counts


async def test_fuzz_requests_keep_the_slice_invariants(world: FuzzWorld) -> None:
    failures, failed, counts = await run_fuzz(world, EXAMPLES, SEED)
    summary = ", ".join(f"{status}: {n}" for status, n in sorted(counts.items()))
    print(f"fuzz: {EXAMPLES} requests (seed {SEED}); statuses {summary}")
    report = [
        f"{invariant}: {len(cases)} case(s); the first {min(len(cases), PER_INVARIANT)}:\n\n"
        + "\n\n".join(cases[:PER_INVARIANT])
        for invariant, cases in sorted(failures.items())
    ]
    assert not failures, (
        f"{len(failed)} of {EXAMPLES} fuzz requests broke an invariant "
        f"(VWSERVER_FUZZ_SEED={SEED} VWSERVER_FUZZ_EXAMPLES={EXAMPLES}):\n\n"
        + "\n\n\n".join(report)
    )


def test_generator_is_deterministic() -> None:
    a, b = Generator(SEED), Generator(SEED)
    assert [a.request(i).describe() for i in range(200)] == [
        b.request(i).describe() for i in range(200)
    ]
