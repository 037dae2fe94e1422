"""HTTP handlers of the fake upstream: routing, discovery, and each verb against the store.

One :class:`Handlers` object serves one :class:`~fakekcp.requests.UpstreamSettings`. The
verbs follow ``k8s.io/apiserver/pkg/endpoints/handlers`` (get.go, create.go, update.go, patch.go,
delete.go) as reached through kcp's APIExport virtual workspace; where the two differ, kcp's
behaviour is the one modelled (see :mod:`fakekcp.upstream`).
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Final

import msgspec
import yaml
from aiohttp import web
from multidict import MultiDict

from fakekcp import render
from fakekcp.managed import track
from fakekcp.patch import PatchError, apply_json_patch, apply_merge_patch
from fakekcp.render import Output
from fakekcp.requests import (
    ListOptions,
    Target,
    UpstreamSettings,
    bad_request_no_reason,
    dry_run_requested,
    error_response,
    flag,
    forbidden,
    method_not_supported,
    parse_list_options,
    parse_rv,
)
from fakekcp.status import (
    FakeApiError,
    bad_request,
    invalid,
    not_found_error,
    resource_expired,
    status_error,
    too_large_resource_version,
)
from fakekcp.store import (
    CLUSTER_ANNOTATION,
    JSON,
    Event,
    Key,
    ResourceSpec,
    SnapshotExpired,
    Store,
    StoredObject,
    Watcher,
    copy_json,
    decode_continue,
    encode_continue,
)
from fakekcp.watch import WatchStream

_decode = msgspec.json.Decoder().decode

# The watch cache waits this long for a resourceVersion it has not seen (blockTimeout).
FRESHNESS_WAIT: Final = 3.0
_STREAM_CHUNK: Final = 256 * 1024
_WRITE_VERBS: Final = frozenset({"create", "update", "patch", "delete", "deletecollection"})
_PATCH_TYPES: Final = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
)
# etcd3 store errors (k8s.io/apiserver/pkg/storage/etcd3/errors.go)
_LIST_EXPIRED: Final = "The resourceVersion for the provided list is too old."
_INCONSISTENT_CONTINUE: Final = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this response "
    "to retrieve the remainder of the results. Continuing with the provided token results in an "
    "inconsistent list - objects that were created, modified, or deleted between the time the "
    "first chunk was returned and now may show up in the list."
)


class Handlers:
    """The aiohttp handler (:meth:`handle`) and everything below it."""

    def __init__(self, fake: UpstreamSettings, store: Store) -> None:
        self.fake = fake
        self.store = store
        self.closing = False
        self.active_watches = 0
        self.watch_requests: dict[int, web.Request] = {}  # by id(): requests are unhashable
        self._discovery = render.discovery_documents(
            store.specs, f"{fake.base_path}/clusters/*/openapi/v3"
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._dispatch(request)
        except FakeApiError as error:
            return error_response(error)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        cluster_segment = request.match_info["cluster"]
        parts = [part for part in request.match_info["tail"].split("/") if part]
        path = "/".join(parts)
        if path in self._discovery or path.startswith("openapi/"):
            if request.method != "GET":
                raise status_error(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                )
            if path not in self._discovery:
                raise render.generic_not_found()
            return web.Response(body=self._discovery[path], content_type="application/json")
        target = self._resolve(request, cluster_segment, parts)
        self._authorize(target)
        handlers = {
            "get": self._get,
            "list": self._list,
            "watch": self._watch,
            "create": self._create,
            "update": self._update,
            "patch": self._patch,
            "delete": self._delete,
            "deletecollection": self._delete_collection,
        }
        return await handlers[target.verb](request, target)

    def _resolve(self, request: web.Request, cluster_segment: str, parts: list[str]) -> Target:
        """RequestInfo parsing for ``apis/<group>/<version>/[namespaces/<ns>/]<plural>/...``
        (and ``api/<version>/...`` for a core resource the fake serves, as kcp's VW serves an
        export's accepted permission claims)."""
        if len(parts) >= 3 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise render.generic_not_found()
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        spec = self.store.spec_for(group, version, rest[0])
        if spec is None or len(rest) > 3 or (namespace is not None and not spec.namespaced):
            raise render.generic_not_found()
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        watch = bool(flag(request.query, "watch"))
        verbs = (
            {"GET": "watch" if watch else "list", "POST": "create", "DELETE": "deletecollection"}
            if name is None
            else {
                "GET": "watch" if watch and subresource is None else "get",
                "PUT": "update",
                "PATCH": "patch",
            }
            | ({"DELETE": "delete"} if subresource is None else {})
        )
        verb = verbs.get(request.method)
        if verb is None:
            raise status_error(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
                details={},
            )
        return Target(
            spec,
            None if cluster_segment == "*" else cluster_segment,
            namespace,
            name,
            subresource,
            verb,
        )

    def _authorize(self, target: Target) -> None:
        """kcp's rules for the wildcard cluster, APIBindings and unbound clusters."""
        spec, verb = target.spec, target.verb
        if target.cluster is None:
            if verb in ("list", "watch"):
                if spec.namespaced and target.namespace is not None:
                    raise bad_request_no_reason(
                        "cross-cluster LIST and WATCH are required to be cross-namespace, not "
                        f"scoped to namespace {target.namespace}"
                    )
                return
            if spec.read_only and verb in _WRITE_VERBS:
                raise method_not_supported(spec, verb)
            if spec.namespaced and target.namespace is None:
                raise self._namespace_required(spec)
            raise method_not_supported(spec, verb, " in the `*` logical cluster")
        if not self.fake.is_bound(target.cluster):
            raise forbidden(target, "could not find suitable APIBinding in target logical cluster")
        if spec.read_only and verb in _WRITE_VERBS:
            raise forbidden(
                target, "write access to APIBinding is not allowed from virtual workspace"
            )
        if spec.namespaced and target.namespace is None and verb not in ("list", "watch"):
            raise self._namespace_required(spec)
        if target.subresource is not None and not (
            target.subresource == "status" and spec.status_subresource
        ):
            raise not_found_error(spec.group, spec.plural, target.name or "")

    @staticmethod
    def _namespace_required(spec: ResourceSpec) -> FakeApiError:
        return bad_request_no_reason(
            "there should be a Namespace context in a request for a namespaced resource: "
            f"{spec.api_version}, Resource={spec.plural}"
        )

    def _matcher(self, opts: ListOptions) -> Callable[[Key, StoredObject], bool]:
        selector = None if self.fake.faults.ignore_selectors else opts.selector
        fields = opts.fields

        def match(key: Key, stored: StoredObject) -> bool:
            for label, equal, value in fields:
                actual = key[2] if label == "metadata.name" else key[1]
                if (actual == value) != equal:
                    return False
            return selector is None or selector.matches(stored.labels)

        return match

    # --- reads ------------------------------------------------------------------------------------

    async def _get(self, request: web.Request, target: Target) -> web.StreamResponse:
        output = render.negotiate(request.headers.get("Accept", ""))
        assert target.cluster is not None
        assert target.name is not None
        key: Key = (target.cluster, target.namespace or "", target.name)
        stored = self.store.get(target.spec, key)
        if self.fake.faults.ignore_scope:
            stored = next(
                (s for s in self.store.objects(target.spec, None) if _key_of(s) != key), stored
            )
        if stored is None:
            raise not_found_error(target.spec.group, target.spec.plural, target.name)
        return self._object_response(request, target.spec, output, stored.obj, stored.raw, 200)

    def _object_response(
        self,
        request: web.Request,
        spec: ResourceSpec,
        output: Output,
        obj: JSON,
        raw: bytes | None,
        code: int,
    ) -> web.Response:
        refusal = render.not_acceptable_for(output, is_list=False)
        if refusal is not None:
            raise refusal
        body = render.render_object(spec, obj, raw, output, render.include_object(request.query))
        return web.Response(status=code, body=body, content_type="application/json")

    async def _list(self, request: web.Request, target: Target) -> web.StreamResponse:
        output = render.negotiate(request.headers.get("Accept", ""))
        refusal = render.not_acceptable_for(output, is_list=True)
        if refusal is not None:
            raise refusal
        include = render.include_object(request.query)
        opts = parse_list_options(request.query, watch=False)
        spec = target.spec
        at_rv: int | None = None
        after: Key | None = None
        limit = opts.limit
        if opts.continue_token:
            after, token_rv = decode_continue(opts.continue_token, spec)
            if opts.rv not in ("", "0"):
                raise bad_request("specifying resource version is not allowed when using continue")
            at_rv = None if token_rv < 0 else token_rv  # -1: continue inconsistently at "now"
        elif opts.rv_match == "Exact" or (
            not opts.rv_match and opts.rv not in ("", "0") and limit > 0
        ):
            at_rv = parse_rv(opts.rv)  # Exact, or the legacy "RV + limit" exact read
            if at_rv > self.store.rv:
                raise too_large_resource_version(at_rv, self.store.rv)
        elif opts.rv not in ("", "0"):
            wanted = parse_rv(opts.rv)  # NotOlderThan: the watch cache waits to catch up
            if not await self.store.wait_for_rv(wanted, FRESHNESS_WAIT):
                raise too_large_resource_version(wanted, self.store.rv)
        if opts.rv == "0" and not opts.continue_token:
            limit = 0  # cacher.computeListLimit: the limit is ignored for resourceVersion=0
        try:
            foreign = self.fake.faults.ignore_scope
            page = self.store.list_page(
                spec,
                cluster=None if foreign else target.cluster,
                namespace=None if foreign else target.namespace,
                match=(lambda _k, _s: True) if foreign else self._matcher(opts),
                at_rv=at_rv,
                after=after,
                limit=limit,
                count_remaining=opts.unfiltered,
            )
        except SnapshotExpired:
            if after is not None:
                raise resource_expired(
                    _INCONSISTENT_CONTINUE, continue_token=encode_continue(after, -1)
                ) from None
            raise resource_expired(_LIST_EXPIRED) from None
        token = encode_continue(page.last_key, page.rv) if page.has_more and page.last_key else ""
        meta = render.list_meta(
            rv=page.rv, continue_token=token, remaining=page.remaining, sort=not output.kind
        )
        head, tail = render.list_frame(spec, output, meta)
        items = (render.list_item(spec, stored, output, include) for stored in page.items)
        return await self._send_list(request, head, items, tail, len(page.items))

    async def _send_list(
        self, request: web.Request, head: bytes, items: Iterable[bytes], tail: bytes, count: int
    ) -> web.StreamResponse:
        if self.fake.faults.garbage:
            return web.Response(
                body=head[:20] + b"<<this is not json>>", content_type="application/json"
            )
        gzip = self.fake.gzip and "gzip" in request.headers.get("Accept-Encoding", "").lower()
        if count <= 2000 and not gzip:
            return web.Response(
                body=head + b",".join(items) + tail, content_type="application/json"
            )
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        compressor = None
        if gzip:
            # responsewriters: gzip at level 1 (gzipContentEncodingLevel), Vary: Accept-Encoding.
            response.headers["Content-Encoding"] = "gzip"
            response.headers["Vary"] = "Accept-Encoding"
            compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
        await response.prepare(request)
        chunk: list[bytes] = [head]
        size = len(head)
        first = True
        for item in items:
            if not first:
                chunk.append(b",")
            first = False
            chunk.append(item)
            size += len(item) + 1
            if size >= _STREAM_CHUNK:
                data = b"".join(chunk)
                await response.write(compressor.compress(data) if compressor else data)
                chunk, size = [], 0
        chunk.append(tail)
        data = b"".join(chunk)
        await response.write(compressor.compress(data) + compressor.flush() if compressor else data)
        await response.write_eof()
        return response

    # --- watch ------------------------------------------------------------------------------------

    async def _watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        output = render.negotiate(request.headers.get("Accept", ""))
        include = render.include_object(request.query)
        opts = parse_list_options(request.query, watch=True)
        spec = target.spec
        name = target.name
        namespace = target.namespace
        for label, equal, value in opts.fields:  # cacher.Watch narrows its scope the same way
            if equal and label == "metadata.name":
                if name is not None and name != value:
                    raise bad_request("fieldSelector metadata.name doesn't match requested name")
                name = value
            elif equal and label == "metadata.namespace" and namespace is None:
                namespace = value
        match = self._matcher(opts)
        error: FakeApiError | None = None
        initial: list[StoredObject] = []
        replay: list[Event] = []
        start_rv = 0
        if opts.initial_events:
            if opts.rv not in ("", "0"):
                wanted = parse_rv(opts.rv)
                if not await self.store.wait_for_rv(wanted, FRESHNESS_WAIT):
                    error = too_large_resource_version(wanted, self.store.rv)
        elif opts.rv not in ("", "0"):
            start_rv = parse_rv(opts.rv)
        # From here to store.watch() nothing awaits: the snapshot/replay and the registration see
        # the same store state, so no event is missed or duplicated.
        cluster = target.cluster
        if self.fake.faults.ignore_scope:
            cluster = namespace = name = None
            match = self._matcher(replace(opts, fields=[]))
        watcher = Watcher(cluster, namespace, name)
        if error is None:
            if opts.initial_events:
                start_rv = self.store.rv
                initial = self.store.list_page(
                    spec,
                    cluster=cluster,
                    namespace=namespace,
                    match=lambda k, s: (name is None or k[2] == name) and match(k, s),
                    at_rv=None,
                    after=None,
                    limit=0,
                    count_remaining=False,
                ).items
            elif start_rv:
                try:
                    replay = self.store.events_since(spec, start_rv)
                except SnapshotExpired as expired:
                    # watchCacheHistory.GetIntervalLocked, sent as an ERROR event (newErrWatcher).
                    error = resource_expired(
                        f"too old resource version: {start_rv} ({expired.floor})"
                    )
            else:
                start_rv = self.store.rv
        if error is None:
            self.store.watch(spec, watcher)
            self.active_watches += 1
            self.watch_requests[id(request)] = request
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await response.prepare(request)
            if error is not None:
                await response.write(render.error_line(error))
                return response
            stream = WatchStream(self, request, response, spec, output, include, match)
            await stream.run(watcher, initial, replay, opts, start_rv)
        except ConnectionError:
            pass  # the client went away
        finally:
            if error is None:
                self.active_watches -= 1
                self.watch_requests.pop(id(request), None)
            self.store.unwatch(spec, watcher)
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    # --- writes ---------------------------------------------------------------------------

    async def _read_body(self, request: web.Request) -> Any:
        raw = await request.read()
        content_type = request.content_type
        try:
            if content_type in ("application/yaml", "application/apply-patch+yaml"):
                return yaml.safe_load(raw)
            if content_type in ("application/json", "application/octet-stream") or not raw:
                return _decode(raw) if raw else None
            if content_type in ("application/merge-patch+json", "application/json-patch+json"):
                return _decode(raw)
        except (msgspec.DecodeError, yaml.YAMLError) as e:
            raise bad_request(f"error decoding body: {e}") from None
        raise status_error(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json, application/yaml",
        )

    @staticmethod
    def _check_object(spec: ResourceSpec, body: Any, raw_text: str, url_name: str | None) -> JSON:
        """Decoding into the expected GVK, then the CR validator's kind/apiVersion checks."""
        if not isinstance(body, dict) or not body.get("kind"):
            raise bad_request(f"Object 'Kind' is missing in '{raw_text}'")
        api_version = body.setdefault("apiVersion", spec.api_version)
        if api_version != spec.api_version:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({spec.api_version})"
            )
        meta = body.get("metadata") or {}
        if body["kind"] != spec.kind:
            raise invalid(
                spec.group,
                spec.kind,
                meta.get("name", ""),
                [
                    (
                        "FieldValueInvalid",
                        "kind",
                        f'Invalid value: "{body["kind"]}": must be {spec.kind}',
                    )
                ],
            )
        name = meta.get("name") or ""
        if url_name is not None and name and name != url_name:
            raise bad_request(
                f"the name of the object ({name}) does not match the name on the URL ({url_name})"
            )
        return body

    def _key(self, target: Target) -> Key:
        assert target.cluster is not None
        assert target.name is not None
        return (target.cluster, target.namespace or "", target.name)

    async def _create(self, request: web.Request, target: Target) -> web.StreamResponse:
        output = render.negotiate(request.headers.get("Accept", ""))
        dry_run = dry_run_requested(request.query, "CreateOptions")
        raw = await request.read()
        body = self._check_object(
            target.spec, await self._read_body(request), raw.decode(errors="replace"), None
        )
        assert target.cluster is not None
        manager = request.query.get("fieldManager")
        if self.fake.managed_fields and manager and isinstance(body.get("metadata"), dict):
            body["metadata"]["managedFields"] = track([], manager=manager, body=body, apply=False)
        obj, stored = self.store.create(
            target.spec, target.cluster, target.namespace or "", body, dry_run=dry_run
        )
        obj, answer = self._answer(obj, stored, dry_run=dry_run)
        return self._object_response(request, target.spec, output, obj, answer, 201)

    def _answer(
        self, obj: JSON, stored: StoredObject | None, *, dry_run: bool
    ) -> tuple[JSON, bytes | None]:
        """A write's answer: the object written — or, with the ``foreign_answers`` fault, that
        object moved out of the request's scope (a shard mix-up)."""
        where = self.fake.faults.foreign_answers
        if not where or (dry_run and not self.fake.faults.foreign_dry_runs):
            return obj, stored.raw if stored else None
        foreign = copy_json(obj)
        meta = foreign.setdefault("metadata", {})
        if where == "cluster":
            annotations = meta.setdefault("annotations", {})
            annotations[CLUSTER_ANNOTATION] = f"{annotations.get(CLUSTER_ANNOTATION, '')}-foreign"
        elif where == "name":  # a prefix: no generateName admits it either
            meta["name"] = f"foreign-{meta.get('name', '')}"
        else:
            meta[where] = f"{meta.get(where, '')}-foreign"
        return foreign, None

    async def _update(self, request: web.Request, target: Target) -> web.StreamResponse:
        output = render.negotiate(request.headers.get("Accept", ""))
        dry_run = dry_run_requested(request.query, "UpdateOptions")
        raw = await request.read()
        body = self._check_object(
            target.spec, await self._read_body(request), raw.decode(errors="replace"), target.name
        )
        obj, stored = self.store.update(
            target.spec,
            self._key(target),
            body,
            status=target.subresource == "status",
            dry_run=dry_run,
        )
        obj, answer = self._answer(obj, stored, dry_run=dry_run)
        return self._object_response(request, target.spec, output, obj, answer, 200)

    async def _patch(self, request: web.Request, target: Target) -> web.StreamResponse:
        content_type = request.content_type
        if content_type not in _PATCH_TYPES:
            # PatchResource rejects unsupported patch types before anything else.
            raise status_error(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                + ", ".join(_PATCH_TYPES),
            )
        output = render.negotiate(request.headers.get("Accept", ""))
        query = request.query
        apply = content_type == "application/apply-patch+yaml"
        causes: list[tuple[str, str, str]] = []
        if apply and not query.get("fieldManager"):
            causes.append(
                (
                    "FieldValueRequired",
                    "fieldManager",
                    "Required value: is required for apply patch",
                )
            )
        if not apply and "force" in query:
            causes.append(
                (
                    "FieldValueForbidden",
                    "force",
                    "Forbidden: may not be specified for non-apply patch",
                )
            )
        if causes:
            raise invalid("meta.k8s.io", "PatchOptions", "", causes)
        dry_run = dry_run_requested(query, "PatchOptions")
        spec, key = target.spec, self._key(target)
        patch = await self._read_body(request)
        existing = self.store.get(spec, key)
        status = target.subresource == "status"
        if apply:
            raw_text = (await request.read()).decode(errors="replace")
            patch = self._check_object(spec, patch, raw_text, target.name)
            if existing is None and not status:
                # patcher.applyPatch: checkName after createNewObject — an apply that names no
                # object (a generateName is no name) does not create one.
                if not (patch.get("metadata") or {}).get("name"):
                    raise bad_request(
                        "the name of the object () does not match the name on the URL "
                        f"({target.name})"
                    )
                if self.fake.managed_fields:
                    patch.setdefault("metadata", {})["managedFields"] = track(
                        [], manager=query["fieldManager"], body=patch, apply=True
                    )
                obj, stored = self.store.create(spec, key[0], key[1], patch, dry_run=dry_run)
                obj, answer = self._answer(obj, stored, dry_run=dry_run)
                return self._object_response(request, target.spec, output, obj, answer, 201)
        if existing is None:
            raise not_found_error(spec.group, spec.plural, key[2])
        try:
            if content_type == "application/json-patch+json":
                patched = apply_json_patch(copy_json(existing.obj), patch)
            else:
                patched = apply_merge_patch(copy_json(existing.obj), patch)
        except PatchError as e:
            if e.malformed:
                raise bad_request(str(e)) from None
            # jsonPatcher.applyJSPatch: NewGenericServerResponse(422, ...) hides the cause.
            raise status_error(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request",
                details={},
            ) from None
        if not isinstance(patched, dict):
            raise bad_request("the patched object is not a JSON object")
        self._check_object(spec, patched, "", target.name)
        manager = query.get("fieldManager")
        if self.fake.managed_fields and manager and isinstance(patch, dict) and not status:
            patched.setdefault("metadata", {})["managedFields"] = track(
                (existing.obj.get("metadata") or {}).get("managedFields"),
                manager=manager,
                body=patch,
                apply=apply,
            )
        obj, stored = self.store.update(
            spec, key, patched, status=status, dry_run=dry_run, require_rv=False
        )
        obj, answer = self._answer(obj, stored, dry_run=dry_run)
        return self._object_response(request, target.spec, output, obj, answer, 200)

    async def _delete_options(self, request: web.Request) -> tuple[bool, str | None, str | None]:
        body = await self._read_body(request) if await request.read() else None
        if body is not None and not isinstance(body, dict):
            raise bad_request("DeleteOptions must be a JSON object")
        # Like the apiserver (handlers/delete.go): DeleteOptions come from the body when there
        # is one, and the query's DeleteOptions parameters are then ignored.
        dry_run = body is None and dry_run_requested(request.query, "DeleteOptions")
        options: JSON = body or {}
        if options.get("dryRun"):
            values = (
                options["dryRun"] if isinstance(options["dryRun"], list) else [options["dryRun"]]
            )
            dry_run = dry_run_requested(
                MultiDict(("dryRun", str(v)) for v in values), "DeleteOptions"
            )
        preconditions = options.get("preconditions") or {}
        return dry_run, preconditions.get("uid"), preconditions.get("resourceVersion")

    async def _delete(self, request: web.Request, target: Target) -> web.StreamResponse:
        output = render.negotiate(request.headers.get("Accept", ""))
        dry_run, uid, rv = await self._delete_options(request)
        obj, deleted = self.store.delete(
            target.spec,
            self._key(target),
            precondition_uid=uid,
            precondition_rv=rv,
            dry_run=dry_run,
        )
        if deleted and not self.fake.faults.foreign_answers:
            return web.Response(
                body=render.success_status(target.spec, obj), content_type="application/json"
            )
        obj, _ = self._answer(obj, None, dry_run=dry_run)  # a mix-up answers with an object
        return self._object_response(request, target.spec, output, obj, None, 200)

    async def _delete_collection(self, request: web.Request, target: Target) -> web.StreamResponse:
        dry_run, uid, rv = await self._delete_options(request)
        opts = parse_list_options(request.query, watch=False)
        assert target.cluster is not None
        page = self.store.list_page(
            target.spec,
            cluster=target.cluster,
            namespace=target.namespace,
            match=self._matcher(opts),
            at_rv=None,
            after=None,
            limit=0,
            count_remaining=False,
        )
        for stored in page.items:
            meta = stored.obj["metadata"]
            key: Key = (target.cluster, meta.get("namespace", ""), meta["name"])
            with contextlib.suppress(FakeApiError):
                self.store.delete(
                    target.spec, key, precondition_uid=uid, precondition_rv=rv, dry_run=dry_run
                )
        head, tail = render.list_frame(
            target.spec,
            Output(),
            render.list_meta(rv=page.rv, continue_token="", remaining=None, sort=True),
        )
        return web.Response(
            body=head + b",".join(s.raw for s in page.items) + tail, content_type="application/json"
        )


def _key_of(stored: StoredObject) -> Key:
    meta = stored.obj.get("metadata", {})
    cluster = (meta.get("annotations") or {}).get(CLUSTER_ANNOTATION, "")
    return (cluster, meta.get("namespace", ""), meta.get("name", ""))
