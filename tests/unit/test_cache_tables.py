"""Table rows of the shared watch cache (vwserver.cache.tables), the reflector's table mode that
feeds them, and the LIST plan they share with the other representations.

The printed shapes are compared byte for byte with what kcp v0.32 sent for the same
situations (a Table watch of the demo's widgets, whose schema has no printer columns); ages with
the duration examples of k8s.io/apimachinery's HumanDuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from tests.support.clock import FakeClock
from tests.support.serve import serve_app
from tests.unit.test_reflector import PATH, Answer, ScriptedServer, Stream
from vwserver.cache.entries import Entry, entry
from vwserver.cache.tables import (
    CRD_COLUMN,
    Row,
    TablePrinter,
    date_cell,
    date_sources,
    human_duration,
    parse_columns,
    print_cells,
)
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.client import KubeClient
from vwserver.k8s.kubeconfig import ClientAuth
from vwserver.k8s.reflector import TABLE_ACCEPT, RawReflector
from vwserver.proxy.cache_plan import Consistency, list_plan
from vwserver.proxy.options import Options

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)

# kcp's columnDefinitions for a schema without printer columns: Name only.
NAME_COLUMNS = (
    b'[{"name":"Name","type":"string","format":"name","description":"Name must be unique '
    b"within a namespace. Is required when creating resources, although some resources may "
    b"allow a client to request the generation of an appropriate name automatically. Name is "
    b"primarily intended for creation idempotence and configuration definition. Cannot be "
    b"updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/"
    b'names#names","priority":0}]'
)


def column(name: str, type_: str, description: str) -> dict[str, Any]:
    return {"name": name, "type": type_, "format": "", "description": description, "priority": 0}


AGE_COLUMNS = json.dumps(
    [
        json.loads(NAME_COLUMNS)[0],
        column("Size", "integer", CRD_COLUMN + ".spec.size"),
        column("Age", "date", CRD_COLUMN + ".metadata.creationTimestamp"),
        column("Done", "date", CRD_COLUMN + ".status.done"),
    ]
).encode()


def widget(name: str, rv: int, **extra: Any) -> bytes:
    doc = {
        "apiVersion": "example.io/v1alpha1",
        "kind": "Widget",
        "metadata": {
            "annotations": {"kcp.io/cluster": "c1"},
            "creationTimestamp": "2026-06-01T09:00:00Z",
            "name": name,
            "namespace": "team-red",
            "resourceVersion": str(rv),
        },
        **extra,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def row(obj: bytes, cells: bytes, columns: bytes = NAME_COLUMNS) -> Row:
    item = entry(obj)
    return Row(
        raw=item.raw,
        meta=item.meta,
        cells=cells,
        dates=date_sources(parse_columns(columns), item.raw),
    )


# --- ages -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("elapsed", "printed"),
    [
        (timedelta(seconds=-2), "<invalid>"),
        (timedelta(seconds=-1.5), "0s"),  # within two seconds of clock skew: now
        (timedelta(0), "0s"),
        (timedelta(seconds=1), "1s"),
        (timedelta(seconds=70), "70s"),
        (timedelta(seconds=119.9), "119s"),
        (timedelta(seconds=120), "2m"),
        (timedelta(seconds=190), "3m10s"),
        (timedelta(minutes=70), "70m"),
        (timedelta(hours=3, minutes=7), "3h7m"),
        (timedelta(hours=8, minutes=59), "8h"),
        (timedelta(hours=47), "47h"),
        (timedelta(hours=49), "2d1h"),
        (timedelta(hours=8 * 24 + 2), "8d"),
        (timedelta(hours=367 * 24), "367d"),
        (timedelta(hours=365 * 2 * 24 + 25), "2y1d"),
        (timedelta(hours=365 * 8 * 24 + 2), "8y"),
    ],
)
def test_ages_are_the_apiservers_human_durations(elapsed: timedelta, printed: str) -> None:
    assert human_duration(elapsed) == printed


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        (None, None),  # no string there: a null cell
        ("", "<unknown>"),  # metav1.Time's zero value
        ("null", "<unknown>"),
        ("yesterday", "<invalid>"),
        ("2026-06-01T09:00:00Z", "3h"),
        ("2026-06-01T11:59:30.5Z", "29s"),
        ("2026-06-01T13:30:00+02:00", "30m"),  # 11:30 UTC
        ("2026-06-01T12:00:05Z", "<invalid>"),  # in the future, beyond the skew allowed
        ("2026-02-30T00:00:00Z", "<invalid>"),
    ],
)
def test_date_cells_are_printed_relative_to_now(value: str | None, cell: str | None) -> None:
    assert date_cell(value, NOW) == cell


# --- columns ----------------------------------------------------------------------------------


def test_the_source_of_a_date_column_is_the_path_kcp_describes() -> None:
    columns = parse_columns(AGE_COLUMNS)
    assert (columns.count, columns.unknown) == (4, None)
    assert columns.dates == ((2, ("metadata", "creationTimestamp")), (3, ("status", "done")))
    assert parse_columns(NAME_COLUMNS).dates == ()


@pytest.mark.parametrize(
    "description",
    [
        "When it was built",  # its author's words: the path is not known
        CRD_COLUMN + '.status.conditions[?(@.type=="Ready")].lastTransitionTime',
        CRD_COLUMN + ".metadata.annotations.a\\.b",
    ],
)
def test_a_date_column_of_unknown_source_cannot_be_printed(description: str) -> None:
    raw = json.dumps([json.loads(NAME_COLUMNS)[0], column("Built", "date", description)])
    columns = parse_columns(raw.encode())
    assert columns.unknown == "the source of date column 'Built' is not known"


def test_date_cells_are_printed_anew_and_the_other_cells_kept_as_kcp_printed_them() -> None:
    columns = parse_columns(AGE_COLUMNS)
    obj = widget("w", 5, status={"done": "2026-06-01T11:00:00Z"})
    # kcp's cells, printed when the row arrived (the number as kcp wrote it)
    stored = row(obj, b'["w",1.50e+00,"5s","1h"]', AGE_COLUMNS)
    assert stored.dates == ("2026-06-01T09:00:00Z", "2026-06-01T11:00:00Z")
    assert print_cells(stored, columns, NOW) == b'["w",1.50e+00,"3h","60m"]'
    later = NOW + timedelta(days=2)
    assert print_cells(stored, columns, later) == b'["w",1.50e+00,"2d3h","2d1h"]'
    # a path the object does not have, or a value that is no string: null
    bare = row(widget("b", 6, status={"done": 7}), b'["b",null,"5s",null]', AGE_COLUMNS)
    assert bare.dates == ("2026-06-01T09:00:00Z", None)
    assert print_cells(bare, columns, NOW) == b'["b",null,"3h",null]'


# --- printing, as kcp prints ----------------------------------------------------------------


def printer(include: str, *, version: str = "v1", columns: bytes = NAME_COLUMNS) -> TablePrinter:
    return TablePrinter(
        version=version,
        include=include,
        columns=parse_columns(columns),
        object_api_version="example.io/v1alpha1",
        object_kind="Widget",
    )


def kcp_table_event(kind: str, rv: int, columns: bytes, row_json: bytes) -> bytes:
    return (
        b'{"type":"%b","object":{"kind":"Table","apiVersion":"meta.k8s.io/v1",'
        b'"metadata":{"resourceVersion":"%d"},"columnDefinitions":%b,"rows":[%b]}}\n'
        % (kind.encode(), rv, columns, row_json)
    )


def test_a_row_carries_the_object_as_include_object_asks() -> None:
    obj = widget("prod-eu", 838)
    stored = row(obj, b'["prod-eu"]')
    metadata = json.dumps(json.loads(obj)["metadata"], separators=(",", ":")).encode()
    partial = (
        b'{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":'
        + metadata
        + b"}"
    )
    expected = {
        "Object": b'{"cells":["prod-eu"],"object":' + obj + b"}",
        "Metadata": b'{"cells":["prod-eu"],"object":' + partial + b"}",
        "None": b'{"cells":["prod-eu"],"object":null}',
    }
    for include, printed in expected.items():
        assert printer(include).row(stored, stored.raw, NOW) == printed
    beta = printer("Metadata", version="v1beta1").row(stored, stored.raw, NOW)
    assert json.loads(beta)["object"]["apiVersion"] == "meta.k8s.io/v1beta1"


def test_date_cells_follow_the_object_as_the_slice_shows_it() -> None:
    """An object leaving a slice is shown being deleted there: a date column of its
    deletionTimestamp prints that, although kcp printed the stored object (without one)."""
    columns = json.dumps(
        [
            json.loads(NAME_COLUMNS)[0],
            column("Leaving", "date", CRD_COLUMN + ".metadata.deletionTimestamp"),
        ]
    ).encode()
    stored = row(widget("w", 5), b'["w",null]', columns)
    doc = json.loads(stored.raw)
    doc["metadata"]["deletionTimestamp"] = "2026-06-01T11:58:00Z"
    shown = json.dumps(doc).encode()
    print_ = printer("None", columns=columns)
    assert json.loads(print_.row(stored, shown, NOW))["cells"] == ["w", "2m"]
    assert json.loads(print_.row(stored, stored.raw, NOW))["cells"] == ["w", None]


def test_watch_events_carry_the_columns_first_only() -> None:
    none = printer("None")
    row_json = b'{"cells":["prod-eu"],"object":null}'
    assert none.event("MODIFIED", row_json, 838, headers=False) == kcp_table_event(
        "MODIFIED", 838, b"null", row_json
    )
    assert none.event("ADDED", row_json, 830, headers=True) == kcp_table_event(
        "ADDED", 830, NAME_COLUMNS, row_json
    )


@pytest.mark.parametrize(
    ("include", "initial_events_end", "marker"),
    [
        (
            "Object",
            True,
            b'{"apiVersion":"example.io/v1alpha1","kind":"Widget","metadata":{"annotations":'
            b'{"k8s.io/initial-events-end":"true"},"resourceVersion":"841"}}',
        ),
        (
            "Metadata",
            True,
            b'{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":'
            b'{"resourceVersion":"841","annotations":{"k8s.io/initial-events-end":"true"}}}',
        ),
        (
            "None",  # a PartialObjectMetadata all the same: the annotation must reach client-go
            True,
            b'{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":'
            b'{"resourceVersion":"841","annotations":{"k8s.io/initial-events-end":"true"}}}',
        ),
        ("None", False, b"null"),
        (
            "Metadata",
            False,
            b'{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":'
            b'{"resourceVersion":"841"}}',
        ),
    ],
)
def test_bookmarks_are_tables_as_kcp_sends_them(
    include: str, initial_events_end: bool, marker: bytes
) -> None:
    line = printer(include).bookmark(841, initial_events_end=initial_events_end, headers=True)
    assert line == kcp_table_event(
        "BOOKMARK", 841, NAME_COLUMNS, b'{"cells":[""],"object":' + marker + b"}"
    )
    # printed from an object with nothing but a resourceVersion: no value in other columns
    wide = printer(include, columns=AGE_COLUMNS).bookmark(
        841, initial_events_end=initial_events_end, headers=False
    )
    assert json.loads(wide)["object"]["rows"][0]["cells"] == ["", None, None, None]


# --- the LIST plan ------------------------------------------------------------------------------


def test_a_list_at_resource_version_0_ignores_the_limit() -> None:
    """cacher.computeListLimit; kcp answered 16 widgets for limit=2&resourceVersion=0."""
    plan = list_plan(Options([("limit", "2"), ("resourceVersion", "0")]))
    assert (plan.consistency, plan.limit) == (Consistency.ANY, 0)
    assert list_plan(Options([("limit", "2")])).limit == 2


# --- the reflector's table mode -----------------------------------------------------------------


def table_page(
    *rows: bytes, columns: bytes = NAME_COLUMNS, rv: str = "", cont: str = ""
) -> web.Response:
    meta = {"resourceVersion": rv, **({"continue": cont} if cont else {})}
    body = (
        b'{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":'
        + json.dumps(meta).encode()
        + b',"columnDefinitions":'
        + columns
        + b',"rows":['
        + b",".join(rows)
        + b"]}"
    )
    return web.Response(body=body, content_type="application/json")


def table_row(obj: bytes) -> bytes:
    return b'{"cells":["%b"],"object":%b}' % (json.loads(obj)["metadata"]["name"].encode(), obj)


def table_event(kind: str, obj: bytes, *, columns: bytes = b"null") -> bytes:
    rv = json.loads(obj)["metadata"]["resourceVersion"]
    return kcp_table_event(kind, int(rv), columns, table_row(obj))


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_list(self, items: list[Entry], resource_version: str) -> None:
        self.calls.append(("list", [i.raw for i in items], resource_version))

    def on_event(self, kind: str, item: Entry) -> None:
        self.calls.append((kind, item.raw))

    def on_bookmark(self, resource_version: str) -> None:
        self.calls.append(("bookmark", resource_version))


class AcceptingServer(ScriptedServer):
    """The scripted API server, noting the Accept header of every request."""

    def __init__(self, *answers: Answer) -> None:
        super().__init__(*answers)
        self.accepts: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.accepts.append(request.headers.get("Accept", ""))
        return await super().handle(request)


@contextlib.asynccontextmanager
async def table_reflector(
    *answers: Answer,
) -> AsyncIterator[tuple[AcceptingServer, RawReflector[Entry], Recorder]]:
    server = AcceptingServer(*answers)
    app = web.Application()
    app.router.add_get(PATH, server.handle)
    recorder = Recorder()

    def decode(raw: Any) -> Entry:  # a row: the object in it is what the cache keys
        obj = json.loads(bytes(raw))["object"]
        return entry(json.dumps(obj, separators=(",", ":")).encode())

    async with serve_app(app) as base, KubeClient(auth=ClientAuth(server=base)) as client:
        reflector = RawReflector(
            name="table",
            client=client,
            url=base + PATH,
            handler=recorder,
            decode=decode,
            version=lambda e: e.meta.resource_version,
            clock=FakeClock(),
            backoff=Backoff(initial=1, maximum=8, rand=lambda: 1.0),
            rand=lambda: 0.0,
            page_size=1,
            table=True,
        )
        task = asyncio.create_task(reflector.run())
        try:
            yield server, reflector, recorder
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def until(check: Any) -> None:
    async with asyncio.timeout(5.0):
        while not check():  # noqa: ASYNC110 - polling what the loop recorded
            await asyncio.sleep(0.005)


async def test_table_mode_lists_and_watches_rows_and_relists_when_the_columns_change() -> None:
    a, b, c = widget("a", 3), widget("b", 4), widget("c", 11)
    bookmark = (
        b'{"type":"BOOKMARK","object":{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":'
        b'{"resourceVersion":"12"},"columnDefinitions":null,"rows":[{"cells":[""],"object":null}]}}\n'
    )
    async with table_reflector(
        table_page(table_row(a), rv="10", cont="t1"),
        table_page(table_row(b), rv="10"),
        # the first event of a watch carries the columns: the same ones, then a change
        Stream([table_event("ADDED", c, columns=NAME_COLUMNS), bookmark]),
        Stream([table_event("MODIFIED", widget("c", 13), columns=AGE_COLUMNS)]),
        table_page(table_row(a), columns=AGE_COLUMNS, rv="14"),
        Stream(hang=True),
    ) as (server, reflector, recorder):
        await until(lambda: len(server.watches()) == 3)
        kinds = [call[0] for call in recorder.calls]
        assert kinds == ["list", "ADDED", "bookmark", "list"]  # the MODIFIED was never applied
        assert recorder.calls[0][1:] == ([entry(a).raw, entry(b).raw], "10")
        assert reflector.columns == AGE_COLUMNS
        assert [w["resourceVersion"] for w in server.watches()] == ["10", "12", "14"]
        assert all(q.get("includeObject") == "Object" for q in server.requests)
        assert set(server.accepts) == {TABLE_ACCEPT}
