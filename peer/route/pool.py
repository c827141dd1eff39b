"""``HopPool``: calling the next hop of a route over pooled TCP connections, with a budget smaller
than the caller's own, so a hop that hangs is reported by the host just before it; every failure
becomes a ``failed_hop`` answer naming it."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping

import torch

from gossamer.peer.route.wire import Hop, failed_hop_frame, request_frame
from gossamer.transport.errors import ConnectionClosed, RemoteError, TransportError
from gossamer.transport.frames import Frame
from gossamer.transport.tcp import ConnectFailed, TcpConfig, TcpConnection, tcp_connect

log = logging.getLogger(__name__)
MAX_MARGIN_S = 1.0


def hop_margin(budget_s: float) -> float:
    """Budget kept back at each hop: 10% of what is left, at most MAX_MARGIN_S."""
    return min(MAX_MARGIN_S, 0.1 * budget_s)


def split_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) -> (host, port); ValueError when malformed."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address {addr[:80]!r} is not host:port")
    return host.strip("[]"), int(port)


class HopPool:
    """Connections to next hops, reused; ``call`` answers a failed hop instead of raising."""

    def __init__(self, *, config: TcpConfig = TcpConfig(), max_connections: int = 64) -> None:
        self._config = config
        self._max = max_connections
        self._connections: OrderedDict[str, TcpConnection] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    async def call(self, method: str, *, run_id: str, request_id: str, route: tuple[Hop, ...],
                   tensors: Mapping[str, torch.Tensor], budget_s: float) -> Frame:
        """Send ``tensors`` along ``route`` (its first hop receives them) and return the answer frame."""
        hop = route[0]
        margin = hop_margin(budget_s)
        if budget_s - margin <= 0:
            return failed_hop_frame(hop.addr, "the route's time budget is used up")
        frame = request_frame(method, run_id=run_id, request_id=request_id, route=route,
                              budget_s=budget_s - margin, tensors=tensors)
        wait_s = budget_s - margin / 2
        for attempt in range(2):
            reused = False
            try:
                connection, reused = await self._connection(hop.addr)
                return await connection.request(frame, timeout_s=wait_s)
            except RemoteError as exc:
                return failed_hop_frame(hop.addr, f"refused: {exc}")
            except ConnectionClosed as exc:
                await self._drop(hop.addr)
                if attempt == 0 and reused:
                    continue  # a pooled connection the hop had closed meanwhile
                return failed_hop_frame(hop.addr, f"connection failed: {exc}")
            except (TransportError, ValueError) as exc:
                await self._drop(hop.addr)
                return failed_hop_frame(hop.addr, f"{type(exc).__name__}: {exc}")
        raise AssertionError("unreachable")

    async def ask(self, addr: str, frame: Frame, *, timeout_s: float) -> Frame:
        """One plain request to ``addr`` on a pooled connection; transport errors propagate."""
        try:
            connection, _reused = await self._connection(addr)
            return await connection.request(frame, timeout_s=timeout_s)
        except ValueError as exc:
            raise ConnectFailed(str(exc)) from exc
        except RemoteError:
            raise
        except TransportError:
            await self._drop(addr)
            raise

    async def _connection(self, addr: str) -> tuple[TcpConnection, bool]:
        if self._closed:
            raise ConnectionClosed("the hop pool is closed")
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            existing = self._connections.get(addr)
            if existing is not None and not existing.closed:
                self._connections.move_to_end(addr)
                return existing, True
            host, port = split_addr(addr)
            connection = await tcp_connect(host, port, config=self._config)
            self._connections[addr] = connection
            while len(self._connections) > self._max:
                _, oldest = self._connections.popitem(last=False)
                await oldest.aclose()
            return connection, False

    async def _drop(self, addr: str) -> None:
        connection = self._connections.pop(addr, None)
        if connection is not None:
            await connection.aclose()

    async def aclose(self) -> None:
        """Close every pooled connection (idempotent)."""
        self._closed = True
        while self._connections:
            _, connection = self._connections.popitem()
            await connection.aclose()
