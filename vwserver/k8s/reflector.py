"""The one list+watch loop of vwserver: a collection, mirrored into a handler, forever.

client-go's reflector, reduced to what vwserver's loops need; every loop that follows objects in
kcp or a downstream cluster runs one (the slice controller, the syncer, through
:class:`~vwserver.k8s.cache.Cache` where a loop keeps the objects):

* **Paged list.** The collection is listed in pages of ``page_size`` (``limit``/``continue``:
  every page is served from the first page's snapshot, so the result is consistent at its
  resourceVersion) and handed over whole: :meth:`ReflectorHandler.on_list`.
* **Watch with resume.** Then it is watched from the list's resourceVersion. Every event — and
  every BOOKMARK, asked for with ``allowWatchBookmarks`` — advances :attr:`Reflector.
  resource_version`; when a watch ends (the server's ``timeoutSeconds``, a dropped connection, an
  error) the next one resumes from there: no event is lost, none is replayed.
* **410 Gone.** The resourceVersion fell out of the server's history (etcd compaction, a
  restarted watch cache): relist at once (after a list that was itself Gone: with backoff).
* **Backoff with jitter.** Any other failure (unreachable, 5xx, 403 while RBAC settles, garbage
  on the stream) waits :class:`~vwserver.k8s.backoff.Backoff` on the injected
  :class:`~vwserver.clock.Clock`, and is kept in :attr:`Reflector.last_error` for ``/readyz`` and
  logs — never swallowed, and logged as a warning once when it begins (or changes kind), not at
  every retry. A watch that ends early (before half its timeout) without a single event (not
  even a bookmark) also backs off: a server that closes every watch at once must not make
  this spin.
* **Idle timeout.** Each watch asks for ``timeoutSeconds`` drawn from ``[watch_timeout,
  2*watch_timeout)`` (so that many clients do not re-watch together, as client-go does), and
  gives up on a stream that sends nothing for ``silence_limit`` seconds (or ``idle_grace``
  seconds past its timeout, if that comes first): a silently dead connection would otherwise
  block the loop forever. kube-apiserver's and kcp's watch caches send a bookmark about once a
  minute to a watch that allows them, so the default 150 s of silence means the connection is
  gone (after about 2.5 minutes rather than the 6 to 11 that the timeout alone would take). A
  silent stream is not an error: the next watch starts at once from the same resourceVersion,
  and only if *it* gets no answer (:data:`~vwserver.k8s.client.WATCH_ANSWER_WITHIN`) is the
  upstream unreachable. A server that sends no bookmarks and has nothing to say thus costs one
  new watch per silence limit, nothing more.
* **Progress on demand** (:mod:`vwserver.k8s.progress`). A reader that found the server ahead
  of the stream calls :meth:`~_ListWatch.want_progress`: for the next minute the loop's watches
  ask for ``timeoutSeconds=3``, which kcp's watch cache answers with a BOOKMARK 1-2 s in (at
  the shard's revision as of the last consistent read); a long watch running then is cut and
  resumed from :attr:`~_ListWatch.resource_version`. A watch cut between two events loses
  nothing: each event is handed over and its resourceVersion kept before the next is read, and
  the next watch replays from there whatever the cut one had not delivered. A watch that
  delivers nothing but lasted half its timeout (a short one on a quiet resource) is watched
  again at once, without backoff.
* **Synced.** :attr:`Reflector.synced` is set after the first complete list.

Handlers are synchronous and must be quick (record, enqueue). A DELETED event of a label-selector
watch carries the object's *previous* content when it stopped matching (observed on kcp,
tests/e2e/test_kcp_testbed.py).

**Raw mode** (:class:`RawReflector`): the same loop, but objects are never decoded into dicts.
List pages and watch events are read as bytes, each object handed to the caller's ``decode``
exactly once (the shared watch cache keeps an object's original bytes plus its metadata, decoded
in one pass); what ``decode`` returns is what the handler gets. An object ``decode`` refuses is
garbage on the stream: an error, retried with backoff like any other.

**Table mode** (``RawReflector(table=True)``): the collection is listed and watched as
``meta.k8s.io/v1`` Tables with ``includeObject=Object`` — the server's printed columns with the
object in every row — and ``decode`` gets each *row*. A Table list carries the column
definitions (kept in :attr:`RawReflector.columns`), and so does the first event of every Table
watch. A watch whose column definitions differ from the list's means the server's printer
columns changed (a new schema): the rows held were printed with the old ones, so the loop
relists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Final, Generic, Protocol, TypedDict, TypeVar, Unpack

import msgspec

from vwserver.clock import Clock
from vwserver.errors import ApiError, ApiGone, UpstreamUnavailable, WatchSilent, api_error
from vwserver.k8s import progress
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.types import ListPage, ObjectHead, TablePage

log = logging.getLogger(__name__)

#: Seconds a watch stream may send nothing before it is presumed dead (module docstring).
SILENCE_LIMIT = 150.0


class ReflectorHandler(Protocol):
    def on_list(self, items: list[JSON], resource_version: str) -> None:
        """The whole collection at ``resource_version``: after the first list and every relist
        (objects missing from it are gone)."""
        ...

    def on_event(self, kind: str, obj: JSON) -> None:
        """One change after that: ``kind`` is ADDED, MODIFIED or DELETED."""
        ...

    def on_bookmark(self, resource_version: str) -> None:
        """Nothing changed up to ``resource_version`` (a watch BOOKMARK)."""
        ...


H = TypeVar("H", bound=ReflectorHandler)


class Admission(Protocol):
    """What a :class:`Reflector` keeps of each object, decided as soon as it is decoded — before
    the rest of a list is read — so that what a caller does not want to hold (an object over a
    size bound) is never held for longer than its own decoding."""

    def begin_list(self) -> None:
        """A list starts: what it admits replaces everything admitted before."""
        ...

    def admit(self, kind: str, obj: JSON) -> JSON:
        """What to keep of ``obj`` (``kind``: LISTED, ADDED, MODIFIED or DELETED)."""
        ...


def resource_version(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class LoopOptions(TypedDict, total=False):
    """How a list+watch loop pages, watches and retries; every key has a default."""

    label_selector: str | None
    field_selector: str | None
    page_size: int  # default 500
    watch_timeout: int  # default 300 (each watch asks for a random value in [t, 2t))
    idle_grace: float  # default 60: a silent stream is dead this long after its timeout
    silence_limit: float  # default 150: ... or after this long without a byte, if sooner
    backoff: Backoff | None
    on_restart: Callable[[str], None] | None
    rand: Callable[[], float]


class _ListWatch:
    """The loop both modes share: list, watch, resume, relist on 410, back off on failure.
    Subclasses read the collection (:meth:`_list`) and one watch (:meth:`_watch`)."""

    def __init__(
        self,
        *,
        name: str,
        client: KubeClient,
        url: str,
        clock: Clock,
        **options: Unpack[LoopOptions],
    ) -> None:
        label_selector = options.get("label_selector")
        field_selector = options.get("field_selector")
        page_size = options.get("page_size", 500)
        watch_timeout = options.get("watch_timeout", 300)
        idle_grace = options.get("idle_grace", 60.0)
        silence_limit = options.get("silence_limit", SILENCE_LIMIT)
        backoff = options.get("backoff")
        on_restart = options.get("on_restart")
        rand = options.get("rand", random.random)
        self.name = name
        self.url = url
        self.resource_version = ""
        """Where the next watch resumes; empty: list first."""
        self.synced = asyncio.Event()
        self.last_error: str | None = None
        self._client = client
        self._clock = clock
        selectors = (("labelSelector", label_selector), ("fieldSelector", field_selector))
        self._selectors = [(param, value) for param, value in selectors if value]
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._idle_grace = idle_grace
        self._silence_limit = silence_limit
        self._backoff = backoff or Backoff()
        self._on_restart = on_restart or (lambda cause: None)
        """Told ``"gone"`` or ``"error"`` whenever the loop starts over (for metrics)."""
        self._rand = rand
        self._failing: str | None = None  # the kind of failure last logged as a warning
        self._progress_until = progress.NEVER
        """Until when (monotonic) watches are short: a reader wants progress (want_progress)."""
        self._timeout = 0
        """The running (or last) watch's timeoutSeconds."""
        self._watch_ends: float | None = None
        """When the running watch's server deadline comes (monotonic); None: none runs."""
        self._scope: asyncio.Timeout | None = None
        """Ends the running watch now (a cut: want_progress)."""

    def want_progress(self) -> None:
        """A reader needs the stream to reach the server's current resourceVersion soon: short
        watches for a while (:mod:`vwserver.k8s.progress`), and a long one running now is cut
        (resumed at once from :attr:`resource_version`)."""
        now = self._clock.monotonic()
        self._progress_until = progress.demand(self._progress_until, now=now)
        scope = self._scope
        if scope is not None and progress.cut(
            now=now, until=self._progress_until, watch_ends=self._watch_ends
        ):
            log.debug("%s: progress wanted; watching again with a short timeout", self.name)
            self._watch_ends = None  # cut once
            scope.reschedule(asyncio.get_running_loop().time())

    @property
    def progress_wanted(self) -> bool:
        """Whether watches are short now (a reader asked for progress recently)."""
        return self._clock.monotonic() < self._progress_until

    async def _watch_once(self) -> bool:
        """One watch (:meth:`_watch`) that :meth:`want_progress` may cut; True when it
        delivered an event, was cut, or lasted half its timeout (no backoff before the next)."""
        started = self._clock.monotonic()
        scope = asyncio.timeout(None)
        try:
            async with scope:
                self._scope = scope
                delivered = await self._watch()
        except TimeoutError:
            if not scope.expired():
                raise
            return True  # cut between two events (want_progress): resume from resource_version
        finally:
            self._scope = None
            self._watch_ends = None
        lasted = self._clock.monotonic() - started
        return delivered or not progress.ended_early(lasted=lasted, timeout=self._timeout)

    async def run(self) -> None:
        failures = 0
        while True:
            listing = not self.resource_version
            try:
                if listing:
                    await self._list()
                    failures = 0
                    listing = False
                resumed = await self._watch_once()
                self.last_error = None
                self._recovered()
                if resumed:
                    failures = 0
                    continue
                failures += 1  # ended at once without a single event: do not spin
            except WatchSilent as e:
                # The watch had answered (its answer cleared any error), so the upstream was
                # reachable: resume at once from the same resourceVersion; a dead connection
                # shows as the next watch's failure.
                log.info("%s: %s; watching again", self.name, e)
                failures = 0
                continue
            except ApiGone as e:
                # client-go does the same: the resourceVersion is too old, list again
                log.info("%s: %s; relisting", self.name, e.message or "resourceVersion expired")
                self._on_restart("gone")
                self.resource_version = ""
                if not listing:
                    continue
                failures += 1  # the list itself was Gone (an expired continue token)
            except (ApiError, UpstreamUnavailable) as e:
                failures += 1
                self.last_error = str(e)
                self._on_restart("error")
                self._log_failure(e, failures)
            await self._clock.sleep(self._backoff.delay(failures))

    def _log_failure(self, error: Exception, failures: int) -> None:
        """A warning when a failure begins or changes kind; its retries (an outage of an hour
        is hundreds of them) at debug level."""
        kind = type(error).__name__
        if kind != self._failing:
            self._failing = kind
            log.warning("%s: %s (retrying with backoff)", self.name, error)
        else:
            log.debug("%s: %s (retry %d with backoff)", self.name, error, failures)

    def _streaming(self) -> None:
        """The server accepted a watch (its ``200``, before any event): whatever failed before
        works again. Said now, not at the first event (a quiet resource may have none for a
        minute) nor when this watch ends (minutes later), so that :attr:`last_error` and the
        log never describe an outage that is over."""
        self.last_error = None
        self._recovered()

    def _recovered(self) -> None:
        if self._failing is not None:
            self._failing = None
            log.info("%s: working again", self.name)

    def _list_query(self, token: str) -> list[tuple[str, str]]:
        query = [*self._selectors, ("limit", str(self._page_size))]
        if token:
            query.append(("continue", token))
        return query

    def _watch_query(self) -> tuple[list[tuple[str, str]], float]:
        """The next watch's query, and how long its stream may stay silent."""
        now = self._clock.monotonic()
        timeout = progress.watch_timeout(
            now=now,
            until=self._progress_until,
            long_timeout=int(self._watch_timeout * (1 + self._rand())),
        )
        self._timeout, self._watch_ends = timeout, now + timeout
        query = [
            *self._selectors,
            ("resourceVersion", self.resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout)),
        ]
        return query, min(timeout + self._idle_grace, self._silence_limit)

    def _listed(self, count: int, rv: str) -> None:
        self.resource_version = rv
        self.last_error = None
        self._recovered()
        self.synced.set()
        log.debug("%s: listed %d objects at %s", self.name, count, rv)

    async def _list(self) -> None:
        raise NotImplementedError

    async def _watch(self) -> bool:
        """One watch from :attr:`resource_version`; True if it delivered any event."""
        raise NotImplementedError


