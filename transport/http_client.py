"""``HttpClient``: bulk objects and small JSON endpoints on one aiohttp session; every call under a
whole-call, connect and per-read deadline, every aiohttp and OS error translated into
``transport.errors`` here (README.md, "Errors: what is translated where")."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import torch

from gossamer.transport.errors import (
    ConnectionClosed,
    LimitExceeded,
    RemoteError,
    TransportError,
    TransportTimeout,
)
from gossamer.transport.http import HttpConfig, parse_json, read_exactly
from gossamer.transport.safetensors_stream import decode_safetensors, encode_safetensors
from gossamer.transport.tcp_client import ConnectFailed

MAX_ERROR_BODY_BYTES = 2048


@contextlib.asynccontextmanager
async def _translated(method: str, url: str) -> AsyncIterator[None]:
    """Translate aiohttp / OS / timeout errors raised inside into transport errors."""
    where = f"{method} {url}"
    try:
        yield
    except TimeoutError as exc:  # asyncio's, aiohttp's ServerTimeoutError and ConnectionTimeoutError
        raise TransportTimeout(f"{where}: timed out") from exc
    except aiohttp.ClientConnectorError as exc:
        raise ConnectFailed(f"{where}: cannot connect: {exc}") from exc
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, OSError) as exc:
        raise ConnectionClosed(f"{where}: connection lost: {exc}") from exc
    except aiohttp.ClientError as exc:
        raise TransportError(f"{where}: {exc}") from exc


class HttpClient:
    """One aiohttp session with caps, deadlines and translated errors; see the module docstring."""

    def __init__(self, session: aiohttp.ClientSession, config: HttpConfig) -> None:
        self._session = session
        self._config = config

    @classmethod
    async def create(cls, *, config: HttpConfig = HttpConfig()) -> HttpClient:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s,
                                        sock_read=config.idle_timeout_s)
        connector = aiohttp.TCPConnector(limit=config.max_connections, keepalive_timeout=config.client_keepalive_s)
        session = aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=config.chunk_bytes,
                                        auto_decompress=False, trust_env=False)
        return cls(session, config)

    async def aclose(self) -> None:
        """Close the session and its connections (idempotent)."""
        await self._session.close()

    async def get_json(self, url: str) -> Any:
        return parse_json(await self._request("GET", url, max_bytes=self._config.max_json_bytes))

    async def post_json(self, url: str, obj: Any) -> Any:
        """POST ``obj`` as JSON; the decoded JSON answer (None for an empty body)."""
        body = json.dumps(obj).encode("utf-8")
        answer = await self._request("POST", url, data=body, max_bytes=self._config.max_json_bytes,
                                     headers={"Content-Type": "application/json"})
        return parse_json(answer) if len(answer) else None

    async def get_bytes(self, url: str) -> bytearray | memoryview:
        return await self._request("GET", url, max_bytes=self._config.max_body_bytes)

    async def put_bytes(self, url: str, data: bytes | bytearray | memoryview,
                        *, extra_headers: Mapping[str, str] | None = None) -> Any:
        """PUT raw bytes (streamed in slices); the decoded JSON answer (None for an empty body)."""
        view = memoryview(data).cast("B")
        return await self._put_stream(url, view.nbytes, [view], extra_headers)

    async def get_tensors(self, url: str, *, require_finite: bool = False
                          ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Download a safetensors body; DecodeError (or NonFiniteTensor) if it is bad."""
        limits = self._config.limits
        cap = min(self._config.max_body_bytes, limits.max_payload_bytes + limits.max_header_bytes + 8)
        body = await self._request("GET", url, max_bytes=cap)
        return decode_safetensors(body, limits=limits, require_finite=require_finite)

    async def put_tensors(self, url: str, tensors: Mapping[str, torch.Tensor],
                          metadata: dict[str, str] | None = None, *,
                          extra_headers: Mapping[str, str] | None = None) -> Any:
        """Upload ``tensors`` as a streamed safetensors body; the decoded JSON answer ({} if empty)."""
        total_bytes, chunks = encode_safetensors(tensors, metadata)
        return await self.put_body(url, total_bytes, chunks, extra_headers=extra_headers)

    async def put_body(self, url: str, total_bytes: int, chunks: list[memoryview], *,
                       extra_headers: Mapping[str, str] | None = None) -> Any:
        """Upload a body already encoded as ``chunks`` (``total_bytes`` in all), streamed; the
        decoded JSON answer ({} if empty)."""
        answer = await self._put_stream(url, total_bytes, chunks, extra_headers)
        return {} if answer is None else answer

    # --- plumbing ---------------------------------------------------------------------------

    async def _put_stream(self, url: str, total_bytes: int, chunks: list[memoryview],
                          extra_headers: Mapping[str, str] | None) -> Any:
        headers = {**(extra_headers or {}), "Content-Type": "application/octet-stream",
                   "Content-Length": str(total_bytes)}
        answer = await self._request("PUT", url, data=self._slices(chunks), headers=headers,
                                     max_bytes=self._config.max_json_bytes)
        return parse_json(answer) if len(answer) else None

    async def _slices(self, chunks: list[memoryview]) -> AsyncIterator[memoryview]:
        step = self._config.chunk_bytes
        for chunk in chunks:
            view = chunk.cast("B") if chunk.format != "B" else chunk
            for offset in range(0, view.nbytes, step):
                yield view[offset:offset + step]

    async def _request(self, method: str, url: str, *, max_bytes: int, data: Any = None,
                       headers: Mapping[str, str] | None = None) -> bytearray | memoryview:
        async with _translated(method, url), asyncio.timeout(self._config.request_timeout_s):
            async with self._session.request(method, url, data=data, headers=headers) as response:
                if response.status >= 400:
                    raise await _remote_error(method, url, response)
                return await self._read_body(response, max_bytes)

    async def _read_body(self, response: aiohttp.ClientResponse, max_bytes: int) -> bytearray | memoryview:
        size = response.content_length
        if size is None:
            raise TransportError(f"{response.method} {response.url}: response has no Content-Length")
        if size > max_bytes:
            raise LimitExceeded(f"{response.method} {response.url}: body of {size} bytes exceeds the cap of {max_bytes}")
        return await read_exactly(response.content, size, idle_timeout_s=self._config.idle_timeout_s)


async def _remote_error(method: str, url: str, response: aiohttp.ClientResponse) -> RemoteError:
    snippet = await response.content.read(MAX_ERROR_BODY_BYTES)
    text = snippet.decode("utf-8", "replace").strip()
    return RemoteError(f"{method} {url}: HTTP {response.status} {response.reason}: {text}", status=response.status)
