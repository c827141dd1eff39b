"""Passes through block hosts and AR stage hosts, each behind its own TcpServer on 127.0.0.1
(port 0), announced by real signed records in a real DHT node: the remote pass equals the
in-process one bit for bit, malformed frames are refused without harming the host, a dead or hung
host is routed around (or the client fails naming the block nobody serves any more), and the AR
pipeline's stages compose to the whole causal LM."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from gossamer.crypto.identity import Identity
from gossamer.peer.route.client import HostEntry, RemoteRoute, RouteFailed, hosts_from_view, route_through
from gossamer.peer.route.host import RouteHost
from gossamer.peer.route.policy import LiveHopPolicy
from gossamer.peer.route.pool import HopPool
from gossamer.peer.route.wire import FailedHop, Hop, parse_answer, request_frame
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.keys import peers_key
from gossamer.peer.run.manifest import build_manifest, run_config_from_dict
from gossamer.peer.run.records import UNKNOWN, PeerRecord, seal_record
from gossamer.peer.run.view import PeerView
from gossamer.protocols.blocktrain.ar_stage import ArStageHost, build_stages, matched_model_config
from gossamer.protocols.blocktrain.client import ArClient, BlockTrainClient
from gossamer.protocols.blocktrain.core import (
    BlockTrainConfig,
    build_stack,
    denoise_pass,
    generate,
    initial_noise,
    readout,
)
from gossamer.protocols.blocktrain.host import METHOD, BlockHost
from gossamer.protocols.blocktrain.stack import partial_stack
from gossamer.protocols.core.models import build_model
from gossamer.protocols.core.models import generate as ar_generate
from gossamer.transport.codec import encode_tensors
from gossamer.transport.dht.membership import DhtMembership
from gossamer.transport.errors import RemoteError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import TcpConfig, TcpServer, tcp_connect
from gossamer_harness.wan import LinkProfile, WanProxy

MODEL = {"d_model": 16, "n_heads": 2, "context": 16, "num_blocks": 3}
CONFIG = BlockTrainConfig(**MODEL)


class Hosts:
    """Block / stage hosts of one run sharing a DHT node and a view of their signed records."""

    def __init__(self, tmp_path: Path, membership: DhtMembership) -> None:
        self.tmp_path, self.membership = tmp_path, membership
        doc = {"run": {"name": "bt", "protocol": "blocktrain", "heartbeat_s": 30.0}, "model": MODEL}
        self.manifest = build_manifest(Identity.generate(), run_config_from_dict(doc), now=membership.now())
        self.view = PeerView(Admission(self.manifest), ttl_s=self.manifest.ttl_s)
        self.stack = build_stack(CONFIG, seed=0, device="cpu")
        self.pool = HopPool()
        self.servers: dict[str, tuple[Identity, RouteHost, TcpServer, HopPool]] = {}
        self.addrs: dict[str, str] = {}

    def policy(self, role: str, key: str) -> LiveHopPolicy:
        """What a host of ``role`` forwards to: live peers announcing ``key`` units in this run."""
        return LiveHopPolicy(view=self.view, manifest=self.manifest, membership=self.membership,
                             now=self.membership.now, role=role, key=key)

    async def add_blocks(self, name: str, blocks: tuple[int, ...], *, reachability: str = UNKNOWN) -> str:
        """A block host holding ``blocks``; its record says ``reachability`` (``run.records``)."""
        identity, pool = Identity.generate(), HopPool()
        stack = partial_stack(CONFIG, blocks, device=torch.device("cpu"))
        stack.load_embedding_state(self.stack.embedding_state())
        for k in blocks:
            stack.load_block_state(k, self.stack.block_state(k))
        policy = self.policy("block-server", "blocks")
        host = BlockHost(stack, blocks, run_id=self.manifest.run_id, pool=pool, next_hop_ok=policy,
                         max_batch=4)
        return await self._serve(name, identity, host, pool, reachability=reachability)

    async def add_stages(self, name: str, stages: tuple[int, ...], model) -> str:
        identity, pool = Identity.generate(), HopPool()
        held = {s: stage for s, stage in model.items() if s in stages}
        policy = self.policy("ar-stage", "ar_stages")
        host = ArStageHost(held, config=matched_model_config(CONFIG), num_stages=CONFIG.num_blocks,
                           run_id=self.manifest.run_id, pool=pool, next_hop_ok=policy)
        return await self._serve(name, identity, host, pool)

    async def _serve(self, name: str, identity: Identity, host: RouteHost, pool: HopPool, *,
                     reachability: str = UNKNOWN) -> str:
        server = await TcpServer.create(lambda frame, info: host.handle(frame))
        self.servers[name] = (identity, host, server, pool)
        self.addrs[name] = f"127.0.0.1:{server.address[1]}"
        role, key = ("block-server", "blocks") if isinstance(host, BlockHost) else ("ar-stage", "ar_stages")
        now = self.membership.now()
        record = PeerRecord(peer_id=identity.peer_id, public_key=identity.public_key, name=name, http_addr="",
                            tcp_addr=self.addr(name), roles=(role,), version="test", round=0, timestamp=now,
                            assignment={key: list(host.units)}, reachability=reachability)
        await self.membership.store(peers_key(self.manifest.run_id), seal_record(identity, record), signer=identity,
                                    expiration_time=now + 60.0)
        await self.refresh()
        return self.addr(name)

    async def refresh(self) -> None:
        entries = await self.membership.get_all(peers_key(self.manifest.run_id))
        self.view.update(entries, now=self.membership.now())

    def addr(self, name: str) -> str:
        return self.addrs[name]

    def host(self, name: str) -> RouteHost:
        return self.servers[name][1]

    async def kill(self, name: str) -> None:
        """The host's process is gone: its server and its connections close (its record stays live)."""
        _identity, _host, server, pool = self.servers[name]
        await server.aclose()
        await pool.aclose()

    def route(self, role: str, key: str, order: list[int], budget_s: float = 10.0) -> RemoteRoute:
        async def hosts(refresh: bool) -> list[HostEntry]:
            return hosts_from_view(self.view, now=self.membership.now(), role=role, key=key)

        return RemoteRoute(method=METHOD if key == "blocks" else "ar.forward", run_id=self.manifest.run_id,
                           order=order, hosts=hosts, pool=self.pool, budget_s=budget_s)

    async def aclose(self) -> None:
        for name in self.servers:
            await self.kill(name)
        await self.pool.aclose()


