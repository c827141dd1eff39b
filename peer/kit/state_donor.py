"""``StateDonor``: the donor side of state sync, serving this peer's current state to joiners
(``GET /state/index``, ``GET /state/shard``; 409 for a version that is no longer current). The
tensors of a version must not change in place while it is current (README.md of peer, "kit.statesync")."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

import torch
from aiohttp import web

from gossamer.peer.kit.statesync import (
    INDEX_PATH,
    SHARD_PATH,
    StateGetter,
    index_digest,
    plan_shards,
    state_index,
)
from gossamer.transport.http_server import stream_tensors

_DECIMAL = re.compile(r"[0-9]{1,18}")


def _shard_params(query: Mapping[str, str]) -> tuple[int, int, int] | str:
    """(version, count, index) from the query, or the message explaining what is wrong."""
    values = []
    for field in ("version", "count", "index"):
        raw = query.get(field)
        if raw is None or not _DECIMAL.fullmatch(raw):
            return f"query parameter {field!r} must be a non-negative decimal int, got {raw!r}"
        values.append(int(raw))
    version, count, index = values
    if count < 1:
        return f"query parameter 'count' must be at least 1, got {count}"
    if index >= count:
        return f"query parameter 'index' must be below 'count'={count}, got {index}"
    return version, count, index


class StateDonor:
    """Serves this peer's current state to joiners: the index and digest, and one shard per request.

    ``get_state`` returns the current version and its tensors (on any device); it is called on the
    event loop for every request and must be cheap. Hashing runs in a worker thread, once per version.
    """

    def __init__(self, get_state: StateGetter) -> None:
        self._get_state = get_state
        self._lock = asyncio.Lock()
        self._cached: tuple[int, dict[str, Any], str] | None = None

    def routes(self) -> list[web.RouteDef]:
        """``GET /state/index`` and ``GET /state/shard``, to add to the daemon's app."""
        return [web.get(INDEX_PATH, self._handle_index), web.get(SHARD_PATH, self._handle_shard)]

    async def published(self) -> tuple[int, str]:
        """The current version and its index digest: what this peer publishes in its record."""
        version, _, _, digest = await self._current()
        return version, digest

    async def _current(self) -> tuple[int, Mapping[str, torch.Tensor], dict[str, Any], str]:
        async with self._lock:
            version, tensors = self._get_state()
            if self._cached is None or self._cached[0] != version:
                index = await asyncio.to_thread(state_index, version, tensors)
                self._cached = (version, index, index_digest(index))
            _, index, digest = self._cached
        return version, tensors, index, digest

    async def _handle_index(self, request: web.Request) -> web.Response:
        _, _, index, digest = await self._current()
        return web.json_response({"index": index, "digest": digest})

    async def _handle_shard(self, request: web.Request) -> web.StreamResponse:
        params = _shard_params(request.query)
        if isinstance(params, str):
            return web.json_response({"error": params}, status=400)
        version, count, shard = params
        current, tensors, index, _ = await self._current()
        if version != current:
            return web.json_response({"error": f"state version {version} is not current: this donor is at {current}",
                                      "version": current}, status=409)
        num_tensors = len(index["tensors"])
        if count > max(num_tensors, 1):
            message = f"query parameter 'count'={count} exceeds the number of tensors ({num_tensors})"
            return web.json_response({"error": message}, status=400)
        names = plan_shards(index, count)[shard]
        metadata = {"version": str(version), "shard": f"{shard}/{count}"}
        return await stream_tensors(request, {name: tensors[name] for name in names}, metadata=metadata)
