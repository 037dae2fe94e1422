"""A stand-in for the MongoDB Community operator in the downstream "cluster" of ``make run-sync``.

The syncer's reference use case ends with an operator acting on each downstream copy and writing
its status, which the syncer carries back into the consumer's kcp workspace. The real operator
needs pods and a cluster; this one writes only what it would report: phase ``Pending`` when it
first sees a database, ``Running`` ``ready_after`` seconds later, the spec's version and member
count, ``observedGeneration``, and the internal ``mongoUri`` (the story's syncer config lists it
in ``statusExclude``, so it stays downstream).

Like the real operator, it needs each user's password: a database whose ``spec.users[]`` name a
``passwordSecretRef`` stays ``Pending`` (with a message naming what is missing) until that Secret
exists in the database's namespace with the key (``password`` unless ``passwordSecretRef.key``
says otherwise). Then it is ``Running``, and for every user the operator writes the
connection-string Secret ``<database>-<db>-<user>`` (keys ``connectionString.standard``,
``connectionString.standardSrv``, ``username``, ``password``, as the real operator does), keeps
it in step with the password, and deletes it with the database (no ownerReference: a bare
kube-apiserver has no garbage collector). In ``make run-sync`` the password Secret reaches this
cluster, and the connection string goes back to kcp, through the syncer's related resources.

It follows the collections with vwserver's own list+watch loop (:class:`~vwserver.k8s.reflector.
Reflector` into a :class:`~vwserver.k8s.cache.Cache`), as a controller would with an informer,
and writes a status only when it differs from the one it wants. It adds no finalizer: deleting a
copy removes it at once, so deletion in kcp waits only for the syncer. No kopf: it is not a
dependency of this repository, and the loop is short.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vwserver.clock import Clock, SystemClock
from vwserver.errors import ApiError, UpstreamUnavailable
from vwserver.k8s.backoff import Backoff
from vwserver.k8s.cache import Cache
from vwserver.k8s.client import JSON, KubeClient
from vwserver.k8s.reflector import Reflector

log = logging.getLogger(__name__)

#: The downstream CRD's API (config/syncer/downstream-crd.yaml), after the cluster URL.
API = "apis/mongodbcommunity.mongodb.com/v1"
PLURAL = "mongodbcommunity"

Key = tuple[str, str]  # namespace, name
#: On every connection-string Secret: the database it belongs to (found again on deletion).
LABEL_DATABASE = "mongodbcommunity.mongodb.com/database"
FIELD_MANAGER = "demo-mongodb-operator"


def database(
    name: str, namespace: str, *, password: str, labels: Mapping[str, str] | None = None
) -> JSON:
    """A MongoDBCommunity of the seed story: one replica, one user ``app`` (auth db ``admin``,
    readWrite on ``orders``) whose password is in Secret ``password``; its connection-string
    Secret is ``<name>-admin-app``."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": API.removeprefix("apis/"),
        "kind": "MongoDBCommunity",
        "metadata": metadata,
        "spec": {
            "members": 1,
            "type": "ReplicaSet",
            "version": "6.0.5",
            "users": [
                {
                    "name": "app",
                    "db": "admin",
                    "passwordSecretRef": {"name": password},
                    "roles": [{"name": "readWrite", "db": "orders"}],
                }
            ],
        },
    }


def mongo_uri(namespace: str, name: str) -> str:
    """The connection string the operator reports (the Service it would create)."""
    return f"mongodb://{name}-svc.{namespace}.svc.cluster.local:27017"


@dataclass(frozen=True, kw_only=True)
class User:
    """One entry of ``spec.users[]``."""

    name: str
    db: str
    #: The Secret holding the password, in the database's namespace, and its key.
    secret: str
    key: str = "password"


def users_of(obj: JSON) -> list[User]:
    """The well-formed users of a database (the CRD schema requires name, db and the ref)."""
    found = []
    for user in (obj.get("spec") or {}).get("users") or []:
        if not isinstance(user, dict):
            continue
        ref = user.get("passwordSecretRef") or {}
        name, db, secret = user.get("name"), user.get("db"), ref.get("name")
        if isinstance(name, str) and isinstance(db, str) and isinstance(secret, str):
            found.append(User(name=name, db=db, secret=secret, key=ref.get("key") or "password"))
    return found