async def three_hosts(hosts: Hosts) -> None:
    for k in range(3):
        await hosts.add_blocks(f"h{k}", (k,))


def client(hosts: Hosts, **route_options: float) -> BlockTrainClient:
    route = hosts.route("block-server", "blocks", [2, 1, 0], **route_options)
    return BlockTrainClient(route, CONFIG, hosts.stack.embedding_state(), device=torch.device("cpu"))


async def test_a_pass_across_three_hosts_equals_the_in_process_one_bit_for_bit(hosts: Hosts) -> None:
    await three_hosts(hosts)
    context = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(1))

    remote = await client(hosts).denoise_pass(context, generator=torch.Generator().manual_seed(7))
    local = denoise_pass(hosts.stack, context, generator=torch.Generator().manual_seed(7))

    assert torch.equal(remote, local)
    assert [hosts.host(f"h{k}").served for k in range(3)] == [1, 1, 1]


async def test_generation_over_the_hosts_equals_generation_in_one_process(hosts: Hosts) -> None:
    await hosts.add_blocks("upper", (2, 1))  # one host holding two blocks: a two-hop route
    await hosts.add_blocks("lower", (0,))
    remote = client(hosts)

    text = await remote.generate(b"The ", new_bytes=20, passes=3,
                                 generator=torch.Generator().manual_seed(3), temperature=0.8)

    assert text == generate(hosts.stack, b"The ", new_bytes=20, passes=3,
                            generator=torch.Generator().manual_seed(3), temperature=0.8)
    assert [hop.units for hop in remote.route.last_route] == [(2, 1), (0,)]


