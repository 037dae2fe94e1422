"""The pure parts of ``vwserver serve --workers`` (vwserver.workers): the parent's merged
metrics and readiness, the worker role, the relay's message, and the option's checks."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_config import good, write
from vwserver.cli import main
from vwserver.config import load_config
from vwserver.controller.handoff import relayed
from vwserver.errors import ConfigError
from vwserver.metrics import ServerMetrics
from vwserver.server import WorkerRole
from vwserver.workers import merge_metrics, readiness, with_worker_label


def registry(gets: int, upstream: int) -> str:
    metrics = ServerMetrics()
    for _ in range(gets):
        metrics.observe_request(slice_label="c/prod", verb="get", code=200, seconds=0.001)
    for _ in range(upstream):
        metrics.count_upstream_request("GET")
    return metrics.render().decode()


@given(counts=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=4))
def test_merged_metrics_parse_and_keep_every_workers_counts(
    counts: list[tuple[int, int]],
) -> None:
    texts = {i: registry(gets, upstream) for i, (gets, upstream) in enumerate(counts)}
    families = list(text_string_to_metric_families(merge_metrics(texts)))
    names = [f.name for f in families]
    assert len(names) == len(set(names))  # each family once, as the text format requires
    by_name = {f.name: f for f in families}
    for index, (gets, upstream) in enumerate(counts):
        worker = str(index)
        requests = [
            s
            for s in by_name["vwserver_requests"].samples
            if s.name == "vwserver_requests_total" and s.labels["worker"] == worker
        ]
        assert sum(s.value for s in requests) == gets
        sent = [
            s
            for s in by_name["vwserver_upstream_requests"].samples
            if s.name == "vwserver_upstream_requests_total" and s.labels.get("worker") == worker
        ]
        assert sum(s.value for s in sent) == upstream
    for family in families:  # every sample names its worker
        assert all("worker" in s.labels for s in family.samples)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("up 1.0", 'up{worker="3"} 1.0'),
        ('a_total{x="1",y="}"} 2.0', 'a_total{worker="3",x="1",y="}"} 2.0'),
        ("b{} 0", 'b{worker="3"} 0'),
        ("c:d 5 1700000000", 'c:d{worker="3"} 5 1700000000'),
    ],
)
def test_worker_label(line: str, expected: str) -> None:
    assert with_worker_label(line, 3) == expected


@pytest.mark.parametrize(
    ("answers", "draining", "status", "body"),
    [
        ({0: (200, "ok"), 1: (200, "ok")}, False, 200, "ok"),
        (
            {0: (200, "ok\nupstream: x fails"), 1: (200, "ok\nupstream: x fails\nupstream: y")},
            False,
            200,
            "ok\nupstream: x fails\nupstream: y",
        ),
        (
            {0: (200, "ok"), 1: (503, "not ready: slices not synced yet\n")},
            False,
            503,
            "not ready: worker 1: slices not synced yet\n",
        ),
        ({0: None, 1: (200, "ok")}, False, 503, "not ready: worker 0: not answering\n"),
        ({0: (200, "ok")}, True, 503, "not ready: shutting down\n"),
    ],
)
def test_readiness_of_every_worker(
    answers: dict[int, Any], draining: bool, status: int, body: str
) -> None:
    assert readiness(answers, draining=draining) == (status, body)


def test_worker_role_round_trips() -> None:
    role = WorkerRole(index=1, count=3, port=8443, sockets=Path("/tmp/x/y"))
    assert WorkerRole.decode(role.encode()) == role
    assert not role.writer and WorkerRole.decode("0/3/1/d").writer
    assert role.socket_path(0) == Path("/tmp/x/y/worker-0.sock")


def test_relay_messages_are_checked() -> None:
    assert relayed({"resources": [["https://u", "/apis/g/v/r"]], "wake": True}) == (
        [("https://u", "/apis/g/v/r")],
        True,
    )
    for bad in (
        [],
        {"resources": [], "wake": "yes"},
        {"resources": [["u"]], "wake": False},
        {"resources": [["u", 1]], "wake": False},
        {"resources": [["u", "p"]] * 3, "wake": False},
    ):
        with pytest.raises(ValueError, match=r"\w"):
            relayed(bad, limit=2)


@pytest.mark.parametrize("workers", [0, -1, 65])
def test_workers_in_the_config_file_are_bounded(tmp_path: Path, workers: int) -> None:
    assert load_config(write(tmp_path, good())).workers == 1
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, {**good(), "workers": workers}))
    assert str(info.value) == f"$.workers: {workers} workers: must be between 1 and 64"


def test_workers_option_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, good())
    assert main(["serve", "--config", str(path), "--workers", "0"]) == 2
    assert capsys.readouterr().err == (
        "vwserver serve: --workers: 0 workers: must be between 1 and 64\n"
    )


def test_a_port_in_use_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:  # no SO_REUSEPORT: the workers cannot join it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = write(tmp_path, {**good(), "listen": {"host": "127.0.0.1", "port": port}})
        assert main(["serve", "--config", str(path), "--workers", "2"]) == 2
    assert capsys.readouterr().err == (
        f"vwserver: invalid configuration: $.listen: cannot listen on 127.0.0.1:{port}: "
        "Address already in use\n"
    )
