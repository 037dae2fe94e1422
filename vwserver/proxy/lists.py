"""Filtered LIST: paged upstream, streamed out, every item checked — kcp always asked with a
selector that names the slice.

What a slice sees is "matches the slice's selector (and no other slice that holds the object
is letting go of it), or held by the slice" (:func:`vwserver.holds.sees`). kcp can be asked for
both halves with label selectors, so a LIST is at most two selector-filtered upstream lists,
merged (:class:`_Stream`):

* **selected**: the slice's selector AND the client's ``labelSelector``;
* **held** (only for a slice that records holds): the slice's holder label
  (:func:`vwserver.holds.holder_label`, written with every hold) AND the client's requirements on
  the keys the slice's selector does not name (a leaving object is matched by the labels it had
  before it left, :func:`vwserver.holds.client_labels`; the whole client selector is applied
  here). An entry that also matches the *selected* query is that stream's, so each object is
  shown once.

Both are read at one resourceVersion (the held stream's first page with ``resourceVersionMatch=
Exact`` at the selected page's, later pages with continue tokens, which carry it) and merged in
kcp's key order — the bytes of ``<cluster>/<namespace>/<name>`` (kcp v0.32.3: its continue
tokens name ``/<cluster>/<namespace>/<name>`` on ``clusters/*``, and ``ns1-x`` sorts before
``ns1``). Every entry is checked again (membership, the client's selector, the request's scope).

One continue token serves both streams. kcp's continue token is ``{rv, start: <the key it
follows>}`` with no trace of the selector it was issued for: a token issued after entry K on
one stream resumes the other after K too (verified on kcp v0.32.3). So the token the client gets
is kcp's own, from right after the last entry the client got — never after an entry it did not
get, which would name an object the slice may not see — wrapped (for a slice that records holds)
with which streams go on (``vwlist/1``; a malformed one is the apiserver's 400). Where the page
ends inside an upstream page, that page is read again up to there (the same start, that count as
the limit: a continue token reads the snapshot it was issued at, a first page is read again at
its resourceVersion exactly) for kcp's token after it; kcp gives one whenever any key follows,
whatever the selector (etcd's ``hasMore``, verified: a ``limit=2`` list whose second match is
followed by a non-matching object carries a token, one whose second match is the last object
does not). A page is empty only at the end of the list.

Work is bounded: a client page (``limit``) costs the first page of each stream with the client's
limit, then — only when entries the slice does not see (an object another slice is letting go
of, a stray holder label) leave it short — further pages of at least ``listPageSize``; once the
page holds an entry, :data:`FILL_ROUNDS` reads in all plus the second stream's first page (then
a short page with a token, which the list contract allows), and the one re-read:
:data:`MAX_UPSTREAM_PAGES`.

A client that pages nothing costs kcp one LIST of the whole selection, as a direct call does:
every page is a LIST of its own for kcp, whose cost grows with the number of pages (at 100,000
objects, paging at 500 cost kcp 4 times its unpaged LIST). For a slice that records no holds
(one stream) in JSON, kcp is asked without a limit and its answer is checked and written as it
streams in (:func:`_serve_streamed`, :class:`~vwserver.proxy.filtering.ListSplitter`): batches
of :data:`~vwserver.proxy.filtering.STREAM_BATCH` bytes, split where msgspec finds an entry's
end, each entry decided from the fields the decision reads (labels matched once per distinct
set, the whole metadata of held objects only) — memory: a batch, whatever the list's size (the
socket's flow control holds back the rest). The list's fields are written where kcp put them
(an unstructured list's keys are sorted: ``items`` before ``kind`` and ``metadata``); the
resourceVersion is kcp's. Two streams to merge in key order (a slice that records holds), and
YAML, are served by paging each stream — ``listPageSize`` first (a fallback from the cache: what
holds the cached collection, :func:`first_page_size`), then pages that double, bounded in
objects and bytes (:func:`next_page_size`) — and writing the merged entries as they come
(memory: two pages per stream).

Items are forwarded as the bytes the upstream sent (when every entry of a batch is shown, the
batch's bytes as they came). If the upstream fails after the first bytes went out, the
connection is aborted rather than closed cleanly, so the client sees a broken response, never a
short list that looks complete; before that (a streamed list starts with its first entry), the
client gets the error Status.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress
from typing import Final

import aiohttp
import msgspec
from aiohttp import ClientResponse, web
from multidict import CIMultiDict

from vwserver import metrics as m
from vwserver.cache.views import NAMESPACE, FieldSelector, parse_field_selector
from vwserver.errors import BadGateway, BadRequest, UpstreamUnavailable
from vwserver.k8s.kcp import CLUSTER_ANNOTATION
from vwserver.k8s.types import ObjectMeta
from vwserver.proxy import yamlout
from vwserver.proxy.context import ProxyRequest
from vwserver.proxy.filtering import (
    LIST_FOOTER,
    Envelope,
    LabelMatcher,
    ListSplitter,
    Page,
    UndecodableError,
    decode_page,
    list_fields,
    list_header,
    streamed_closing,
    streamed_opening,
    strip_row_object,
)
from vwserver.proxy.responses import (
    prepare_list,
    read_body,
    relay_whole,
    response_headers,
)
from vwserver.proxy.yamlout import YAML_CONTENT_TYPE
from vwserver.selector import Selector

log = logging.getLogger(__name__)

FILL_ROUNDS: Final = 3
"""Upstream pages read at most for one client page once it holds an entry, the first page among
them (a second stream adds its own first page)."""
MAX_UPSTREAM_PAGES: Final = FILL_ROUNDS + 2
"""Upstream LISTs one client page of a slice that records holds costs at most, beyond pages of
objects the slice does not see before its first entry: the held stream's first page, the fill
rounds (the selected stream's first page among them), and one re-read of the beginning of the
upstream page the client's page ends in (for kcp's continue token after its last entry)."""

PAGE_BYTES: Final = 4 * 2**20
"""Bytes an upstream page of a LIST the proxy pages itself may grow to (at the bytes per object
of the page before): at most two pages per stream are held at once (one written, the next read)."""
MAX_PAGE: Final = 10_000
"""Objects per upstream page at most, however small they are (the decoded metadata of a page
is held too)."""

SELECTED: Final = "selected"
HELD: Final = "held"
_CONTINUE_VERSION: Final = "vwlist/1"
_AT: Final = ("resourceVersion", "resourceVersionMatch", "limit", "continue")


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a client's continue token resumes: after the entry kcp's ``token`` follows, in
    the ``streams`` that go on."""

    token: str
    streams: tuple[str, ...] = (SELECTED, HELD)


