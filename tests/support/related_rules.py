"""The related-resource rules the property tests of claimed objects share: Secrets referenced
by a MongoDBCommunity's ``spec.users[*].secret``, and Secrets labelled ``region=eu``.

Two rules of the two kinds a slice can declare (``referencedBy`` and ``selector``), so that a
random reference graph exercises "visible iff a visible object references it or the selector
matches it" through both."""

from __future__ import annotations

from typing import Any

SECRETS = ("", "secrets")
MONGO = ("mongodbcommunity.mongodb.com", "mongodbcommunity")

SECRET_RULES: list[dict[str, Any]] = [
    {
        "resource": "secrets",
        "referencedBy": {
            "path": "spec.users[*].secret",
            "group": MONGO[0],
            "version": "v1",
            "resource": MONGO[1],
        },
    },
    {"resource": "secrets", "selector": {"matchLabels": {"region": "eu"}}},
]
