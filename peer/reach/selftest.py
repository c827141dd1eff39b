"""``SelfTest``: the asking side of the reachability self-test. It asks up to ``ASKED`` live peers,
the tenured or vouched-for ones (and the run owner) when there are any, to dial it back, and concludes as
``verdict.classify`` says (``public`` on one reached; ``private`` only on a quorum of not-reached
and none reached); a private peer's owner gets one actionable line."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from gossamer.peer.reach.dialback import http_url, split_addr
from gossamer.peer.reach.verdict import Verdict, classify, quorum
from gossamer.peer.run.records import PRIVATE, PUBLIC, PeerRecord
from gossamer.transport.errors import TransportError
from gossamer.transport.http_client import HttpClient

log = logging.getLogger(__name__)

ASKED = 4
RETRY_S = 10.0  # how soon to ask again when nobody answered

__all__ = ["ASKED", "SelfTest", "Verdict", "private_line"]


def private_line(verdict: Verdict, *, http_addr: str, tcp_addr: str) -> str:
    """What a private peer's owner can do, in one line."""
    unreached = [f"{what} {addr}" for what, addr, ok in (("HTTP", http_addr, verdict.http), ("TCP", tcp_addr, verdict.tcp))
                 if addr and not ok]
    seen = verdict.observed[0] if verdict.observed else "?"
    ports = " and ".join(str(split_addr(addr)[1]) for addr in (http_addr, tcp_addr) if addr)
    return (f"this peer is private: {verdict.answered} peer(s) could not dial back {', '.join(unreached)} (they see it "
            f"connect from {seen}). To take inbound connections, forward TCP port(s) {ports} to this host and pass "
            f"--announce_host {seen} (and --announce_http_port / --announce_tcp_port if the forwarded ports "
            f"differ); until then it reaches others through a relay when a public peer volunteers one (--relay)")


class SelfTest:
    """Repeated reachability checks of one peer; ``verdict`` is the latest. ``trusted(peer_id)``
    says whether a candidate is tenured or vouched for: when any is, only those are asked, so free
    identities cannot vote this peer private."""

    def __init__(self, *, http_client: HttpClient, probe: Callable[[], tuple[PeerRecord, bytes]],
                 candidates: Callable[[], list[PeerRecord]], on_change: Callable[[], None],
                 trusted: Callable[[str], bool] = lambda peer_id: False,
                 every_s: float = 300.0, timeout_s: float = 10.0) -> None:
        self._http = http_client
        self._probe = probe
        self._candidates = candidates
        self._trusted = trusted
        self._on_change = on_change
        self._every_s = every_s
        self._timeout_s = timeout_s
        self._rng = random.Random()
        self.verdict = Verdict()

    def answerers(self, me: str) -> tuple[list[PeerRecord], bool]:
        """Whom a check may ask (one record per peer, not ``me``, with an HTTP address others can
        dial), and whether they are the tenured or vouched-for ones."""
        peers = list({p.peer_id: p for p in self._candidates()
                      if p.peer_id != me and p.http_addr and p.reachable}.values())
        vetted = [p for p in peers if self._trusted(p.peer_id)]
        return (vetted, True) if vetted else (peers, False)

    async def check(self) -> Verdict:
        """Ask up to ``ASKED`` answerers to dial this peer back; the new verdict (also kept)."""
        record, blob = self._probe()
        pool, vetted = self.answerers(record.peer_id)
        self._rng.shuffle(pool)
        pool.sort(key=lambda p: p.reachability != PUBLIC)  # among equals, those that say they are public first
        asked = pool[:ASKED if vetted else 2 * ASKED]  # unvetted: more asked, so one honest answerer is likelier among them
        answers = [a for a in await asyncio.gather(*(self._ask(p, blob) for p in asked)) if a is not None]
        verdict = classify(self.verdict.kind, asked=len(asked), answers=answers, needed=quorum(len(pool)),
                           vetted=vetted)
        changed = verdict.kind != self.verdict.kind
        self.verdict = verdict
        if changed:
            if verdict.kind == PRIVATE:
                log.warning("%s", private_line(verdict, http_addr=record.http_addr, tcp_addr=record.tcp_addr))
            else:
                log.info("reachability: %s (%d of %d asked peers answered)", verdict.kind, verdict.answered,
                         verdict.asked)
            self._on_change()
        return verdict

    async def run(self, someone_to_ask: Callable[[], Awaitable[None]]) -> None:
        """Check whenever there is someone to ask, then every ``every_s`` (``RETRY_S`` while nobody answers)."""
        while True:
            await someone_to_ask()
            verdict = await self.check()
            await asyncio.sleep(self._every_s if verdict.answered else min(RETRY_S, self._every_s))

    async def _ask(self, peer: PeerRecord, blob: bytes) -> dict | None:
        url = http_url(peer.http_addr, "/reach/dialback")
        try:
            async with asyncio.timeout(self._timeout_s):
                answer = await self._http.put_bytes(url, blob)
        except (TransportError, TimeoutError) as exc:
            log.debug("dial-back request to %s failed: %s", peer.peer_id[:12], exc)
            return None
        return answer if isinstance(answer, dict) else None