def encode_continue(token: str, streams: Sequence[str]) -> str:
    """The client's continue token: kcp's ``token`` and the streams that go on."""
    doc = {"v": _CONTINUE_VERSION, "c": token, "s": list(streams)}
    return base64.urlsafe_b64encode(msgspec.json.encode(doc)).decode().rstrip("=")


def decode_continue(text: str) -> Resume:
    """A continue token of :func:`encode_continue`'s, or kcp's own (both streams go on, kcp
    checks it); the apiserver's 400 for one of ours that is damaged."""
    try:
        doc = msgspec.json.decode(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        return Resume(text)
    if not isinstance(doc, dict) or doc.get("v") != _CONTINUE_VERSION:
        return Resume(text)
    token, streams = doc.get("c"), doc.get("s")
    if (
        not isinstance(token, str)
        or not token
        or not isinstance(streams, list)
        or not streams
        or any(s not in (SELECTED, HELD) for s in streams)
        or len(set(streams)) != len(streams)
    ):
        raise BadRequest("continue key is not valid: malformed")
    return Resume(token, tuple(s for s in (SELECTED, HELD) if s in streams))


@dataclass(frozen=True, slots=True)
class _Read:
    """One upstream page the proxy read, and the continue token it was read with ("": a
    stream's first page, read at ``page.resource_version``)."""

    page: Page
    start: str


def _labels(meta: ObjectMeta | None) -> dict[str, str] | None:
    return meta.labels if meta is not None else None


def _key(meta: ObjectMeta | None, previous: str) -> str:
    """An entry's place in kcp's order: ``<cluster>/<namespace>/<name>``, compared as bytes
    (etcd's key order); an entry without metadata (never shown) goes with the one before it."""
    if meta is None:
        return previous
    cluster = (meta.annotations or {}).get(CLUSTER_ANNOTATION, "")
    return f"{cluster}/{meta.namespace}/{meta.name}" if meta.namespace else f"{cluster}/{meta.name}"


@dataclass(slots=True)
class _Stream:
    """One selector-filtered upstream list being read: its current page, how far it was
    consumed, and which of its entries the client gets."""

    kind: str
    later: list[tuple[str, str]]
    """The query of its later pages, without resourceVersion(Match), limit and continue."""
    read: _Read
    shown_index: list[int] = field(default_factory=list)
    shown: list[bytes | msgspec.Raw] = field(default_factory=list)
    keys: list[str] | None = None
    pos: int = 0
    reads: int = 1
    following: asyncio.Future[Page] | None = None

    @property
    def page(self) -> Page:
        return self.read.page

    @property
    def exhausted(self) -> bool:
        """Every entry of the current page is consumed."""
        return self.pos >= len(self.read.page.entries)

    @property
    def more(self) -> bool:
        """kcp has a page after the current one."""
        return bool(self.read.page.continue_token)

    @property
    def goes_on(self) -> bool:
        """Something the client may get is still ahead (on this page, or maybe after it)."""
        return self.more or (bool(self.shown_index) and self.shown_index[-1] >= self.pos)

    def key(self, index: int) -> str:
        if self.keys is None:
            keys: list[str] = []
            previous = ""
            for meta in self.read.page.metas:
                previous = _key(meta, previous)
                keys.append(previous)
            self.keys = keys
        return self.keys[index]

    def take(
        self, end: int, *, at_most: int | None = None
    ) -> tuple[list[bytes | msgspec.Raw], int]:
        """The shown entries among the next ones up to ``end`` (at most ``at_most`` of them:
        the run then ends after the last one), consumed; and the index of the last one (-1:
        none)."""
        lo = bisect.bisect_left(self.shown_index, self.pos)
        hi = bisect.bisect_left(self.shown_index, end)
        if at_most is not None and hi - lo > at_most:
            hi = lo + at_most
            end = self.shown_index[hi - 1] + 1
        self.pos = end
        if hi == lo:
            return [], -1
        return self.shown[lo:hi], self.shown_index[hi - 1]


class _Lister:
    """The streams of one LIST request and how their pages are read and shown."""

    def __init__(
        self, ctx: ProxyRequest, url: str, headers: CIMultiDict[str], *, client: Selector
    ) -> None:
        self.ctx = ctx
        self.url = url
        self.headers = headers
        self.client = client
        self.selected = ctx.effective_selector()

    def stream(self, kind: str, later: list[tuple[str, str]], read: _Read) -> _Stream:
        st = _Stream(kind=kind, later=later, read=read)
        self.load(st, read)
        return st

    def load(self, st: _Stream, read: _Read) -> None:
        """Make ``read`` the stream's current page: which entries the client gets — what the
        slice sees and the client's selector takes; of the held stream only those the selected
        stream does not have."""
        page = read.page
        member = self.ctx.member
        st.read, st.pos, st.keys = read, 0, None
        if not self.ctx.records_holds and st.kind != HELD:
            # A slice that records no holds sees an object by its selector (and the holds of
            # others): the plain check, as for a watch kcp answers — decided for the whole
            # page at once, the entries taken by the mask without a tuple per entry.
            mask = page.shown_mask(self.selected, member)
            st.shown_index = list(compress(range(len(mask)), mask))
            st.shown = list(compress(page.entries, mask))
            return
        if self.ctx.records_holds:
            shown = page.indexed_members(member, self.client)
        else:
            shown = page.indexed_visible(self.selected, member)
        if st.kind == HELD:
            metas, selected = page.metas, self.selected.matches
            shown = [(i, e) for i, e in shown if not selected(_labels(metas[i]))]
        st.shown_index = [i for i, _ in shown]
        st.shown = [e for _, e in shown]

    async def advance(self, st: _Stream, *, size: int) -> None:
        """The stream's next page (``size`` entries at most)."""
        start = st.page.continue_token
        asked = [*st.later, ("limit", str(size)), ("continue", start)]
        self.load(st, _Read(await _fetch(self.ctx, self.url, asked, self.headers), start))
        st.reads += 1

    async def token_after(self, st: _Stream, index: int) -> str:
        """kcp's continue token right after entry ``index`` of ``st``'s current page: the
        page's own when it is its last entry, else that page read again up to it — a continue
        token reads the snapshot it was issued at, a first page is read again at its
        resourceVersion exactly — and checked to be the same, else the token would skip or
        repeat entries, and the request fails."""
        read = st.read
        count = index + 1
        if count == len(read.page.entries) and read.page.continue_token:
            return read.page.continue_token
        if read.start:
            at = [("continue", read.start)]
        else:
            at = [
                ("resourceVersion", read.page.resource_version),
                ("resourceVersionMatch", "Exact"),
            ]
        asked = [*st.later, ("limit", str(count)), *at]
        again = await _fetch(self.ctx, self.url, asked, self.headers)
        if (
            len(again.entries) != count
            or not again.continue_token
            or _identity(again, count - 1) != _identity(read.page, count - 1)
        ):
            raise BadGateway("upstream answered a list page differently when it was read again")
        return again.continue_token


def _next_run(streams: Sequence[_Stream]) -> tuple[_Stream, int] | None:
    """The stream whose next entry comes first in kcp's order, and where its run ends: before
    its first entry after the other streams' next ones (None: every page is consumed)."""
    live = [st for st in streams if not st.exhausted]
    if not live:
        return None
    if len(live) == 1:
        return live[0], len(live[0].page.entries)
    first = min(live, key=lambda st: st.key(st.pos))
    bound = min(st.key(st.pos) for st in live if st is not first)
    assert first.keys is not None
    return first, bisect.bisect_right(first.keys, bound, lo=first.pos)


async def serve_list(ctx: ProxyRequest) -> web.StreamResponse:
    ctx.effective_selector()  # 400 for a malformed labelSelector, before kcp is asked
    client = ctx.client_selector()
    headers = ctx.upstream_headers()
    options = ctx.options
    token = options.get("continue") or ""
    resume = decode_continue(token) if token else None
    rv = options.get("resourceVersion")
    match = options.get("resourceVersionMatch")
    limit = int(options.get("limit") or 0)
    if rv == "0" and match != "Exact" and not resume:
        limit = 0  # the apiserver ignores a limit at resourceVersion=0: the whole list
    if not limit and not ctx.records_holds and not ctx.representation.yaml:
        return await _serve_streamed(ctx, headers, resume=resume)
    extra: list[tuple[str, str]] = []
    if not limit:
        extra.append(("limit", str(ctx.page_size)))
        if rv not in (None, "", "0") and not match:
            # resourceVersion=N without a limit means "not older than N"; with the limit the
            # proxy adds it would mean "exactly N" (the apiserver's legacy paging rule): an
            # informer relisting at N after a 410 would get its old state again, and its
            # watch from N another 410, for as long as etcd keeps N.
            extra.append(("resourceVersionMatch", "NotOlderThan"))
    query = ctx.upstream_query(extra=extra, drop=("continue",) if limit else ("continue", "limit"))
    if resume is not None:
        query.append(("continue", resume.token))
    kinds = [
        kind
        for kind in (SELECTED, HELD)
        if (kind == SELECTED or ctx.records_holds) and (resume is None or kind in resume.streams)
    ] or [SELECTED]  # a slice that records no holds has no held stream to resume
    held = ctx.held_selector().render() if HELD in kinds else ""
    first = await _first_page(ctx, _relabel(query, held) if kinds[0] == HELD else query, headers)
    if isinstance(first, web.Response):
        return first
    url, asked, page, response = first
    lister = _Lister(ctx, url, headers, client=client)
    plain = [(k, v) for k, v in asked if k not in _AT]
    start = resume.token if resume is not None else ""
    streams = [lister.stream(kinds[0], plain, _Read(page, start))]
    if len(kinds) == 2:
        # The held stream at the same resourceVersion: by the same continue token, or its
        # first page at the selected page's resourceVersion exactly.
        at = [(k, v) for k, v in asked if k in ("limit", "continue")]
        if resume is None:
            at += [("resourceVersion", page.resource_version), ("resourceVersionMatch", "Exact")]
        later = _relabel(plain, held)
        second = await _fetch(ctx, url, [*later, *at], headers)
        streams.append(lister.stream(HELD, later, _Read(second, start)))
    token = ""
    filled: list[bytes | msgspec.Raw] | None = None
    if limit:
        filled, token = await _fill(lister, streams, limit=limit, two=ctx.records_holds)
    writer = _ListWriter(
        page,
        continue_token=token,
        yaml=ctx.representation.yaml,
        strip_objects=ctx.strip_objects,
    )
    if ctx.representation.yaml:
        response.headers["Content-Type"] = YAML_CONTENT_TYPE
    if not await prepare_list(ctx.request, response):
        return response
    try:
        if filled is not None:
            chunk = writer.entries(filled)
            if chunk:
                await response.write(chunk)
        else:
            await _stream_all(lister, streams, response, writer)
    except (BadGateway, UpstreamUnavailable, UndecodableError) as e:
        # Caught here, not in the handler: count it as the upstream error it is.
        kind = m.UNREACHABLE if isinstance(e, UpstreamUnavailable) else m.BAD_GATEWAY
        ctx.metrics.upstream_errors.labels(kind).inc()
        log.warning("list of %s aborted mid-stream: %s", ctx.api.resource, e)
        _abort(ctx.request)
        return response
    await response.write_eof(writer.end())  # the list's end and the chunked end: one write
    return response


async def _serve_streamed(
    ctx: ProxyRequest, headers: CIMultiDict[str], *, resume: Resume | None
) -> web.StreamResponse:
    """An unpaged LIST of a slice that records no holds, in JSON: one upstream request
    without a limit — kcp's cost of the whole list once, not once per page — whose answer is
    checked and written batch by batch as it arrives (:class:`ListSplitter`: what the proxy
    holds is a batch, the socket's flow control holds back the rest). kcp pages no answer it
    was not asked to; if the upstream does, its continue tokens are followed the same way.
    The response starts with its first bytes: an upstream failure before then is the
    client's error Status, after it the connection is aborted."""
    query = ctx.upstream_query(drop=("continue", "limit"))
    if resume is not None:  # the rest of a list, from the client's continue token
        query.append(("continue", resume.token))
    selected, member = ctx.effective_selector(), ctx.member
    matcher = LabelMatcher(selected)
    response: web.StreamResponse | None = None
    writer: _ListWriter | None = None
    head: Envelope | None = None
    prepared = False
    url, asked = ctx.upstream_url, query
    token = ""
    try:
        while True:
            opened = (
                _opened(ctx, query, headers)
                if response is None
                else _later(ctx, url, asked, headers, token=token)
            )
            async with opened as (url, asked, up):
                if up.status != 200:
                    if response is None:
                        return await relay_whole(up)
                    raise BadGateway(f"upstream answered {up.status} for a later list page")
                if response is None:
                    response = _StreamedList(status=200, headers=response_headers(up))
                splitter = ListSplitter(table=ctx.table, scope=ctx.scope)
                content = up.content
                shown: Sequence[bytes | msgspec.Raw | memoryview]
                while True:
                    try:
                        chunk = await content.readany()
                    except aiohttp.ClientPayloadError as e:
                        raise BadGateway(f"upstream list answer broke off: {e}") from e
                    batch = splitter.feed(chunk) if chunk else splitter.rest()
                    if batch is not None:
                        shown, outside = batch.visible(matcher, member)
                    elif chunk:
                        continue
                    else:
                        page = splitter.finish()
                        shown = page.visible(selected, member)
                        outside = page.out_of_scope
                    ctx.out_of_scope(outside)
                    if writer is None:
                        head = splitter.head
                        assert head is not None
                        writer = _ListWriter.framed(
                            streamed_opening(head, table=ctx.table),
                            strip_objects=ctx.strip_objects,
                        )
                    data = writer.entries(shown)
                    if data:
                        if not prepared:
                            prepared = True
                            if not await prepare_list(ctx.request, response):
                                return response
                        await response.write(data)
                    if not chunk and batch is None:
                        break
            token = page.continue_token
            if not token:
                break
    except (BadGateway, UpstreamUnavailable, UndecodableError) as e:
        if not prepared:  # nothing went out: the client gets the error
            if isinstance(e, UndecodableError):
                raise BadGateway(f"upstream sent an undecodable list: {e}") from e
            raise
        kind = m.UNREACHABLE if isinstance(e, UpstreamUnavailable) else m.BAD_GATEWAY
        ctx.metrics.upstream_errors.labels(kind).inc()
        log.warning("list of %s aborted mid-stream: %s", ctx.api.resource, e)
        _abort(ctx.request)
        assert response is not None
        return response
    assert response is not None
    assert writer is not None
    assert head is not None
    if not prepared and not await prepare_list(ctx.request, response):
        return response
    await response.write_eof(writer.end(streamed_closing(head, page)))
    return response


class _StreamedList(web.StreamResponse):
    """A streamed list response whose headers go out with its first bytes (one write, not
    two; aiohttp's own ``web.Response`` does so)."""

    _send_headers_immediately = False


@contextlib.asynccontextmanager
async def _later(
    ctx: ProxyRequest,
    url: str,
    query: list[tuple[str, str]],
    headers: CIMultiDict[str],
    *,
    token: str,
) -> AsyncIterator[tuple[str, list[tuple[str, str]], ClientResponse]]:
    """The request of a list after the one asked with ``query``, from continue token
    ``token``, as :func:`_opened` yields the first."""
    asked = [*((k, v) for k, v in query if k != "continue"), ("continue", token)]
    async with ctx.upstream.request("GET", url, query=asked, headers=headers) as up:
        yield url, asked, up


def _relabel(query: list[tuple[str, str]], labels: str) -> list[tuple[str, str]]:
    """``query`` asking with label selector ``labels`` instead of its own."""
    return [*((k, v) for k, v in query if k != "labelSelector"), ("labelSelector", labels)]


async def _fill(
    lister: _Lister, streams: list[_Stream], *, limit: int, two: bool
) -> tuple[list[bytes | msgspec.Raw], str]:
    """Up to ``limit`` entries the client gets, merged from ``streams`` (their first pages read
    with the client's limit) and the pages after them — at most :data:`FILL_ROUNDS` more reads
    once the page holds an entry (else until it does, or the lists end) — and the continue
    token after the last of them (empty when nothing the client may get follows; for a slice
    that records holds (``two``), wrapped with the streams that go on)."""
    ctx = lister.ctx
    visible: list[bytes | msgspec.Raw] = []
    last: tuple[_Stream, int] | None = None
    budget = len(streams) + FILL_ROUNDS - 1
    while len(visible) < limit:
        waiting = [st for st in streams if st.exhausted and st.more]
        if waiting and visible and sum(st.reads for st in streams) >= budget:
            break  # enough work for this page: the client asks for the next one
        for st in waiting:
            while st.exhausted and st.more:
                await lister.advance(st, size=max(limit - len(visible), ctx.page_size))
        run = _next_run(streams)
        if run is None:
            break
        st, end = run
        taken, index = st.take(end, at_most=limit - len(visible))
        if taken:
            visible += taken
            last = (st, index)
    going = [st.kind for st in streams if st.goes_on]
    if not going:
        return visible, ""  # the lists ended, and all the client gets of them is here
    assert last is not None, "the loop ends early only once the client's page holds entries"
    token = await lister.token_after(*last)
    return visible, encode_continue(token, going) if two else token


async def _stream_all(
    lister: _Lister, streams: list[_Stream], response: web.StreamResponse, writer: _ListWriter
) -> None:
    """Every entry the client gets, merged from ``streams`` page by page (``listPageSize``
    first, then growing: :func:`next_page_size`) and written as it comes; each stream's next
    page is read while the proxy filters and writes the current one (at most two pages per
    stream are held)."""
    ctx = lister.ctx
    sizes = {st.kind: ctx.page_size for st in streams}

    async def prefetch(st: _Stream) -> None:
        if st.more:
            size = sizes[st.kind] = next_page_size(sizes[st.kind], st.page, floor=ctx.page_size)
            asked = [*st.later, ("limit", str(size)), ("continue", st.page.continue_token)]
            st.following = asyncio.ensure_future(_fetch(ctx, lister.url, asked, lister.headers))
            # A task runs only once this coroutine waits, and filtering and writing a page may
            # not wait at all (the client's socket takes it): let it send its request now, or
            # the upstream would start on the next page only after this one.
            await asyncio.sleep(0)

    out: list[bytes] = []
    try:
        for st in streams:
            await prefetch(st)
        while True:
            for st in streams:
                while st.exhausted and st.following is not None:
                    if out:
                        await response.write(b"".join(out))
                        out.clear()
                    start = st.page.continue_token
                    page, st.following = await st.following, None
                    lister.load(st, _Read(page, start))
                    await prefetch(st)
            run = _next_run(streams)
            if run is None:
                break
            st, end = run
            taken, _ = st.take(end)
            if taken:
                out.append(writer.entries(taken))
        if out:
            await response.write(b"".join(out))
    finally:
        for st in streams:
            if st.following is not None:
                st.following.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await st.following


async def serve_apibindings_list(ctx: ProxyRequest) -> web.StreamResponse:
    """A LIST of apibindings, which are no slice's (:attr:`ProxyRequest.membership`): one
    upstream request with the client's own query (its paging and selectors), every binding
    outside the request's scope left out and counted (:func:`_decode`). A workspace has few
    bindings; the page is read whole, as every upstream page is."""
    async with ctx.upstream.request(
        "GET",
        ctx.upstream_url,
        query=ctx.upstream_query(push_selector=False),
        headers=ctx.upstream_headers(),
    ) as up:
        if up.status != 200:
            return await relay_whole(up)
        headers = response_headers(up)
        page = _decode(ctx, await read_body(up))
    writer = _ListWriter(
        page,
        continue_token=page.continue_token,
        yaml=ctx.representation.yaml,
        strip_objects=ctx.strip_objects,
    )
    if ctx.representation.yaml:
        headers["Content-Type"] = YAML_CONTENT_TYPE
    return web.Response(status=200, body=writer.entries(page.entries, last=True), headers=headers)


def first_page_size(objects: int, raw_bytes: int, *, floor: int) -> int:
    """The first upstream page of a LIST the proxy pages itself when the shared cache knows the
    collection (``objects`` of ``raw_bytes`` in all, every logical cluster; a consistent read
    it could not prove, :class:`~vwserver.proxy.cached.Fallback`): what holds the whole
    collection, within the same bounds as :func:`next_page_size` (:data:`MAX_PAGE`,
    :data:`PAGE_BYTES` at the cache's bytes per object) and never below ``floor``.

    Why: doubling from ``listPageSize`` (500) is 5 pages for 5,000 objects; each is a LIST of its
    own for kcp — measured at 10,000 selected objects on a busy kcp, 2.05 times the direct
    LIST's time and 2.5 times its CPU, against 1.08 and 0.83 with one page (docs/cache.md).
    Asking for more than there is costs nothing: kcp answers what matches."""
    if objects <= 0:
        return floor
    per_object = max(raw_bytes // objects, 1)
    return max(floor, min(objects + 1, MAX_PAGE, max(1, PAGE_BYTES // per_object)))


def next_page_size(asked: int, page: Page, *, floor: int) -> int:
    """The limit of the next upstream page of a LIST the proxy pages itself, after ``page``
    (read with limit ``asked``): twice ``asked``, at most what fits :data:`PAGE_BYTES` at
    ``page``'s bytes per object and :data:`MAX_PAGE`, never below ``floor`` (``listPageSize``,
    the first page's).

    Why grow: every page is a LIST of its own for kcp, and many small pages multiply its cost
    (at 100,000 objects, paging at 500 cost kcp 4 times its unpaged LIST; at 10,000 objects,
    5,000 selected, two quick runs on a loaded 2-core machine gave 1.05 to 1.98 times at 500
    and 0.84 to 1.14 times at 1,000 to 5,000). Doubling keeps the first answer quick and the
    upstream's next page overlapping the proxy's work on this one, while the number of pages
    grows with the logarithm of the list (5,000 objects: 4 pages instead of 10; 50,000: 9
    instead of 100); the byte bound keeps memory at two pages of a few MiB whatever the object
    count."""
    received = len(page.entries) + page.out_of_scope
    grown = min(2 * asked, MAX_PAGE)
    if received:
        grown = min(grown, max(1, PAGE_BYTES * received // max(page.size, 1)))
    return max(grown, floor)


class _ListWriter:
    """Writes one list response from the first page's envelope and each page's visible entries:
    JSON with the entries' original bytes, or YAML (keys sorted, entries converted one by
    one), with Table rows' objects removed for ``includeObject=None``."""

    def __init__(
        self, first: Page, *, continue_token: str, yaml: bool, strip_objects: bool
    ) -> None:
        self._first = True
        self._yaml = yaml
        self._strip = strip_objects
        if not yaml:
            self._head = list_header(
                first, resource_version=first.resource_version, continue_token=continue_token
            )
            self._tail = LIST_FOOTER
            return
        fields = list_fields(
            first, resource_version=first.resource_version, continue_token=continue_token
        )
        key = "rows" if first.is_table else "items"
        self._head, self._tail = yamlout.list_parts(fields, entries_key=key)
        self._empty = yamlout.empty_list_parts(fields, entries_key=key)

    @classmethod
    def framed(cls, opening: bytes, *, strip_objects: bool) -> _ListWriter:
        """A JSON writer whose opening is ``opening`` and whose end is given to :meth:`end`
        (a list written as its upstream answer streams in: :func:`streamed_opening`)."""
        writer = cls.__new__(cls)
        writer._first, writer._yaml, writer._strip = True, False, strip_objects
        writer._head, writer._tail = opening, LIST_FOOTER
        return writer

    def entries(
        self, visible: Sequence[bytes | msgspec.Raw | memoryview], *, last: bool = False
    ) -> bytes:
        """The bytes of ``visible`` in the response (after the opening, for the first entries),
        and with ``last`` the list's end after them — copied once, in one join. An element may
        be a run of entries already joined with ``,`` (:meth:`~vwserver.proxy.filtering.Batch.
        visible`)."""
        if not visible:
            return self.end() if last else b""
        parts: list[bytes | msgspec.Raw | memoryview] = (
            [strip_row_object(r) for r in visible] if self._strip else list(visible)
        )
        if self._yaml:
            parts = [yamlout.entry(r) for r in parts]
            if self._first:
                parts.insert(0, self._head)
            if last:
                parts.append(self._tail)
            self._first = False
            return b"".join(parts)
        # Joined with "," in one pass: the opening (or the separator from the page before)
        # goes before the first entry, the end after the last.
        before = self._head if self._first else b","
        if len(parts) == 1 and not last:
            self._first = False
            return b"".join((before, parts[0]))
        parts[0] = b"".join((before, parts[0]))
        if last:
            parts[-1] = b"".join((parts[-1], self._tail))
        self._first = False
        return b",".join(parts)

    def end(self, tail: bytes | None = None) -> bytes:
        """The list's end (``tail``: instead of the one it was made with)."""
        tail = self._tail if tail is None else tail
        if self._first:  # no entry at all
            return self._empty if self._yaml else self._head + tail
        return tail


def _identity(page: Page, index: int) -> tuple[str, ...] | bytes:
    """What identifies entry ``index`` of ``page``: its object's uid, resourceVersion, namespace
    and name (the bytes of a Table row without an object)."""
    meta = page.metas[index]
    if meta is None:
        return bytes(page.entries[index])
    return (meta.uid, meta.resourceVersion, meta.namespace, meta.name)


async def _first_page(
    ctx: ProxyRequest, query: list[tuple[str, str]], headers: CIMultiDict[str]
) -> tuple[str, list[tuple[str, str]], Page, web.StreamResponse] | web.Response:
    """The first upstream page, with the URL and query it was read with (the later pages'),
    and the response to stream it in; or the upstream's error, relayed.

    A LIST of every namespace whose field selector names one namespace is asked as a LIST of
    that namespace (:func:`single_namespace`): kcp's first page of the former carries a
    continue token relative to the namespace, which kcp then reads as relative to the whole
    collection — the next page starts over (kcp v0.32.3, on the APIExport virtual workspace and
    on a workspace alike). The apiserver narrows such a list to the namespace itself
    (``genericregistry.Store.ListPredicate``), so the answers are the same; a resource that has
    no namespaced collection (404: cluster-scoped) is asked as the client asked."""
    async with _opened(ctx, query, headers) as (url, asked, up):
        if up.status != 200:
            return await relay_whole(up)
        page = _decode(ctx, await read_body(up))
        return url, asked, page, web.StreamResponse(status=200, headers=response_headers(up))


@contextlib.asynccontextmanager
async def _opened(
    ctx: ProxyRequest, query: list[tuple[str, str]], headers: CIMultiDict[str]
) -> AsyncIterator[tuple[str, list[tuple[str, str]], ClientResponse]]:
    """The upstream's answer to a LIST's first request, and the URL and query it was asked
    with — of the namespace a field selector names, if the upstream has such a collection
    (:func:`_first_page`)."""
    targets = [(ctx.upstream_url, query)]
    narrowed = single_namespace(ctx.options.get("fieldSelector") or "")
    if narrowed is not None and not ctx.api.namespace and ctx.path.cluster != "*":
        namespace, rest = narrowed
        api = replace(ctx.api, namespace=namespace)
        fields = [("fieldSelector", rest)] if rest else []
        plain = [(k, v) for k, v in query if k != "fieldSelector"]
        targets.insert(0, (f"{ctx.cluster_base}{api.path}", [*plain, *fields]))
    for attempt, (url, asked) in enumerate(targets, start=1):
        async with ctx.upstream.request("GET", url, query=asked, headers=headers) as up:
            if up.status == 404 and attempt < len(targets):
                continue
            yield url, asked, up
            return
    raise AssertionError("the last target's answer is yielded")


_NAMESPACE_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def single_namespace(fields: str) -> tuple[str, str] | None:
    """The one namespace a field selector requires (``metadata.namespace=X`` or ``==X``, X a
    valid namespace name, once), and the selector's other terms; None if it requires none, or
    if kcp refuses the selector (it words that refusal). Read by the one field-selector parser
    (:func:`vwserver.cache.views.parse_field_selector`), with kcp's semantics: terms are not
    trimmed — kcp v0.32.3 answers ``" metadata.namespace = ns1 "`` with 400 "field label not
    supported:  metadata.namespace " and ``metadata.namespace= ns1`` with the objects of
    namespace " ns1" (none)."""
    try:
        parsed = parse_field_selector(fields)
    except BadRequest:
        return None
    pins = [r for r in parsed.requirements if r.field == NAMESPACE and r.equals]
    if len(pins) != 1 or not _NAMESPACE_NAME.fullmatch(pins[0].value):
        return None
    rest = FieldSelector(tuple(r for r in parsed.requirements if r is not pins[0]))
    return pins[0].value, rest.render()


async def _fetch(
    ctx: ProxyRequest, url: str, query: list[tuple[str, str]], headers: CIMultiDict[str]
) -> Page:
    async with ctx.upstream.request("GET", url, query=query, headers=headers) as up:
        if up.status != 200:
            # e.g. 410 when the snapshot expired mid-list: the client must relist.
            raise BadGateway(f"upstream answered {up.status} for a later list page")
        return _decode(ctx, await read_body(up))


def _decode(ctx: ProxyRequest, body: bytes) -> Page:
    """One upstream page, decoded as the shape the request negotiated, without the entries
    outside the request's scope (counted)."""
    try:
        page = decode_page(body, table=ctx.table, scope=ctx.scope)
    except UndecodableError as e:
        raise BadGateway(f"upstream sent an undecodable list: {e}") from e
    ctx.out_of_scope(page.out_of_scope)
    return page


def _abort(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()
