"""``Links``: a cp-shard's signed frames to and from the other shards. An arriving frame passes
``wire``'s checks in order (bound, envelope, live sender with that key) before its handler sees
it; a refusal is counted by code and changes nothing. Sends reuse one pooled connection per peer."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from gossamer.crypto.envelope import ReplayGuard
from gossamer.peer.role import RoleContext
from gossamer.peer.route.pool import HopPool
from gossamer.protocols.context.attempt import Attempt
from gossamer.protocols.context.core import MessageRefused
from gossamer.protocols.context.membership import Ring
from gossamer.protocols.context.wire import (
    FrameRefused,
    Opened,
    Outbound,
    clear_header,
    frame_for,
    open_frame,
)
from gossamer.transport.errors import RemoteError, TransportError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import HandlerError, TcpConfig

Handler = Callable[[Opened], Coroutine[Any, Any, dict[str, Any]]]


class Links:
    """The frames of one shard: what it accepts, what it sends, and the refusals it counted."""

    def __init__(self, ctx: RoleContext, ring: Ring, *, connect_timeout_s: float,
                 spawn: Callable[..., asyncio.Task[Any]]) -> None:
        self.ctx = ctx
        self.ring = ring
        self.pool = HopPool(config=TcpConfig(connect_timeout_s=connect_timeout_s))
        self.guard = ReplayGuard(started_at=ctx.now())  # envelopes stamped before this start are refused
        self.refused: Counter[str] = Counter()
        self._spawn = spawn

    async def aclose(self) -> None:
        await self.pool.aclose()

    # -- arrivals -------------------------------------------------------------------------------

    async def serve(self, frame: Frame, *, bound: Callable[[str], int], handlers: Mapping[str, Handler]) -> Frame:
        """Open ``frame`` (at most ``bound(op)`` payload bytes), hand it to its op's handler, and
        answer with what the handler returns; a refusal is answered as an error naming its check."""
        try:
            op, _step = clear_header(frame)
            opened = open_frame(frame, guard=self.guard, me=self.ring.me, run_id=self.ctx.manifest.run_id,
                                now=self.ctx.now(), max_payload=bound(op), sender_ok=self._live_shard)
            answer = await handlers[op](opened)
        except (FrameRefused, MessageRefused) as exc:
            self.refused[exc.code] += 1
            raise HandlerError(f"refused ({exc.code}): {exc}") from exc
        self.ctx.traffic.add_received(f"context_{op}", opened.payload_bytes)
        return Frame(FrameType.RESPONSE, answer)

    def _live_shard(self, peer_id: str, public_key: bytes) -> bool:
        live = self.ring.live(peer_id)
        return live is not None and live.record.public_key == public_key

    # -- sends ----------------------------------------------------------------------------------

    async def ask(self, peer_id: str, signed: Outbound, *, timeout_s: float) -> Frame:
        """``signed`` to ``peer_id`` (a live cp-shard) and its answer; LookupError when it is not
        live, transport errors (RemoteError for a refusal) as they come."""
        live = self.ring.live(peer_id)
        if live is None or not live.record.tcp_addr:
            raise LookupError(f"{peer_id[:12]} is not a live cp-shard")
        frame = frame_for(signed, self.ctx.identity, recipient=peer_id, run_id=self.ctx.manifest.run_id,
                          now=self.ctx.now())
        return await self.pool.ask(live.record.tcp_addr, frame, timeout_s=max(timeout_s, 1e-3))

    def post(self, attempt: Attempt, target: str, signed: Outbound) -> None:
        """Send ``signed`` to ``target`` in the background, within what is left of the attempt's
        deadline; a failure aborts the attempt (see ``send_failed``)."""
        async def send() -> None:
            size = sum(memoryview(part).nbytes for part in signed.payload) if isinstance(signed.payload, list | tuple) \
                else memoryview(signed.payload).nbytes
            try:
                await self.ask(target, signed, timeout_s=attempt.remaining_s())
            except (TransportError, LookupError) as exc:
                send_failed(attempt, target, signed.op, exc)
                return
            attempt.ledger.bytes_sent += size
            self.ctx.traffic.add_sent(f"context_{signed.op}", size)

        attempt.track(self._spawn(send(), name=f"send {signed.op} to {target[:12]}"))


def send_failed(attempt: Attempt, target: str, op: str, exc: TransportError | LookupError) -> None:
    """Abort ``attempt`` because a send of ``op`` to ``target`` failed: a refusal names no suspect,
    an unreachable target is suspected."""
    if isinstance(exc, RemoteError):
        attempt.abort(f"{target[:12]} refused our {op}: {str(exc)[:200]}")
        return
    attempt.ledger.coefficients.send_failures[target] = f"{op}: {type(exc).__name__}: {str(exc)[:160]}"
    attempt.abort(f"could not send {op} to {target[:12]}: {type(exc).__name__}", suspect=target)
