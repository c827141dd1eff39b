"""The block coordinator and real block workers over real HTTP on 127.0.0.1 (port 0), found through
real signed records in a PeerView: updates are averaged into the next version and written to
disk, stale and forged ones are refused, a crashed worker's block is covered again (and the
worker is recorded as timed out), a coordinator resumes from its checkpoints, and a worker's long
poll returns when the block's version closes.

The roles use neither the DHT nor TCP, so ``membership`` is not built (None); everything they use
is the real thing. The version loop is driven one ``step()`` at a time, so each test decides
exactly when versions close.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from aiohttp import web

from gossamer.crypto.identity import Identity
from gossamer.peer.config import PeerConfig
from gossamer.peer.kit.messaging import ENVELOPE_HEADER
from gossamer.peer.metrics import Traffic
from gossamer.peer.role import RoleContext
from gossamer.peer.roles.blocktrain.coordinator import BlockCoordinatorRole
from gossamer.peer.roles.blocktrain.fetch import fetch_block
from gossamer.peer.roles.blocktrain.worker import BlockWorkerRole
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.manifest import build_manifest, run_config_from_dict
from gossamer.peer.run.records import PeerRecord, seal_record
from gossamer.peer.run.view import LivePeer, PeerView
from gossamer.protocols.text_data import load_text
from gossamer.transport.errors import RemoteError
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer
from gossamer.transport.safetensors_stream import load_file

MODEL = {"d_model": 16, "n_heads": 2, "context": 16, "num_blocks": 2}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes(load_text("builtin:pydoc")[:200_000])
    return path


class Net:
    """A coordinator behind a real HTTP server and workers, sharing one view of signed records."""

    def __init__(self, tmp_path: Path, data: Path, client: HttpClient, owner: Identity,
                 model: dict | None = None) -> None:
        self.tmp_path, self.data, self.client, self.owner = tmp_path, data, client, owner
        doc = {"run": {"name": "bt", "protocol": "blocktrain", "heartbeat_s": 30.0}, "model": model or MODEL,
               "hyper": {"versions": 3, "local_steps": 2, "batch_size": 4, "deadline_s": 600.0,
                         "eval_batches": 0}}
        self.manifest = build_manifest(owner, run_config_from_dict(doc), now=time.time())
        self.view = PeerView(Admission(self.manifest), ttl_s=self.manifest.ttl_s)
        self.workers: dict[str, BlockWorkerRole] = {}
        self.coordinator: BlockCoordinatorRole | None = None
        self.server: HttpServer | None = None

    def context(self, identity: Identity, roles: tuple[str, ...]) -> RoleContext:
        config = PeerConfig(identity_path=self.tmp_path / "unused.pem", roles=roles, data=str(self.data),
                            checkpoint_dir=self.tmp_path / "checkpoints")
        return RoleContext(identity=identity, config=config, manifest=self.manifest,
                           membership=None,  # type: ignore[arg-type]
                           http_client=self.client, view=self.view, device=torch.device("cpu"),
                           traffic=Traffic(), now=time.time, http_config=HttpConfig())

    async def start_coordinator(self) -> BlockCoordinatorRole:
        coordinator = BlockCoordinatorRole(self.context(self.owner, ("orchestrator", "block-coordinator")))
        app = web.Application()
        app.add_routes(coordinator.routes())
        self.server = await HttpServer.create(app)
        await coordinator.write_checkpoints()
        self.coordinator = coordinator
        return coordinator

    def add_worker(self, name: str) -> BlockWorkerRole:
        self.workers[name] = BlockWorkerRole(self.context(Identity.generate(), ("block-worker",)))
        return self.workers[name]

    def publish(self, *, without: tuple[str, ...] = ()) -> None:
        """The records the DHT returns now: the coordinator's and those of the workers not ``without``."""
        now, entries = time.time(), {}
        peers = [(self.owner, ("orchestrator", "block-coordinator"), f"127.0.0.1:{self.server.address[1]}")]
        peers += [(w.ctx.identity, ("block-worker",), "")
                  for n, w in self.workers.items() if n not in without]
        for identity, roles, http_addr in peers:
            record = PeerRecord(peer_id=identity.peer_id, public_key=identity.public_key, name="",
                                http_addr=http_addr, tcp_addr="", roles=roles, version="test", round=0,
                                timestamp=now)
            entries[identity.peer_id] = (seal_record(identity, record), now + 60.0)
        self.view.update(entries, now=now)

    @property
    def peer(self) -> LivePeer:
        found = self.view.get(self.owner.peer_id)
        assert found is not None
        return found

    def block_of(self, name: str) -> int:
        assert self.coordinator is not None
        return self.coordinator.assignment[self.workers[name].ctx.identity.peer_id]

    async def aclose(self) -> None:
        if self.server is not None:
            await self.server.aclose()


