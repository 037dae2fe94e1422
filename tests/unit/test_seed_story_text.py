"""The seed story's printed text (``make run-sync``) without kcp: paths, quoting, one source of
commands, and the operator's status.

What each line does is checked against real kcp in ``tests/e2e/test_seed_story_kcp.py``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from devenv.bootstrap import Workspace
from devenv.kcp import KcpInstance
from devenv.mongo_operator import desired_status
from devenv.seed_story import (
    NAMESPACE_PREFIX,
    PLURAL,
    RELATED,
    SAMPLE_FILE,
    SLICE_LABELS,
    SLICE_RELATED,
    SYNCER,
    StoryNames,
    SyncWorld,
    sample_database,
    story_lines,
    story_text,
)
from vwserver.config.base import convert
from vwserver.related import names_at, parse_path
from vwserver.syncer.config import RelatedConfig
from vwserver.syncer.naming import LABEL_SYNCER, downstream_namespace
from vwserver.syncer.related_spec import compile_related

KCP = "https://127.0.0.1:6443"


def _ws(name: str, cluster: str) -> Workspace:
    return Workspace(
        name=name, path=f"root:{name}", cluster=cluster, url=f"{KCP}/clusters/root:{name}"
    )


def _world() -> SyncWorld:
    return SyncWorld(
        provider=_ws("sync-provider", "pppp"),
        consumers=(_ws("sync-team-a", "aaaa"), _ws("sync-team-b", "bbbb")),
        downstream=_ws("sync-downstream", "dddd"),
        api=_ws("vwserver", "vvvv"),
    )


def _kcp(tmp: Path) -> KcpInstance:
    return KcpInstance(
        url=KCP,
        kubeconfig=tmp / "kcp dir" / "admin.kubeconfig",
        ca_file=tmp / "kcp dir" / "ca.crt",
        admin_token="t",
        workdir=tmp,
    )


EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "syncer.example.yaml"


def test_the_sample_is_in_the_slice() -> None:
    sample = sample_database()
    assert sample.labels.items() >= SLICE_LABELS.items()
    assert sample.namespace == "default"  # every kcp workspace has it


def test_the_sample_names_its_password_secret_which_the_file_creates_first() -> None:
    docs = [d for d in yaml.safe_load_all(SAMPLE_FILE.read_text()) if d]
    assert [d["kind"] for d in docs] == ["Secret", "MongoDBCommunity"]  # created in this order
    sample = sample_database()
    assert sample.secrets == ("orders-db-password",)
    assert "password" in docs[0]["stringData"]  # the operator's default key
    path = parse_path(RELATED[0]["reference"]["path"], field="path")
    assert names_at({"spec": sample.spec}, path) == frozenset(sample.secrets)
    assert sample.connection_secrets == ("orders-db-admin-app",)


def test_the_syncer_finds_what_the_slice_shows_and_what_the_operator_writes() -> None:
    """The story's related entries agree with its slice (the same path; up-copies carry the
    owner label the selector rule selects) and with the operator (the template gives the
    names of the connection-string Secrets it writes)."""
    password, connection = (
        compile_related(convert(r, RelatedConfig), field=f"related[{i}]")
        for i, r in enumerate(RELATED)
    )
    referenced = next(r for r in SLICE_RELATED if "referencedBy" in r)
    assert RELATED[0]["reference"]["path"] == referenced["referencedBy"]["path"]
    selected = next(r for r in SLICE_RELATED if "selector" in r)
    assert selected["selector"] == {"matchLabels": {LABEL_SYNCER: SYNCER}}
    assert (password.origin, connection.origin) == ("kcp", "downstream")
    sample = sample_database()
    primary = {"metadata": {"name": sample.name}, "spec": sample.spec}
    assert connection.names(primary) == frozenset(sample.connection_secrets)
    assert password.names(primary) == frozenset(sample.secrets)


def test_the_example_config_has_the_story_s_related_entries() -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    assert example["name"] == SYNCER
    assert example["resources"][0]["related"] == RELATED


def test_printed_commands_are_exactly_story_lines_and_survive_spaces_in_paths(
    tmp_path: Path,
) -> None:
    world, kcp, sample = _world(), _kcp(tmp_path), sample_database()
    sample_file = "my repo/config/syncer/sample.yaml"  # a path the shell would split
    lines = story_lines(kcp=kcp, world=world, sample_file=sample_file, sample=sample)
    text = story_text(
        kcp=kcp,
        world=world,
        run_dir="my repo/.run/sync",
        base="https://127.0.0.1:8444",
        endpoint="https://127.0.0.1:8444/services/filtered-apiexport/pppp/mongodb-eu",
        health="http://127.0.0.1:40000",
        sample_file=sample_file,
        sample=sample,
    )
    printed = [p for p in text.splitlines() if p.startswith("kubectl ")]
    assert printed == [line.command for line in lines]
    assert len({line.key for line in lines}) == len(lines)
    by_key = {line.key: shlex.split(line.command) for line in lines}
    for argv in by_key.values():
        assert argv[:2] == ["kubectl", "--kubeconfig"]
        assert argv[2] == str(tmp_path / "kcp dir" / "admin.kubeconfig")
    assert by_key["create"][-2:] == ["-f", sample_file]
    team_a = world.consumers[0].url
    for key in ("create", "watch", "wait", "delete"):
        assert by_key[key][by_key[key].index("--server") + 1] == team_a
    for key in ("secrets", "secrets-gone"):
        assert by_key[key][by_key[key].index("--server") + 1] == team_a
        assert by_key[key][-5:] == ["secrets", "-n", sample.namespace, "-L", LABEL_SYNCER]
    copy_ns = downstream_namespace(
        world.consumers[0].cluster, sample.namespace, prefix=NAMESPACE_PREFIX
    )
    for key in ("downstream", "downstream-gone", "downstream-secrets", "downstream-secrets-gone"):
        assert by_key[key][by_key[key].index("--server") + 1] == world.downstream.url
    for key in ("downstream-secrets", "downstream-secrets-gone"):
        assert by_key[key][-5:] == ["secrets", "-n", copy_ns, "-L", LABEL_SYNCER]
    shown = {line.key: " ".join(line.shows) for line in lines}
    assert "orders-db-password" in shown["create"]
    for key in ("downstream-secrets", "secrets"):
        assert "orders-db-admin-app" in shown[key]
    # kubectl receives the jsonpath filter and the wait condition unquoted
    watch = by_key["watch"]
    assert watch[-1].startswith("custom-columns=NAME:.metadata.name,")
    assert watch[-1].endswith('SYNCED:.status.conditions[?(@.type=="Synced")].status')
    assert "--for=jsonpath={.status.phase}=Running" in by_key["wait"]
    assert by_key["delete"][-4:] == [PLURAL, sample.name, "-n", sample.namespace]


def test_shown_sample_path_is_the_repository_file() -> None:
    assert SAMPLE_FILE.is_file()


def test_unique_names_differ_and_keep_the_roles() -> None:
    a, b = StoryNames.unique(), StoryNames.unique()
    assert a != b
    assert len(a.consumers) == len(StoryNames().consumers)


def test_operator_status_pending_then_running() -> None:
    obj = {
        "metadata": {"namespace": "kcp-x", "name": "db", "generation": 2},
        "spec": {"members": 3, "version": "6.0.5"},
    }
    pending = desired_status(obj, running=False)
    running = desired_status(obj, running=True)
    assert (pending["phase"], pending["currentMongoDBMembers"]) == ("Pending", 0)
    assert (running["phase"], running["currentMongoDBMembers"]) == ("Running", 3)
    assert running["version"] == "6.0.5" and running["observedGeneration"] == 2
    assert running["mongoUri"] == "mongodb://db-svc.kcp-x.svc.cluster.local:27017"
