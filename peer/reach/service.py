"""``Reach``: what one daemon does about reachability, in one object the daemon holds.

It answers others' dial-back requests (``dialback``), tests this peer (``selftest``) as soon as
another live peer is in the view and then every ``every_s``, and says what the record announces
(``reachability``) and what ``/status`` shows (``status``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from aiohttp import web

from gossamer.crypto.identity import Identity
from gossamer.peer.reach.dialback import DialBack, DialBackLimits
from gossamer.peer.reach.selftest import SelfTest, private_line
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.records import PRIVATE, PeerRecord, seal_record
from gossamer.peer.run.view import PeerView
from gossamer.transport.frames import Frame
from gossamer.transport.http_client import HttpClient


class Reach:
    """One daemon's dial-back service and self-test; ``start`` runs the test loop, ``aclose`` ends it."""

    def __init__(self, *, identity: Identity, admission: Admission, ttl_s: float, now: Callable[[], float],
                 http_client: HttpClient, view: PeerView, view_refreshed: asyncio.Condition,
                 direct_record: Callable[[], PeerRecord], announce: Callable[[], None],
                 every_s: float = 300.0, limits: DialBackLimits = DialBackLimits()) -> None:
        self._identity = identity
        self._view = view
        self._view_refreshed = view_refreshed
        self._now = now
        self._direct_record = direct_record
        self.dialback = DialBack(peer_id=identity.peer_id, admission=admission, ttl_s=ttl_s, now=now,
                                 http_client=http_client, limits=limits)
        self.selftest = SelfTest(http_client=http_client, probe=self._probe, candidates=self._candidates,
                                 on_change=announce, every_s=every_s)
        self._task: asyncio.Task[None] | None = None

    @property
    def reachability(self) -> str:
        return self.selftest.verdict.kind

    def routes(self) -> list[web.RouteDef]:
        return self.dialback.routes()

    def tcp_methods(self) -> dict[str, Callable[[Frame], object]]:
        return self.dialback.tcp_methods()

    def start(self) -> None:
        self._task = asyncio.create_task(self.selftest.run(self._someone_to_ask), name="reach-selftest")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def status(self) -> dict:
        verdict = self.selftest.verdict
        record = self._direct_record()
        hint = private_line(verdict, http_addr=record.http_addr, tcp_addr=record.tcp_addr) \
            if verdict.kind == PRIVATE else ""
        return {**verdict.to_json(), "hint": hint, "dialbacks_answered": self.dialback.answered}

    def _probe(self) -> tuple[PeerRecord, bytes]:
        record = self._direct_record()
        return record, seal_record(self._identity, record)

    def _candidates(self) -> list[PeerRecord]:
        return [p.record for p in self._view.live(now=self._now()) if p.record.peer_id != self._identity.peer_id]

    async def _someone_to_ask(self) -> None:
        async with self._view_refreshed:
            await self._view_refreshed.wait_for(lambda: bool(self._candidates()))