class Reflector(_ListWatch, Generic[H]):
    """Lists and watches ``url`` (a collection, e.g. ``<vw>/clusters/*/apis/g/v/r``) into
    :attr:`handler`; :meth:`run` until cancelled."""

    def __init__(
        self,
        *,
        name: str,
        client: KubeClient,
        url: str,
        handler: H,
        clock: Clock,
        admission: Admission | None = None,
        **options: Unpack[LoopOptions],
    ) -> None:
        super().__init__(name=name, client=client, url=url, clock=clock, **options)
        self.handler = handler
        self._admission = admission

    async def _list(self) -> None:
        items: list[JSON] = []
        token = ""
        admission = self._admission
        if admission is not None:
            admission.begin_list()
        while True:
            page = await self._client.request("GET", self.url, query=self._list_query(token))
            listed = page.pop("items", None) or []
            if admission is not None:
                # the page's full objects are released here, before the next page is read
                listed = [admission.admit("LISTED", obj) for obj in listed]
            items.extend(listed)
            del listed
            meta = page.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                break
        rv = str(meta.get("resourceVersion") or "")
        self.handler.on_list(items, rv)
        self._listed(len(items), rv)

    async def _watch(self) -> bool:
        query, idle_timeout = self._watch_query()
        delivered = False
        events = self._client.watch(
            self.url, query=query, idle_timeout=idle_timeout, on_answer=self._streaming
        )
        async with contextlib.aclosing(events):
            async for event in events:
                delivered = True
                kind, obj = str(event["type"]), event["object"]
                rv = resource_version(obj)
                if kind == "BOOKMARK":
                    if rv:
                        self.resource_version = rv
                        self.handler.on_bookmark(rv)
                    continue
                if self._admission is not None:
                    obj = self._admission.admit(kind, obj)
                self.handler.on_event(kind, obj)
                if rv:
                    self.resource_version = rv
        return delivered