def frame_with(hosts: Hosts, *, z: torch.Tensor | None = None, context: torch.Tensor | None = None,
               route: list | None = None, run: str | None = None, budget: object = 5.0) -> Frame:
    if z is None:
        z = initial_noise(CONFIG, (1, 8), generator=torch.Generator().manual_seed(0), device="cpu")
    context = torch.zeros(1, 8, dtype=torch.long) if context is None else context
    entries, buffers = encode_tensors({"z": z, "context": context})
    header = {"method": METHOD, "run": run or hosts.manifest.run_id, "request": "r1", "budget_s": budget,
              "route": route or [[hosts.addr("h2"), [2]]], "tensors": entries}
    return Frame(FrameType.REQUEST, header, buffers)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"z": torch.zeros(1, 8, 15)}, "z has shape (1, 8, 15), expected (1, 8, 16)"),
        ({"z": torch.zeros(1, 8, 16, dtype=torch.float64)}, "tensor 'z' must be 3-D torch.float32"),
        ({"z": torch.full((1, 8, 16), float("nan"))}, "z holds NaN or Inf"),
        ({"context": torch.zeros(1, 8, dtype=torch.int32)}, "tensor 'context' must be 2-D torch.int64"),
        ({"context": torch.full((1, 8), 300)}, "context ids must lie in [0, 256)"),
        ({"z": torch.zeros(5, 8, 16), "context": torch.zeros(5, 8, dtype=torch.long)}, "1..4 sequences"),
        ({"z": torch.zeros(1, 17, 16), "context": torch.zeros(1, 17, dtype=torch.long)}, "of 1..16"),
        ({"run": "other@0123456789abcdef"}, "route request for run 'other@0123456789abcdef'"),
        ({"route": [["HOST", [1]]]}, "does not serve block(s) [1]"),
        ({"route": [["HOST", [2]], ["127.0.0.1:1", [2]]]}, "must fall strictly"),
        ({"route": [["HOST", "2"]]}, "route hop 0 must be"),
        ({"budget": -1.0}, "'budget_s' must be a positive number"),
    ],
)
async def test_malformed_frames_are_refused_and_the_host_keeps_serving(hosts: Hosts, change: dict,
                                                                      message: str) -> None:
    await hosts.add_blocks("h2", (2,))
    if "route" in change:
        change["route"] = [[hosts.addr("h2") if hop[0] == "HOST" else hop[0], hop[1]]
                           for hop in change["route"]]
    connection = await tcp_connect("127.0.0.1", hosts.servers["h2"][2].address[1], config=TcpConfig())
    try:
        with pytest.raises(RemoteError) as refused:
            await connection.request(frame_with(hosts, **change))
        answer = parse_answer(await connection.request(frame_with(hosts)))  # the same connection still serves
    finally:
        await connection.aclose()

    assert message in str(refused.value)
    assert isinstance(answer, dict) and answer["z"].shape == (1, 8, 16)
    assert hosts.host("h2").refused == 1


async def test_a_host_only_forwards_to_live_hosts_announcing_the_blocks(hosts: Hosts) -> None:
    await three_hosts(hosts)
    pool = HopPool()
    z = initial_noise(CONFIG, (1, 8), generator=torch.Generator().manual_seed(0), device="cpu")
    tensors = {"z": z, "context": torch.zeros(1, 8, dtype=torch.long)}
    try:
        async def through(*route: Hop) -> object:
            return parse_answer(await pool.call(METHOD, run_id=hosts.manifest.run_id, request_id="r",
                                                budget_s=5.0, route=route, tensors=tensors))

        stranger = await through(Hop(hosts.addr("h2"), (2,)), Hop("127.0.0.1:9", (1,)))
        wrong_block = await through(Hop(hosts.addr("h2"), (2,)), Hop(hosts.addr("h0"), (1,)))
    finally:
        await pool.aclose()

    assert stranger == FailedHop("127.0.0.1:9",
                                 f"127.0.0.1:9 is not a live block-server of run {hosts.manifest.run_id}")
    assert isinstance(wrong_block, FailedHop) and "does not announce blocks [1]" in wrong_block.reason
    assert hosts.host("h0").served == 0


async def test_a_dead_host_is_routed_around_and_with_none_left_the_client_names_the_block(
        hosts: Hosts) -> None:
    await three_hosts(hosts)
    spare = await hosts.add_blocks("spare", (1,))
    remote = client(hosts, budget_s=2.0)
    context = torch.zeros(1, 8, dtype=torch.long)
    first = await remote.denoise_pass(context, generator=torch.Generator().manual_seed(0))
    used = next(hop.addr for hop in remote.route.last_route if hop.units == (1,))
    victim = "spare" if used == spare else "h1"

    await hosts.kill(victim)  # its record is still live in the DHT
    again = await remote.denoise_pass(context, generator=torch.Generator().manual_seed(0))
    survivor = next(hop.addr for hop in remote.route.last_route if hop.units == (1,))
    await hosts.kill("h1" if victim == "spare" else "spare")
    with pytest.raises(RouteFailed, match=r"no live host serves unit 1") as failed:
        await remote.denoise_pass(context, generator=torch.Generator().manual_seed(0))

    assert torch.equal(again, first) and remote.route.retries == 2
    assert survivor != hosts.addr(victim) and hosts.addr(victim) in remote.route.failures
    assert "connection failed" in str(failed.value)