@pytest.fixture
async def net(request: pytest.FixtureRequest, tmp_path: Path, text_file: Path) -> AsyncIterator[Net]:
    client = await HttpClient.create()
    network = Net(tmp_path, text_file, client, Identity.generate(), getattr(request, "param", None))
    try:
        yield network
    finally:
        await network.aclose()
        await client.aclose()


async def train_and_send(net: Net, worker: BlockWorkerRole, block: int) -> dict:
    fetched = await worker.fetch(net.peer, block)
    loss = await asyncio.to_thread(worker.train, block)
    return await worker.send_update(net.peer, fetched, worker.difference(fetched), loss)


async def test_same_block_updates_are_averaged_into_the_next_version_and_written_to_disk(net: Net) -> None:
    coordinator = await net.start_coordinator()
    a, b = net.add_worker("a"), net.add_worker("b")
    net.add_worker("c"), net.add_worker("d")
    net.publish()
    await coordinator.step()
    block = net.block_of("a")
    b = next(w for n, w in net.workers.items() if n != "a" and net.block_of(n) == block)
    base = await fetch_block(net.client, net.peer, block)
    fetched = {w: await w.fetch(net.peer, block) for w in (a, b)}
    for worker in (a, b):
        await asyncio.to_thread(worker.train, block)
    updates = [worker.difference(fetched[worker]) for worker in (a, b)]

    answers = [await w.send_update(net.peer, fetched[w], u, 1.0)
               for w, u in zip((a, b), updates, strict=True)]
    await coordinator.step()

    assert [answer["accepted"] for answer in answers] == [True, True]
    served = await fetch_block(net.client, net.peer, block)
    expected = {name: base.tensors[name] + torch.stack([u[f"block.{name}"] for u in updates]).mean(dim=0)
                for name in base.tensors}
    assert served.version == 1 and all(torch.equal(served.tensors[n], expected[n]) for n in expected)
    tensors, metadata = load_file(coordinator.directory / f"block{block}.safetensors")
    assert metadata["version"] == "1" and torch.equal(tensors["out.weight"], expected["out.weight"])
    ledger = coordinator.board.ledgers.get(block, 0)
    assert ledger is not None and sorted(ledger.used) == sorted(w.ctx.identity.peer_id for w in (a, b))


@pytest.mark.parametrize("net", [{**MODEL, "embedding": "averaged"}], indirect=True)
async def test_an_averaged_embedding_moves_by_the_workers_mean_difference_over_the_blocks(net: Net) -> None:
    coordinator = await net.start_coordinator()
    worker = net.add_worker("a")
    net.publish()
    await coordinator.step()
    block = net.block_of("a")
    fetched = await worker.fetch(net.peer, block)
    await asyncio.to_thread(worker.train, block)
    update = worker.difference(fetched)

    assert (await worker.send_update(net.peer, fetched, update, 1.0))["accepted"]
    await coordinator.step()

    served = await fetch_block(net.client, net.peer, 1 - block)  # every block is served with the new E
    expected = fetched.embedding["weight"] + update["embed.weight"] / MODEL["num_blocks"]
    assert torch.equal(served.embedding["weight"], expected) and served.version == 0
    tensors, metadata = load_file(coordinator.directory / "embedding.safetensors")
    assert torch.equal(tensors["weight"], expected) and metadata["version"] == "1"
    assert bool((update["embed.weight"] != 0).any())  # the worker did train E


async def test_a_stale_update_is_dropped_and_recorded_in_the_ledger_of_its_version(net: Net) -> None:
    coordinator = await net.start_coordinator()
    a, b = net.add_worker("a"), net.add_worker("b")
    net.publish()
    await coordinator.step()
    block = net.block_of("a")  # b trains the other block; it starts on a's block just as a finishes
    late = await b.fetch(net.peer, block)
    await asyncio.to_thread(b.train, block)

    assert (await train_and_send(net, a, block))["accepted"]
    await coordinator.step()  # a was the only worker assigned: version 0 closes
    answer = await b.send_update(net.peer, late, b.difference(late), 1.0)

    assert not answer["accepted"]
    assert answer["reason"].startswith(f"stale: trained from version 0 of block {block}")
    assert coordinator.board.versions[block] == 1
    ledger = coordinator.board.ledgers.get(block, 0)
    assert ledger is not None and ledger.rejected == {b.ctx.identity.peer_id: answer["reason"]}
    assert ledger.used == [a.ctx.identity.peer_id]