# --- raw mode ---------------------------------------------------------------------------------

T = TypeVar("T")


class RawReflectorHandler(Protocol[T]):
    def on_list(self, items: list[T], resource_version: str) -> None:
        """The whole collection at ``resource_version``, each object decoded (see
        :class:`ReflectorHandler`)."""
        ...

    def on_event(self, kind: str, item: T) -> None:
        """One change: ``kind`` is ADDED, MODIFIED or DELETED."""
        ...

    def on_bookmark(self, resource_version: str) -> None:
        """Nothing changed up to ``resource_version``."""
        ...


_decode_page = msgspec.json.Decoder(ListPage).decode
_decode_head = msgspec.json.Decoder(ObjectHead).decode
_decode_table = msgspec.json.Decoder(TablePage).decode

TABLE_ACCEPT: Final = "application/json;as=Table;v=v1;g=meta.k8s.io"
"""What a reflector in table mode asks for (with ``includeObject=Object``)."""
_NULL: Final = b"null"


class _TableEvent(msgspec.Struct):
    """A watch event's Table: one row; column definitions only in a watch's first event."""

    columnDefinitions: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(_NULL))
    rows: list[msgspec.Raw] | None = None


_decode_table_event = msgspec.json.Decoder(_TableEvent).decode


class RawReflector(_ListWatch, Generic[T]):
    """:class:`Reflector` in raw mode: every object is read as bytes and turned into a ``T``
    by ``decode``, once; ``version`` gives a decoded object's resourceVersion (where the next
    watch resumes). ``table``: table mode (see the module docstring), ``decode`` gets rows."""

    def __init__(
        self,
        *,
        name: str,
        client: KubeClient,
        url: str,
        handler: RawReflectorHandler[T],
        decode: Callable[[msgspec.Raw], T],
        version: Callable[[T], int | str],
        clock: Clock,
        table: bool = False,
        **options: Unpack[LoopOptions],
    ) -> None:
        super().__init__(name=name, client=client, url=url, clock=clock, **options)
        self.handler = handler
        self.list_kind = ""
        """The ``kind`` of the last list (e.g. ``WidgetList``): what the collection holds."""
        self.api_version = ""
        """The ``apiVersion`` of the last list."""
        self.table = table
        self.columns = b""
        """Table mode: the column definitions (JSON) the rows being listed, and the rows held
        since, were printed with; set before a list's rows are decoded."""
        self._decode = decode
        self._version = version
        self._accept = TABLE_ACCEPT if table else "application/json"
        self._extra: tuple[tuple[str, str], ...] = (("includeObject", "Object"),) if table else ()

    def _item(self, raw: msgspec.Raw) -> T:
        try:
            return self._decode(raw)
        except ValueError as e:  # msgspec.DecodeError and the decoders' own refusals
            raise _garbage(self.url, f"undecodable object: {e}") from e

    async def _list(self) -> None:
        items: list[T] = []
        token = ""
        while True:
            body = await self._client.request_raw(
                "GET", self.url, query=[*self._list_query(token), *self._extra], accept=self._accept
            )
            try:
                page: ListPage | TablePage = (_decode_table if self.table else _decode_page)(body)
            except msgspec.DecodeError as e:
                raise _garbage(self.url, f"undecodable list: {e}") from e
            if isinstance(page, TablePage):
                if not token:  # every page of one list is printed with the same columns
                    self.columns = bytes(page.columnDefinitions)
                entries = page.rows
            else:
                entries = page.items
            # Each item is decoded now and the page dropped: only the decoded items (which
            # copy their bytes out of the page) outlive the loop.
            items.extend(self._item(raw) for raw in entries or ())
            token = page.metadata.continue_
            if not token:
                break
        rv = page.metadata.resourceVersion
        self.list_kind, self.api_version = page.kind, page.apiVersion
        self.handler.on_list(items, rv)
        self._listed(len(items), rv)

    async def _watch(self) -> bool:
        query, idle_timeout = self._watch_query()
        delivered = False
        events = self._client.watch_raw(
            self.url,
            query=[*query, *self._extra],
            idle_timeout=idle_timeout,
            accept=self._accept,
            on_answer=self._streaming,
        )
        async with contextlib.aclosing(events):
            async for event in events:
                delivered = True
                obj = event.object
                if self.table:
                    rows = self._table_rows(obj)
                    if rows is None:
                        self.resource_version = ""  # printed with other columns: relist
                        return delivered
                    if event.type != "BOOKMARK":  # a bookmark's Table has its resourceVersion
                        if len(rows) != 1:
                            raise _garbage(self.url, f"a Table event with {len(rows)} rows")
                        obj = rows[0]
                if event.type == "BOOKMARK":
                    try:
                        rv = _decode_head(obj).metadata.resourceVersion
                    except msgspec.DecodeError as e:
                        raise _garbage(self.url, f"undecodable bookmark: {e}") from e
                    if rv:
                        self.resource_version = rv
                        self.handler.on_bookmark(rv)
                    continue
                item = self._item(obj)
                self.handler.on_event(event.type, item)
                rv = str(self._version(item))
                if rv:
                    self.resource_version = rv
        return delivered

    def _table_rows(self, raw: msgspec.Raw) -> list[msgspec.Raw] | None:
        """A Table event's rows; None when it carries column definitions other than the
        list's (only the first event of a watch carries them at all)."""
        try:
            table = _decode_table_event(raw)
        except msgspec.DecodeError as e:
            raise _garbage(self.url, f"undecodable Table event: {e}") from e
        columns = bytes(table.columnDefinitions)
        if columns not in (_NULL, self.columns):
            log.info("%s: the printed columns changed; relisting", self.name)
            return None
        return table.rows or []


def _garbage(url: str, what: str) -> ApiError:
    """An answer that is no Kubernetes answer: a 502, retried like any server failure."""
    return api_error(502, {"reason": "BadGateway", "message": what}, url=url)