async def test_a_hung_host_is_reported_by_the_host_before_it_within_the_budget(hosts: Hosts) -> None:
    await hosts.add_blocks("h2", (2,))
    await hosts.add_blocks("h0", (0,))
    await hosts.add_blocks("hung", (1,))
    hung_port = hosts.servers["hung"][2].address[1]
    async with await WanProxy.create("127.0.0.1", hung_port, up=LinkProfile(latency_s=600.0)) as proxy:
        hung = f"127.0.0.1:{proxy.address[1]}"  # the hung host's record points at the stalled link
        identity = hosts.servers["hung"][0]
        now = hosts.membership.now()
        record = PeerRecord(peer_id=identity.peer_id, public_key=identity.public_key, name="hung",
                            http_addr="", tcp_addr=hung, roles=("block-server",), version="test",
                            round=0, timestamp=now, assignment={"blocks": [1]})
        await hosts.membership.store(peers_key(hosts.manifest.run_id), seal_record(identity, record),
                                     signer=identity, expiration_time=now + 60.0)
        await hosts.refresh()
        remote = client(hosts, budget_s=2.0)
        started = time.monotonic()
        with pytest.raises(RouteFailed) as failed:
            await remote.denoise_pass(torch.zeros(1, 8, dtype=torch.long),
                                      generator=torch.Generator().manual_seed(0))

    assert list(remote.route.failures) == [hung]  # named by h2, the host before it, not blamed on h2
    assert "TransportTimeout" in remote.route.failures[hung]
    assert "no live host serves unit 1" in str(failed.value)
    assert time.monotonic() - started < 10.0


async def test_the_ar_pipeline_composes_to_the_causal_lm_and_generates_like_it(hosts: Hosts) -> None:
    config = matched_model_config(CONFIG)
    stages = build_stages(config, (0, 1, 2), 3, seed=5, device=torch.device("cpu"))
    await hosts.add_stages("s0", (0,), stages)
    await hosts.add_stages("s12", (1, 2), stages)
    model = build_model(config, seed=5).eval()
    ar = ArClient(hosts.route("ar-stage", "ar_stages", [0, 1, 2]), context=16, vocab=256)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))

    logits = await ar.next_logits(tokens)
    text = await ar.generate(b"ab", new_bytes=20, generator=torch.Generator().manual_seed(4), temperature=0.9)

    with torch.no_grad():
        assert torch.equal(logits, model(tokens)[:, -1])
    assert text == ar_generate(model, b"ab", max_new_bytes=20, temperature=0.9,
                               generator=torch.Generator().manual_seed(4))
    assert [hop.units for hop in ar.route.last_route] == [(0,), (1, 2)]


def test_routes_take_the_fewest_hops_and_name_the_unit_nobody_serves() -> None:
    table = [HostEntry("a", "A:1", (2,)), HostEntry("b", "B:1", (2, 1)), HostEntry("c", "C:1", (1, 0)),
             HostEntry("d", "D:1", (0,))]

    assert route_through([2, 1, 0], table) == (Hop("B:1", (2, 1)), Hop("C:1", (0,)))  # tie: lower peer id
    assert route_through([2, 1, 0], table, exclude={"B:1"}) == (Hop("A:1", (2,)), Hop("C:1", (1, 0)))
    with pytest.raises(RouteFailed, match="no live host serves unit 1"):
        route_through([2, 1, 0], table, exclude={"B:1", "C:1"})


def test_readout_of_the_last_hops_z_is_the_in_process_logits() -> None:
    stack = build_stack(CONFIG, seed=0, device="cpu")
    reader = partial_stack(CONFIG, [], device=torch.device("cpu"))
    reader.load_embedding_state(stack.embedding_state())
    z = torch.randn(2, 4, 16)

    assert torch.equal(readout(reader, z), readout(stack, z))
    assert all(p.device.type == "meta" for p in reader.blocks.parameters())  # the reader holds no block


def test_a_request_frame_round_trips_its_route_and_budget() -> None:
    frame = request_frame(METHOD, run_id="r@0", request_id="x", route=(Hop("h:1", (2, 1)),), budget_s=3.0,
                          tensors={"z": torch.zeros(1)})

    assert frame.header["route"] == [["h:1", [2, 1]]] and frame.header["budget_s"] == 3.0
