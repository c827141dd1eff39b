"""Fault injection for a ``LocalNet``: the faults its ``fail``, ``slow`` and ``crash`` declared by
(peer, step, operation) (``FaultPlan``), applied where a peer's traffic comes in (``Faults``), never
by subclassing a role's internals (torchft's ``EventInjector`` is the model)."""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gossamer.crypto.envelope import ReplayGuard
from gossamer.crypto.errors import VerificationError
from gossamer.peer.kit.messaging import ENVELOPE_HEADER
from gossamer.transport.frames import Frame
from gossamer.transport.tcp import HandlerError

if TYPE_CHECKING:
    from gossamer_harness.localnet import LocalNet


@dataclass
class FaultPlan:
    """The faults declared so far, by (peer name, step, operation or phase)."""

    keys: set[tuple[str, int, str]] = field(default_factory=set)  # the receiver refuses these
    slow: dict[tuple[str, int | None, str], float] = field(default_factory=dict)  # (sender, step, op) -> s
    crash: dict[tuple[str, int, str], int] = field(default_factory=dict)  # (sender, step, op) -> let through
    expire: set[str] = field(default_factory=set)  # crashing peers whose records go at once

    def delay(self, sender: str, step: int, op: str) -> float:
        return self.slow.get((sender, step, op), self.slow.get((sender, None, op), 0.0))

    def crashes(self, sender: str, step: int, op: str) -> bool:
        """Whether this message of ``sender`` is the one its crash comes at (counting it through)."""
        left = self.crash.get((sender, step, op))
        if left is None:
            return False
        self.crash[sender, step, op] = left - 1
        return left <= 0

    def hit(self, name: str, step: Any, op: Any) -> bool:
        try:
            return (name, int(step), str(op)) in self.keys
        except (TypeError, ValueError):
            return False


class Faults:
    """The fault injection of one ``LocalNet``: what was declared, and where it is applied: a TCP
    frame (``check_frame``), an HTTP request (``middleware``: the receiver's own faults first, then
    the faults of the request's signed sender) and a phase a role marks (``fault_point``). What each
    fault does: the ``LocalNet`` docstring. A crash kills the peer as another process would: in the
    background, through ``LocalNet.kill``."""

    def __init__(self, net: LocalNet) -> None:
        self.net = net
        self.plan = FaultPlan()

    def fail(self, name: str, step: int, op: str) -> None:
        self.plan.keys.add((name, step, op))

    def slow(self, name: str, seconds: float, *, op: str, step: int | None = None) -> None:
        self.plan.slow[name, step, op] = seconds

    def crash(self, name: str, step: int, op: str, *, after: int = 0, expire: bool = False) -> None:
        self.plan.crash[name, step, op] = after
        if expire:
            self.plan.expire.add(name)

    def check_frame(self, name: str, frame: Frame) -> None:
        """Refuse a TCP frame to peer ``name`` whose header's (step, op) it was told to fail."""
        step, op = frame.header.get("step"), frame.header.get("op")
        if self.plan.hit(name, step, op):
            raise HandlerError(f"injected fault: {name} step {step} {op}")

    def middleware(self, name: str):
        """The aiohttp middleware in front of peer ``name``'s HTTP server."""

        @web.middleware
        async def middleware(request: web.Request, handler):
            info = request.match_info
            step, op = info.get("round", info.get("step")), info.get("kind", request.path)
            if step is not None and self.plan.hit(name, step, op):
                raise web.HTTPServiceUnavailable(text="injected fault")
            sender_faults = bool(self.plan.slow or self.plan.crash) and step is not None and step.isdigit()
            sender = self._sender_name(name, request) if sender_faults else None  # a signature check
            if sender is not None:
                await self._sender_faults(sender, int(step), op)
            return await handler(request)

        return middleware

    async def _sender_faults(self, sender: str, step: int, op: str) -> None:
        """A message of ``sender`` came in: refuse it if the sender is dead or crashes at it (the
        crash starts now), hold it if the sender is slow."""
        peers = self.net.peers
        if not peers[sender].alive or self.plan.crashes(sender, step, op):
            if peers[sender].alive:
                self.net.background(self._crash(sender), name=f"localnet-crash-{sender}")
            raise web.HTTPServiceUnavailable(text="injected fault: the sender crashed")
        delay = self.plan.delay(sender, step, op)
        if delay:
            await asyncio.sleep(delay)  # the injected slowness itself, not a synchronisation

    async def fault_point(self, name: str, phase: str, step: int) -> None:
        """A role of ``name`` reached ``phase`` of ``step``: if the peer crashes there, it is killed
        (in the background, as by another process) and this never returns: the kill cancels it; if
        it is slow there (``slow(name, seconds, op=phase)``), the role stalls that long."""
        if self.net.peers[name].alive and self.plan.crashes(name, step, phase):
            self.net.background(self._crash(name), name=f"localnet-crash-{name}")
            await asyncio.Event().wait()  # the dead process's last instruction; ended by the kill
        delay = self.plan.delay(name, step, phase)
        if delay:
            await asyncio.sleep(delay)  # the injected stall itself (a stuck disk, a busy host)

    async def _crash(self, name: str) -> None:
        await self.net.kill(name)
        if name in self.plan.expire:
            self.net.forget(name)
            async with self.net.view_refreshed:
                self.net.view_refreshed.notify_all()

    def _sender_name(self, receiver: str, request: web.Request) -> str | None:
        """The net's name of the peer that signed the request's envelope (its signature checked), or
        None (no envelope, a bad one, or an outsider)."""
        net = self.net
        text = request.headers.get(ENVELOPE_HEADER, "")
        try:
            envelope = ReplayGuard().check(base64.b64decode(text, validate=True), me=net.peers[receiver].peer_id,
                                           run_id=net.manifest.run_id, method=request.method,
                                           target=request.rel_url.raw_path_qs, now=net.now())
        except (VerificationError, ValueError, binascii.Error):
            return None
        return next((n for n, peer in net.peers.items() if peer.peer_id == envelope.sender), None)