def connection_secret_name(database: str, user: User) -> str:
    """``<database>-<db>-<user>``, made a valid object name the way the real operator does
    (lower case, ``_`` and other characters outside ``[a-z0-9.-]`` become ``-``)."""
    raw = f"{database}-{user.db}-{user.name}".lower()
    return "".join(c if (c.isalnum() and c.isascii()) or c in ".-" else "-" for c in raw)


def password_of(secret: JSON | None, key: str) -> str | None:
    """The decoded value of ``data[key]``; None when the Secret or the key is missing."""
    value = ((secret or {}).get("data") or {}).get(key)
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def connection_strings(obj: JSON, user: User, password: str) -> dict[str, str]:
    """The connection-string Secret's data (plain text), shaped like the real operator's."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "")
    service = f"{name}-svc.{namespace}.svc.cluster.local"
    members = spec.get("members")
    count = members if isinstance(members, int) and members > 0 else 1
    hosts = ",".join(f"{name}-{i}.{service}:27017" for i in range(count))
    creds = f"{user.name}:{password}"
    options = f"{user.db}?replicaSet={name}&ssl=false"
    return {
        "connectionString.standard": f"mongodb://{creds}@{hosts}/{options}",
        "connectionString.standardSrv": f"mongodb+srv://{creds}@{service}/{options}",
        "username": user.name,
        "password": password,
    }


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What the operator wants for one database, given the Secrets of its namespace."""

    #: None when every password is there, else why the database stays Pending.
    waiting: str | None
    #: name -> the connection-string Secret to hold (empty while waiting).
    secrets: dict[str, JSON] = field(default_factory=dict)


def plan(obj: JSON, secrets: Mapping[str, JSON]) -> Plan:
    """Pure: ``secrets`` are the Secrets of the database's namespace, by name."""
    meta = obj.get("metadata") or {}
    missing, wanted = [], {}
    for user in users_of(obj):
        password = password_of(secrets.get(user.secret), user.key)
        if password is None:
            missing.append(f"{user.secret} (key {user.key})")
            continue
        name = connection_secret_name(meta.get("name", ""), user)
        data = connection_strings(obj, user, password)
        wanted[name] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": meta.get("namespace", ""),
                "labels": {LABEL_DATABASE: meta.get("name", "")},
            },
            "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
    if missing:
        return Plan(waiting=f"waiting for the password Secret {', '.join(missing)}")
    return Plan(waiting=None, secrets=wanted)


