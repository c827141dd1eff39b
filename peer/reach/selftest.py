"""``SelfTest``: the asking side of the reachability self-test. It asks up to ``ASKED`` live peers to
dial it back and says ``public`` (one reached both servers), ``private`` (answers, none reached
both) or keeps its verdict (no answer); a private peer's owner gets one actionable line."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gossamer.peer.reach.dialback import http_url, split_addr
from gossamer.peer.run.records import PRIVATE, PUBLIC, UNKNOWN, PeerRecord
from gossamer.transport.errors import TransportError
from gossamer.transport.http_client import HttpClient

log = logging.getLogger(__name__)

ASKED = 3
RETRY_S = 10.0  # how soon to ask again when nobody answered


@dataclass(frozen=True)
class Verdict:
    """The outcome of one self-test."""

    kind: str = UNKNOWN
    asked: int = 0
    answered: int = 0
    http: bool = False
    tcp: bool = False
    observed: tuple[str, ...] = ()
    why: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        return {"kind": self.kind, "asked": self.asked, "answered": self.answered, "http": self.http,
                "tcp": self.tcp, "observed": list(self.observed), "why": list(self.why)}


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
    """Repeated reachability checks of one peer; ``verdict`` is the latest."""

    def __init__(self, *, http_client: HttpClient, probe: Callable[[], tuple[PeerRecord, bytes]],
                 candidates: Callable[[], list[PeerRecord]], on_change: Callable[[], None],
                 every_s: float = 300.0, timeout_s: float = 10.0) -> None:
        self._http = http_client
        self._probe = probe
        self._candidates = candidates
        self._on_change = on_change
        self._every_s = every_s
        self._timeout_s = timeout_s
        self._rng = random.Random()
        self.verdict = Verdict()

    async def check(self) -> Verdict:
        """Ask up to ``ASKED`` peers to dial this one back; the new verdict (also kept)."""
        record, blob = self._probe()
        peers = [p for p in self._candidates() if p.peer_id != record.peer_id and p.http_addr and p.reachable]
        self._rng.shuffle(peers)
        peers.sort(key=lambda p: p.reachability != PUBLIC)  # public answerers first
        asked = peers[:ASKED]
        answers = [a for a in await asyncio.gather(*(self._ask(p, blob) for p in asked)) if a is not None]
        verdict = _classify(self.verdict.kind, len(asked), answers)
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


def _classify(previous: str, asked: int, answers: list[dict]) -> Verdict:
    if not answers:
        return Verdict(kind=previous, asked=asked)
    http = any(a.get("http") is True for a in answers)
    tcp = any(a.get("tcp") is True for a in answers)
    both = any(a.get("http") is True and a.get("tcp") is True for a in answers)
    observed = tuple(dict.fromkeys(str(a.get("observed", ""))[:64] for a in answers if a.get("observed")))
    why = tuple(dict.fromkeys(str(a.get("why", ""))[:300] for a in answers if a.get("why")))
    return Verdict(kind=PUBLIC if both else PRIVATE, asked=asked, answered=len(answers), http=http, tcp=tcp,
                   observed=observed, why=why)
