"""The demo MongoDB operator's pure parts (devenv/mongo_operator.py): users, the password check,
the connection-string Secrets and the status it writes."""

from __future__ import annotations

import base64
from typing import Any

from devenv.mongo_operator import (
    LABEL_DATABASE,
    User,
    connection_secret_name,
    desired_status,
    password_of,
    plan,
    users_of,
)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def database(users: list[Any], *, members: int = 3) -> dict[str, Any]:
    return {
        "metadata": {"name": "orders-db", "namespace": "ns", "generation": 2},
        "spec": {"members": members, "version": "6.0.5", "users": users},
    }


ADMIN = {"name": "admin", "db": "admin", "passwordSecretRef": {"name": "admin-pw"}}


def secret(name: str, **data: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "data": {k: b64(v) for k, v in data.items()},
    }


def test_users_defaults_the_key_and_skips_malformed_entries() -> None:
    users = [
        ADMIN,
        {"name": "x"},
        "junk",
        {"name": "u", "db": "d", "passwordSecretRef": {"name": "s", "key": "k"}},
    ]
    assert users_of(database(users)) == [
        User(name="admin", db="admin", secret="admin-pw"),
        User(name="u", db="d", secret="s", key="k"),
    ]
    assert users_of({"spec": {}}) == []


def test_connection_secret_name_is_database_db_user_as_a_valid_name() -> None:
    assert connection_secret_name("orders-db", User(name="admin", db="admin", secret="s")) == (
        "orders-db-admin-admin"
    )
    assert connection_secret_name("Orders", User(name="my_user", db="a b", secret="s")) == (
        "orders-a-b-my-user"
    )


def test_password_of_decodes_and_rejects_missing_or_bad_data() -> None:
    assert password_of(secret("s", password="pw"), "password") == "pw"
    assert password_of(secret("s", other="pw"), "password") is None
    assert password_of(None, "password") is None
    assert password_of({"data": {"password": "%%%"}}, "password") is None


def test_pending_with_a_message_until_every_password_is_there() -> None:
    obj = database([ADMIN])
    waiting = plan(obj, {})
    assert waiting.waiting is not None and "admin-pw (key password)" in waiting.waiting
    assert waiting.secrets == {}
    wrong_key = plan(obj, {"admin-pw": secret("admin-pw", pass_="x")})
    assert wrong_key.waiting is not None
    status = desired_status(obj, running=False, message=waiting.waiting)
    assert status["phase"] == "Pending" and status["message"] == waiting.waiting
    assert status["currentMongoDBMembers"] == 0


def test_the_connection_string_secret_follows_the_password() -> None:
    obj = database([ADMIN], members=2)
    ready = plan(obj, {"admin-pw": secret("admin-pw", password="s3cret")})
    assert ready.waiting is None
    ((name, manifest),) = ready.secrets.items()
    assert name == "orders-db-admin-admin"
    assert manifest["metadata"] == {
        "name": name,
        "namespace": "ns",
        "labels": {LABEL_DATABASE: "orders-db"},
    }
    data = {k: base64.b64decode(v).decode() for k, v in manifest["data"].items()}
    service = "orders-db-svc.ns.svc.cluster.local"
    assert data == {
        "connectionString.standard": f"mongodb://admin:s3cret@orders-db-0.{service}:27017,"
        f"orders-db-1.{service}:27017/admin?replicaSet=orders-db&ssl=false",
        "connectionString.standardSrv": f"mongodb+srv://admin:s3cret@{service}/admin"
        "?replicaSet=orders-db&ssl=false",
        "username": "admin",
        "password": "s3cret",
    }
    changed = plan(obj, {"admin-pw": secret("admin-pw", password="new")})
    assert changed.secrets[name]["data"]["password"] == b64("new")
    assert desired_status(obj, running=True)["message"] == ""


def test_a_database_without_users_needs_no_secret() -> None:
    ready = plan(database([]), {})
    assert ready.waiting is None and ready.secrets == {}