async def test_a_crashed_workers_block_is_reassigned_and_it_is_recorded_as_timed_out(net: Net) -> None:
    coordinator = await net.start_coordinator()
    net.add_worker("a"), net.add_worker("b")
    net.publish()
    await coordinator.step()
    crashed, survivor = ("a", "b") if net.block_of("a") == 0 else ("b", "a")
    assert (net.block_of(crashed), net.block_of(survivor)) == (0, 1)

    net.publish(without=(crashed,))  # its record expired: the DHT no longer returns it
    await coordinator.step()
    assert (await train_and_send(net, net.workers[survivor], 1))["accepted"]
    await coordinator.step()  # block 1 closes; block 0, now furthest behind, gets the survivor

    state = await net.client.get_json(f"http://{net.peer.record.http_addr}/blocktrain/state")
    assert state["assignment"] == {net.workers[survivor].ctx.identity.peer_id: 0}
    assert (await train_and_send(net, net.workers[survivor], 0))["accepted"]
    await coordinator.step()
    ledger = coordinator.board.ledgers.get(0, 0)
    assert ledger is not None and ledger.closed
    assert ledger.timed_out == [net.workers[crashed].ctx.identity.peer_id]
    assert ledger.used == [net.workers[survivor].ctx.identity.peer_id]


async def test_forged_and_malformed_updates_are_refused(net: Net) -> None:
    coordinator = await net.start_coordinator()
    worker, outsider = net.add_worker("a"), net.add_worker("outsider")
    net.publish(without=("outsider",))  # the outsider is not a live peer of the run
    await coordinator.step()
    fetched = await worker.fetch(net.peer, 0)
    await outsider.fetch(net.peer, 0)
    good = worker.difference(fetched)
    url = f"http://{net.peer.record.http_addr}/blocktrain/update/0/0"

    with pytest.raises(RemoteError) as unsigned:
        await net.client.put_tensors(url, good)
    with pytest.raises(RemoteError) as garbled:
        await net.client.put_tensors(url, good,
                                     extra_headers={ENVELOPE_HEADER: base64.b64encode(b"x" * 64).decode()})
    with pytest.raises(RemoteError) as stranger:
        await outsider.send_update(net.peer, fetched, good, 1.0)
    with pytest.raises(RemoteError) as unknown_name:
        await worker.send_update(net.peer, fetched, {**good, "weights.x": torch.zeros(1)}, 1.0)
    nan = {**good, "block.out.bias": torch.full_like(good["block.out.bias"], float("nan"))}
    answer = await worker.send_update(net.peer, fetched, nan, 1.0)

    assert [e.value.status for e in (unsigned, garbled, stranger, unknown_name)] == [403, 403, 403, 400]
    assert "neither block.* nor embed.*" in str(unknown_name.value)
    assert not answer["accepted"] and "'out.bias' holds NaN or Inf" in answer["reason"]
    assert coordinator.board.versions == [0, 0] and coordinator.board.current(0).arrived == []


async def test_a_restarted_coordinator_resumes_from_its_checkpoints(net: Net) -> None:
    coordinator = await net.start_coordinator()
    worker = net.add_worker("a")
    net.publish()
    await coordinator.step()
    block = net.block_of("a")
    assert (await train_and_send(net, worker, block))["accepted"]
    await coordinator.step()
    before = await fetch_block(net.client, net.peer, block)
    await net.aclose()

    restarted = await net.start_coordinator()
    net.publish()

    after = await fetch_block(net.client, net.peer, block)
    assert restarted.resumed and restarted.board.versions == coordinator.board.versions
    assert after.version == 1
    assert all(torch.equal(after.tensors[n], before.tensors[n]) for n in before.tensors)


async def test_a_long_poll_answers_when_the_blocks_version_closes(net: Net) -> None:
    coordinator = await net.start_coordinator()
    worker = net.add_worker("a")
    net.publish()
    await coordinator.step()
    block = net.block_of("a")
    base = f"http://{net.peer.record.http_addr}/blocktrain/state"
    assert (await net.client.get_json(f"{base}?block={block}&after=0&wait_s=0"))["versions"][block] == 0
    assert (await train_and_send(net, worker, block))["accepted"]

    polling = asyncio.create_task(net.client.get_json(f"{base}?block={block}&after=0&wait_s=30"))
    await asyncio.wait_for(coordinator.poll_waiting.wait(), timeout=20)  # the request is in, waiting
    assert not polling.done()
    await coordinator.step()
    state = await asyncio.wait_for(polling, timeout=20)

    assert state["versions"][block] == 1
    with pytest.raises(RemoteError) as bad:
        await net.client.get_json(f"{base}?block={block}&after=x")
    assert bad.value.status == 400
