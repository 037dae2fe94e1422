"""Plain REST calls the kcp e2e tests make past vwserver (as kcp-admin), on a shared session."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

MERGE_PATCH = "application/merge-patch+json"


class RestCalls:
    """Mixed into a test world that holds an authenticated ``session``."""

    session: aiohttp.ClientSession

    def session_for(self, url: str) -> aiohttp.ClientSession:
        """The session whose credentials ``url``'s server accepts (one server: ``session``)."""
        return self.session

    async def call(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        ctype: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """The status and the decoded body (JSON objects decoded, anything else as text)."""
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": ctype} if body is not None else {}
        session = self.session_for(url)
        async with session.request(
            method, url, data=data, headers=headers, params=params or {}
        ) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text.startswith("{") else text)

    async def get(self, url: str) -> dict[str, Any] | None:
        """The object at ``url``, None when it does not exist."""
        status, body = await self.call("GET", url)
        if status == 404:
            return None
        assert status == 200, f"GET {url}: {status} {body}"
        result: dict[str, Any] = body
        return result
