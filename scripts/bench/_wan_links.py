"""The emulated links of the WAN benchmarks: ``WanProxy`` instances on one asyncio loop in a
background thread, created and read by the synchronous coordinator; every peer announces its
proxies' ports, so each connection between two peers crosses exactly one emulated link."""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gossamer_harness.localproc import LOOPBACK, GossamerProcess
from gossamer_harness.wan import AccessLink, LinkProfile, WanProxy, listen_socket

CALL_TIMEOUT_S = 30.0
START_TIMEOUT_S = 120.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for p2pd, which needs its port up front)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Reserved:
    """A listener opened for a proxy whose target is not known yet."""

    listener: socket.socket
    access: AccessLink | None = None

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]


class Links:
    """Proxies shaped by ``profile`` (both directions), each in front of one peer's port. A proxy's
    listener is opened before its peer starts (``reserve``: the port goes into the peer's flags)
    and handed to the proxy once the peer says where it listens (``connect``); connections made in
    between wait in the backlog. With ``shared`` a peer's proxies share its access link
    (``AccessLink`` at the profile's rate) instead of the rate each; each byte between two peers is
    charged to one access link: the receiver's for what the opener sends, the opener's for the answers."""

    def __init__(self, profile: LinkProfile, *, shared: bool = False) -> None:
        if shared and profile.rate_bytes_per_s is None:
            raise ValueError("shared access links need a profile with a rate")
        self.profile = profile
        self.shared = shared
        self._access: dict[str, AccessLink] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="wan-links", daemon=True)
        self._thread.start()
        self._proxies: list[WanProxy] = []

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CALL_TIMEOUT_S)

    def reserve(self, peer: str | None = None) -> Reserved:
        """A listener for one of ``peer``'s ports (its access link's, when links are shared)."""
        access = None
        if self.shared:
            if peer is None:
                raise ValueError("shared access links: say whose port this is (peer=...)")
            assert self.profile.rate_bytes_per_s is not None
            access = self._access.setdefault(peer, AccessLink(self.profile.rate_bytes_per_s))
        return Reserved(listen_socket("127.0.0.1", 0), access)

    def connect(self, reserved: Reserved, target_port: int) -> WanProxy:
        """Start forwarding ``reserved``'s connections to 127.0.0.1:target_port through the link."""
        proxy = self._call(WanProxy.create("127.0.0.1", target_port, up=self.profile, listener=reserved.listener,
                                           max_connections=256, access=reserved.access))
        self._proxies.append(proxy)
        return proxy

    def wire_bytes(self) -> int:
        """Bytes forwarded by every proxy so far, both directions."""
        async def total() -> int:
            return sum(p.stats.up.bytes_forwarded + p.stats.down.bytes_forwarded for p in self._proxies)
        return self._call(total())

    def stats(self) -> dict[str, int]:
        """Connections accepted, reset, refused and failed (target unreachable) over every proxy."""
        async def collect() -> dict[str, int]:
            fields = ("connections_accepted", "connections_reset", "connections_refused", "connections_failed")
            return {name: sum(getattr(p.stats, name) for p in self._proxies) for name in fields}
        return self._call(collect())

    def close_proxies(self) -> None:
        """Close every proxy made so far (the loop keeps running for the next arm's)."""
        proxies, self._proxies = self._proxies, []
        self._access = {}  # the next arm's peers start with idle lines

        async def close() -> None:
            await asyncio.gather(*(p.aclose() for p in proxies))
        self._call(close())

    def close(self) -> None:
        self.close_proxies()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        self._loop.close()


class Party:
    """One ``gossamer`` daemon (``args``: its command and flags) on 127.0.0.1, one torch thread, with
    proxies of ``links`` in front of its HTTP and TCP ports that it announces (none when ``links``
    is None: plain loopback). Its DHT port is not shaped."""

    def __init__(self, name: str, args: list[str], work: Path, links: Links | None) -> None:
        self.fronts = (links.reserve(name), links.reserve(name)) if links is not None else None
        announce = ["--announce_http_port", str(self.fronts[0].port),
                    "--announce_tcp_port", str(self.fronts[1].port)] if self.fronts else []
        self.proc = GossamerProcess([*args, "--events", *LOOPBACK, *announce, "--threads", "1",
                                     "--identity_path", str(work / f"{name}.pem"),
                                     "--checkpoint_dir", str(work / "ckpt"), "--checkpoint_every", "0"],
                                    log_path=work / f"{name}.log")

    def ready(self, links: Links | None) -> dict[str, Any]:
        event = self.proc.wait_ready(timeout_s=START_TIMEOUT_S)
        if links is not None and self.fronts is not None:
            for front, kind in zip(self.fronts, ("http", "tcp"), strict=True):
                links.connect(front, int(event["listening"][kind].rsplit(":", 1)[1]))
        return event
