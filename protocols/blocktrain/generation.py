"""``gossamer generate``: join the run's DHT as a client, find a route through the block servers (or
the AR stages) that the records announce, fetch E from a server, generate; a failed host is routed
around, and a block that no reachable host serves ends the command with an error naming it."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from gossamer.peer.config import PeerConfig
from gossamer.peer.errors import ConfigError
from gossamer.peer.plugin import run_settings
from gossamer.peer.route.client import HostEntry, RemoteRoute, RouteFailed, hosts_from_view, route_through
from gossamer.peer.route.pool import HopPool
from gossamer.peer.route.wire import parse_answer
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.joining import fetch_manifest, start_membership
from gossamer.peer.run.keys import peers_key
from gossamer.peer.run.view import PeerView
from gossamer.protocols.blocktrain import names
from gossamer.protocols.blocktrain.ar_stage import METHOD as AR_METHOD
from gossamer.protocols.blocktrain.client import ArClient, BlockTrainClient
from gossamer.protocols.blocktrain.host import EMBEDDING_METHOD
from gossamer.protocols.blocktrain.host import METHOD as BLOCK_METHOD
from gossamer.protocols.blocktrain.settings import BlockTrainSettings
from gossamer.transport.dht.membership import DhtMembership
from gossamer.transport.errors import DecodeError, TransportError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import TcpConfig

log = logging.getLogger(__name__)
ROUTE_POLL_S = 0.5


@dataclass(frozen=True, kw_only=True)
class GenerateOptions:
    """What ``gossamer generate`` was asked for."""

    run: str
    initial_peers: tuple[str, ...]
    prompt: str
    new_bytes: int = 64
    passes: int = 4
    temperature: float = 0.8
    seed: int = 0
    timeout_s: float = 30.0
    baseline: str = ""
    device: str = "cpu"
    as_json: bool = False


def run_generate(options: GenerateOptions) -> int:
    result = asyncio.run(generate_over_network(options))
    if options.as_json:
        print(json.dumps(result))
    else:
        sys.stdout.write(options.prompt + result["text"] + "\n")
        left_out = f", {len(result['unreachable'])} private server(s) left out" if result["unreachable"] else ""
        print(f"[{result['new_bytes']} bytes in {result['seconds']:.2f} s with {result['passes']} "
              f"passes of {result['hops']} hop(s), {result['retries']} retried{left_out}]", file=sys.stderr)
    return 0


async def generate_over_network(options: GenerateOptions) -> dict[str, Any]:
    """Generate ``new_bytes`` after the prompt through the run's hosts; a JSON-ready summary."""
    generator = await NetworkGenerator.create(options)
    try:
        return await generator.generate()
    finally:
        await generator.aclose()