def desired_status(obj: JSON, *, running: bool, message: str | None = None) -> dict[str, Any]:
    """The status the operator writes on ``obj``: Pending (no member ready) or Running."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    status = {
        "phase": "Running" if running else "Pending",
        "message": "" if running else message or "",
        "version": spec.get("version"),
        "currentMongoDBMembers": spec.get("members") if running else 0,
        "observedGeneration": meta.get("generation"),
        "mongoUri": mongo_uri(meta.get("namespace", ""), meta.get("name", "")),
    }
    return {k: v for k, v in status.items() if v is not None}


def _key(obj: JSON) -> Key | None:
    meta = obj.get("metadata") or {}
    if not meta.get("namespace") or not meta.get("name"):
        return None
    return str(meta["namespace"]), str(meta["name"])


class _Secrets:
    """The secrets cache's handler: a change of a Secret re-queues its namespace's databases."""

    def __init__(self, operator: MongoOperator) -> None:
        self._operator = operator

    def on_upsert(self, obj: JSON) -> None:
        self._operator.secret_changed(obj)

    def on_delete(self, obj: JSON) -> None:
        self._operator.secret_changed(obj)


class MongoOperator:
    """Writes :func:`desired_status` on every MongoDBCommunity of ``cluster_url`` (a cluster's or
    a kcp workspace's URL), and the connection-string Secrets of :func:`plan`, until :meth:`run`
    is cancelled.

    ``say``: where a line per write goes (the story prints them); ``writes`` counts them.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        cluster_url: str,
        ready_after: float = 3.0,
        say: Callable[[str], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self._cluster = cluster_url.rstrip("/")
        self._api = f"{self._cluster}/{API}"
        self._ready_after = ready_after
        self._say = say or (lambda line: log.info("%s", line))
        self._clock = clock or SystemClock()
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._first_seen: dict[Key, float] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self.writes = 0
        self.cache: Cache[Key] = Cache(key=_key, handler=self)
        self.secrets: Cache[Key] = Cache(key=_key, handler=_Secrets(self))
        self.reflector = self._reflector("mongodb operator", f"{self._api}/{PLURAL}", self.cache)
        self.secret_reflector = self._reflector(
            "mongodb operator secrets", f"{self._cluster}/api/v1/secrets", self.secrets
        )

    def _reflector(self, name: str, url: str, cache: Cache[Key]) -> Reflector[Cache[Key]]:
        return Reflector(
            name=name,
            client=self._client,
            url=url,
            handler=cache,
            clock=self._clock,
            watch_timeout=60,
            backoff=Backoff(initial=0.5, maximum=5.0),
        )

    # --- CacheHandler ---------------------------------------------------------------------------

    def on_upsert(self, obj: JSON) -> None:
        key = _key(obj)
        if key is not None:
            self._queue.put_nowait(key)

    def on_delete(self, obj: JSON) -> None:
        key = _key(obj)
        if key is not None:
            self._first_seen.pop(key, None)
            self._queue.put_nowait(key)  # its connection-string Secrets go

    def secret_changed(self, obj: JSON) -> None:
        key = _key(obj)
        if key is None:
            return
        owner = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_DATABASE)
        if owner:
            self._queue.put_nowait((key[0], str(owner)))
        for db in list(self.cache.objects):
            if db[0] == key[0]:
                self._queue.put_nowait(db)

    # --- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.reflector.run(), name="mongodb operator reflector")
                group.create_task(self.secret_reflector.run(), name="mongodb operator secrets")
                group.create_task(self._work(), name="mongodb operator worker")
        finally:
            for timer in self._timers:
                timer.cancel()

    def _later(self, delay: float, key: Key) -> None:
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.discard(timer)
            self._queue.put_nowait(key)

        timer = loop.call_later(delay, fire)
        self._timers.add(timer)

    def _namespace_secrets(self, namespace: str) -> dict[str, JSON]:
        return {name: obj for (ns, name), obj in self.secrets.objects.items() if ns == namespace}

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                await self._reconcile(key)
            except (ApiError, UpstreamUnavailable) as e:
                log.warning("operator: %s/%s not reconciled: %s", *key, e)
                self._later(1.0, key)

    async def _reconcile(self, key: Key) -> None:
        namespace, name = key
        obj = self.cache.get(key)
        secrets = self._namespace_secrets(namespace)
        gone = obj is None or bool((obj.get("metadata") or {}).get("deletionTimestamp"))
        wanted = Plan(waiting="deleted") if gone or obj is None else plan(obj, secrets)
        # connection-string Secrets of this database that are not wanted (any more)
        for secret_name, secret in secrets.items():
            labels = (secret.get("metadata") or {}).get("labels") or {}
            if labels.get(LABEL_DATABASE) == name and secret_name not in wanted.secrets:
                if wanted.waiting is not None and not gone:
                    continue  # keep the last good one while a password is briefly missing
                await self._client.delete(
                    f"{self._cluster}/api/v1/namespaces/{namespace}/secrets/{secret_name}",
                    uid=(secret.get("metadata") or {}).get("uid"),
                )
                self._say(f"operator: deleted Secret {namespace}/{secret_name}")
        if gone or obj is None:
            return
        now = self._clock.monotonic()
        if wanted.waiting is None:
            left = self._ready_after - (now - self._first_seen.setdefault(key, now))
        else:
            self._first_seen.pop(key, None)  # the members wait for the password
            left = self._ready_after
        if left > 0 and wanted.waiting is None:
            self._later(left, key)
        running = left <= 0 and wanted.waiting is None
        if running:
            for secret_name, manifest in wanted.secrets.items():
                have = secrets.get(secret_name) or {}
                if have.get("data") == manifest["data"]:
                    continue
                await self._client.apply(
                    f"{self._cluster}/api/v1/namespaces/{namespace}/secrets/{secret_name}",
                    manifest,
                    field_manager=FIELD_MANAGER,
                )
                self.writes += 1
                self._say(f"operator: wrote Secret {namespace}/{secret_name}")
        want = desired_status(obj, running=running, message=wanted.waiting)
        have_status = obj.get("status") or {}
        if all(have_status.get(f) == value for f, value in want.items()):
            return
        url = f"{self._api}/namespaces/{namespace}/{PLURAL}/{name}/status"
        await self._client.merge_patch(url, {"status": want})
        self.writes += 1
        self._say(f"operator: {namespace}/{name} is {want['phase']}")