class NetworkGenerator:
    """A generating client joined to one run: ``create`` finds the hosts (and E), ``generate`` runs."""

    def __init__(self, options: GenerateOptions, membership: DhtMembership, pool: HopPool) -> None:
        self.options = options
        self.membership = membership
        self.pool = pool
        self.client: ArClient | BlockTrainClient | None = None
        self._seen: dict[str, tuple[bytes, float]] = {}
        self._refreshed_at = -1e9

    @classmethod
    async def create(cls, options: GenerateOptions) -> NetworkGenerator:
        config = PeerConfig(run=options.run, initial_peers=options.initial_peers,
                            host_maddrs=("/ip4/127.0.0.1/tcp/0",), join_timeout_s=options.timeout_s)
        membership = await start_membership(config)
        pool = HopPool(config=TcpConfig(connect_timeout_s=min(10.0, options.timeout_s)))
        generator = cls(options, membership, pool)
        try:
            await generator._join(config)
        except BaseException:
            await generator.aclose()
            raise
        return generator

    async def _join(self, config: PeerConfig) -> None:
        self.manifest = await fetch_manifest(self.membership, config)
        if self.manifest.config.protocol != names.PROTOCOL:
            raise ConfigError(f"run {self.manifest.run_id} uses protocol {self.manifest.config.protocol!r}; "
                              f"gossamer generate needs a {names.PROTOCOL!r} run")
        self.settings = run_settings(BlockTrainSettings, self.manifest.config)
        self.view = PeerView(Admission(self.manifest), ttl_s=self.manifest.ttl_s)
        ar = self.options.baseline == "ar"
        self.role, self.key = (names.AR_STAGE, "ar_stages") if ar else (names.SERVER, "blocks")
        num_units = self.settings.model.num_blocks
        order = list(range(num_units)) if ar else list(reversed(range(num_units)))
        await wait_for_route(self.hosts, order, timeout_s=self.options.timeout_s)
        self.route = RemoteRoute(method=AR_METHOD if ar else BLOCK_METHOD, run_id=self.manifest.run_id,
                                 order=order, hosts=self.hosts, pool=self.pool,
                                 budget_s=self.settings.route_timeout_s)
        model = self.settings.model
        if ar:
            self.client = ArClient(self.route, context=model.context, vocab=model.vocab)
        else:
            embedding = await fetch_embedding(self.pool, await self.hosts(False),
                                              timeout_s=self.settings.route_timeout_s)
            self.client = BlockTrainClient(self.route, model, embedding,
                                           device=torch.device(self.options.device))

    async def hosts(self, refresh: bool) -> list[HostEntry]:
        """The live hosts; the DHT is read again when asked to or when the table is a heartbeat old.
        Records seen before stay until their TTL runs out (one DHT read can come back incomplete)."""
        if refresh or time.monotonic() - self._refreshed_at >= self.manifest.config.heartbeat_s:
            try:
                self._seen.update(await self.membership.get_all(peers_key(self.manifest.run_id)))
                self._refreshed_at = time.monotonic()
            except TransportError as exc:
                log.warning("could not refresh the peer table, routing with the last one: %s", exc)
            self.view.update(self._seen, now=self.membership.now())
        return hosts_from_view(self.view, now=self.membership.now(), role=self.role, key=self.key)

    async def generate(self) -> dict[str, Any]:
        """Generate the options' bytes; a JSON-ready summary (text, passes, retries, route, time)."""
        options, client = self.options, self.client
        generator = torch.Generator(device=torch.device(options.device)).manual_seed(options.seed)
        prompt = options.prompt.encode("utf-8")
        started = time.monotonic()
        if isinstance(client, ArClient):
            text = await client.generate(prompt, new_bytes=options.new_bytes, generator=generator,
                                         temperature=options.temperature)
        else:
            assert client is not None
            text = await client.generate(prompt, new_bytes=options.new_bytes, passes=options.passes,
                                         generator=generator, temperature=options.temperature)
        route = self.route
        return {"run_id": self.manifest.run_id, "prompt": options.prompt,
                "text": text.decode("utf-8", "replace"), "text_hex": text.hex(), "new_bytes": len(text),
                "passes": client.passes, "seconds": time.monotonic() - started,
                "retries": route.retries, "failures": dict(route.failures),
                "hops": len(route.last_route), "route": [hop.to_wire() for hop in route.last_route],
                "unreachable": sorted(route.unreachable.values()),
                "baseline": options.baseline or "blocktrain"}

    async def aclose(self) -> None:
        await self.pool.aclose()
        await self.membership.aclose()


async def wait_for_route(hosts, order: list[int], *, timeout_s: float) -> None:
    """Poll the DHT until the live hosts cover ``order`` (servers announce their units once loaded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            route_through(order, await hosts(True))
            return
        except RouteFailed:
            if time.monotonic() + ROUTE_POLL_S > deadline:
                raise
        await asyncio.sleep(ROUTE_POLL_S)


async def fetch_embedding(pool: HopPool, hosts: list[HostEntry], *,
                          timeout_s: float) -> dict[str, torch.Tensor]:
    """E from the first block server that gives it."""
    problems = []
    for host in (h for h in hosts if h.reachable):
        try:
            request = Frame(FrameType.REQUEST, {"method": EMBEDDING_METHOD})
            answer = parse_answer(await pool.ask(host.addr, request, timeout_s=timeout_s))
        except (TransportError, DecodeError) as exc:
            problems.append(f"{host.addr}: {exc}")
            continue
        if isinstance(answer, dict) and "weight" in answer:
            return answer
        problems.append(f"{host.addr}: answered no embedding")
    raise RouteFailed(f"no block server gave the embedding E: {'; '.join(problems) or 'no servers'}")
