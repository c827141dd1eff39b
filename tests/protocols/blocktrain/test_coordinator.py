"""The block coordinator and real block workers over real HTTP on 127.0.0.1 (port 0), found through
real signed records in a PeerView (no DHT, no TCP: ``membership`` is None): updates are averaged,
written and served, stale and forged ones refused, a crashed worker's block covered again, a
coordinator resumed from its checkpoints, a long poll answered when the version closes. The
version loop is driven one ``step()`` at a time, so each test decides when versions close."""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from gossamer.crypto.envelope import payload_digest, seal
from gossamer.peer.kit.messaging import ENVELOPE_HEADER, request_target
from gossamer.peer.run.view import LivePeer
from gossamer.protocols.blocktrain.coordinator import BlockCoordinatorRole
from gossamer.protocols.blocktrain.core import build_stack, generate
from gossamer.protocols.blocktrain.fetch import BlockVersion, fetch_block
from gossamer.protocols.blocktrain.worker import BlockWorkerRole, update_metadata, update_url
from gossamer.protocols.core.text_data import load_text
from gossamer.protocols.registry import PLUGINS
from gossamer.transport.errors import RemoteError
from gossamer.transport.http_client import HttpClient
from gossamer.transport.safetensors_stream import encode_safetensors, load_file
from gossamer_harness.localnet import LocalNet

MODEL = {"d_model": 16, "n_heads": 2, "context": 16, "num_blocks": 2}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes(load_text("builtin:pydoc")[:200_000])
    return path


class Net(LocalNet):
    """A coordinator and workers in a LocalNet (real HTTP servers, one view of signed records)."""

    data: Path
    coordinators = 0

    @classmethod
    async def make(cls, tmp_path: Path, data: Path, model: dict | None = None, **hyper: object) -> Net:
        doc = {"run": {"name": "bt", "protocol": "blocktrain", "heartbeat_s": 30.0}, "model": model or MODEL,
               "hyper": {"versions": 3, "local_steps": 2, "batch_size": 4, "deadline_s": 600.0,
                         "eval_batches": 0, "sample_bytes": 24, **hyper}}
        net = await cls.create(doc, plugins=PLUGINS, workdir=tmp_path)
        net.data = data
        return net

    @property
    def client(self) -> HttpClient:
        return self.http_client

    async def start_coordinator(self) -> BlockCoordinatorRole:
        """A coordinator (not started: tests ``step()`` it); a second call restarts it from its checkpoints."""
        if self.coordinators:
            await self.kill("coordinator")
            self.forget("coordinator")
            del self.peers["coordinator"]
        self.coordinators += 1
        peer = await self.add("coordinator", ("orchestrator", "block-coordinator"), data=str(self.data),
                              checkpoint_dir=self.workdir / "checkpoints")
        coordinator: BlockCoordinatorRole = peer.role_named("block-coordinator")  # type: ignore[assignment]
        await coordinator.write_checkpoints()
        return coordinator

    @property
    def coordinator(self) -> BlockCoordinatorRole:
        return self.peers["coordinator"].role_named("block-coordinator")  # type: ignore[return-value]

    @property
    def workers(self) -> dict[str, BlockWorkerRole]:
        return {name: peer.role for name, peer in self.peers.items() if name != "coordinator"}  # type: ignore[misc]

    async def add_worker(self, name: str) -> BlockWorkerRole:
        return (await self.add(name, ("block-worker",), data=str(self.data))).role  # type: ignore[return-value]

    @property
    def peer(self) -> LivePeer:
        found = self.view.get(self.owner.peer_id)
        assert found is not None
        return found

    def block_of(self, name: str) -> int:
        return self.coordinator.assignment[self.workers[name].ctx.identity.peer_id]


@pytest.fixture
async def net(request: pytest.FixtureRequest, tmp_path: Path, text_file: Path) -> AsyncIterator[Net]:
    network = await Net.make(tmp_path, text_file, getattr(request, "param", None))
    try:
        yield network
    finally:
        await network.aclose()


async def send_update(worker: BlockWorkerRole, coordinator: LivePeer, fetched: BlockVersion,
                      tensors: dict[str, torch.Tensor], loss: float) -> dict:
    """What a worker's cycle sends: a signed update against ``fetched``; the coordinator's answer."""
    reply = await worker.messenger.request(update_url(coordinator, fetched), recipient=coordinator.record.peer_id,
                                           round=fetched.version, tensors=tensors, metadata=update_metadata(loss, 2))
    return reply.answer


async def train_and_send(net: Net, worker: BlockWorkerRole, block: int) -> dict:
    fetched = await worker.fetch(net.peer, block)
    loss = await asyncio.to_thread(worker.train, block)
    return await send_update(worker, net.peer, fetched, worker.difference(fetched), loss)


async def test_same_block_updates_are_averaged_into_the_next_version_and_written_to_disk(net: Net) -> None:
    coordinator = await net.start_coordinator()
    a, b = await net.add_worker("a"), await net.add_worker("b")
    await net.add_worker("c"), await net.add_worker("d")
    await net.publish()
    await coordinator.step()
    block = net.block_of("a")
    b = next(w for n, w in net.workers.items() if n != "a" and net.block_of(n) == block)
    base = await fetch_block(net.client, net.peer, block)
    fetched = {w: await w.fetch(net.peer, block) for w in (a, b)}
    for worker in (a, b):
        await asyncio.to_thread(worker.train, block)
    updates = [worker.difference(fetched[worker]) for worker in (a, b)]

    answers = [await send_update(w, net.peer, fetched[w], u, 1.0)
               for w, u in zip((a, b), updates, strict=True)]
    await coordinator.step()

    assert [answer["accepted"] for answer in answers] == [True, True]
    served = await fetch_block(net.client, net.peer, block)
    expected = {name: base.tensors[name] + torch.stack([u[f"block.{name}"] for u in updates]).mean(dim=0)
                for name in base.tensors}
    assert served.version == 1 and all(torch.equal(served.tensors[n], expected[n]) for n in expected)
    tensors, metadata = load_file(coordinator.directory / f"block{block}.safetensors")
    assert metadata["version"] == "1" and torch.equal(tensors["out.weight"], expected["out.weight"])
    ledger = coordinator.board.ledgers.get((block, 0))
    assert ledger is not None and sorted(ledger.used) == sorted(w.ctx.identity.peer_id for w in (a, b))


@pytest.mark.parametrize("net", [{**MODEL, "embedding": "averaged"}], indirect=True)
async def test_an_averaged_embedding_moves_by_the_workers_mean_difference_over_the_blocks(net: Net) -> None:
    coordinator = await net.start_coordinator()
    worker = await net.add_worker("a")
    await net.publish()
    await coordinator.step()
    block = net.block_of("a")
    fetched = await worker.fetch(net.peer, block)
    await asyncio.to_thread(worker.train, block)
    update = worker.difference(fetched)

    assert (await send_update(worker, net.peer, fetched, update, 1.0))["accepted"]
    await coordinator.step()

    served = await fetch_block(net.client, net.peer, 1 - block)  # every block is served with the new E
    expected = fetched.embedding["weight"] + update["embed.weight"] / MODEL["num_blocks"]
    assert torch.equal(served.embedding["weight"], expected) and served.version == 0
    tensors, metadata = load_file(coordinator.directory / "embedding.safetensors")
    assert torch.equal(tensors["weight"], expected) and metadata["version"] == "1"
    assert bool((update["embed.weight"] != 0).any())  # the worker did train E


async def test_a_stale_update_is_dropped_and_recorded_in_the_ledger_of_its_version(net: Net) -> None:
    coordinator = await net.start_coordinator()
    a, b = await net.add_worker("a"), await net.add_worker("b")
    await net.publish()
    await coordinator.step()
    block = net.block_of("a")  # b trains the other block; it starts on a's block just as a finishes
    late = await b.fetch(net.peer, block)
    await asyncio.to_thread(b.train, block)

    assert (await train_and_send(net, a, block))["accepted"]
    await coordinator.step()  # a was the only worker assigned: version 0 closes
    answer = await send_update(b, net.peer, late, b.difference(late), 1.0)

    assert not answer["accepted"]
    assert answer["reason"].startswith(f"stale: trained from version 0 of block {block}")
    assert coordinator.board.versions[block] == 1
    ledger = coordinator.board.ledgers.get((block, 0))
    assert ledger is not None and ledger.rejected == {b.ctx.identity.peer_id: answer["reason"]}
    assert ledger.used == [a.ctx.identity.peer_id]


async def test_no_block_is_assigned_until_min_workers_are_live_and_the_gate_opens_once(tmp_path: Path,
                                                                                       text_file: Path) -> None:
    net = await Net.make(tmp_path, text_file, min_workers=2)
    try:
        coordinator = await net.start_coordinator()
        await net.add_worker("a")
        await net.publish()
        await coordinator.step()
        assert coordinator.assignment == {} and not coordinator.status()["started"]
        await net.add_worker("b")
        await net.publish()
        await coordinator.step()
        assert sorted(coordinator.assignment.values()) == [0, 1] and coordinator.status()["started"]
        net.forget("b")  # min_workers gates the start only: the run goes on with the worker left
        await coordinator.step()
        assert list(coordinator.assignment) == [net.workers["a"].ctx.identity.peer_id]
    finally:
        await net.aclose()


async def test_a_crashed_workers_block_is_reassigned_and_it_is_recorded_as_timed_out(net: Net) -> None:
    coordinator = await net.start_coordinator()
    await net.add_worker("a"), await net.add_worker("b")
    await net.publish()
    await coordinator.step()
    crashed, survivor = ("a", "b") if net.block_of("a") == 0 else ("b", "a")
    assert (net.block_of(crashed), net.block_of(survivor)) == (0, 1)

    net.forget(crashed)  # its record expired: the DHT no longer returns it
    await coordinator.step()
    assert (await train_and_send(net, net.workers[survivor], 1))["accepted"]
    await coordinator.step()  # block 1 closes; block 0, now furthest behind, gets the survivor

    state = await net.client.get_json(f"http://{net.peer.record.http_addr}/blocktrain/state")
    assert state["assignment"] == {net.workers[survivor].ctx.identity.peer_id: 0}
    assert (await train_and_send(net, net.workers[survivor], 0))["accepted"]
    await coordinator.step()
    ledger = coordinator.board.ledgers.get((0, 0))
    assert ledger is not None and ledger.closed
    assert ledger.timed_out == [net.workers[crashed].ctx.identity.peer_id]
    assert ledger.used == [net.workers[survivor].ctx.identity.peer_id]


async def test_forged_and_malformed_updates_are_refused(net: Net) -> None:
    coordinator = await net.start_coordinator()
    worker, outsider = await net.add_worker("a"), await net.add_worker("outsider")
    net.forget("outsider")  # the outsider is not a live peer of the run
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
        await send_update(outsider, net.peer, fetched, good, 1.0)
    with pytest.raises(RemoteError) as unknown_name:
        await send_update(worker, net.peer, fetched, {**good, "weights.x": torch.zeros(1)}, 1.0)
    nan = {**good, "block.out.bias": torch.full_like(good["block.out.bias"], float("nan"))}
    answer = await send_update(worker, net.peer, fetched, nan, 1.0)

    assert [e.value.status for e in (unsigned, garbled, stranger, unknown_name)] == [403, 403, 403, 400]
    assert "neither block.* nor embed.*" in str(unknown_name.value)
    assert not answer["accepted"] and "'out.bias' holds NaN or Inf" in answer["reason"]
    assert coordinator.board.versions == [0, 0] and coordinator.board.current(0).arrived == []


async def test_a_restarted_coordinator_resumes_from_its_checkpoints(net: Net) -> None:
    coordinator = await net.start_coordinator()
    worker = await net.add_worker("a")
    await net.publish()
    await coordinator.step()
    block = net.block_of("a")
    assert (await train_and_send(net, worker, block))["accepted"]
    await coordinator.step()
    before = await fetch_block(net.client, net.peer, block)

    restarted = await net.start_coordinator()  # the first one is killed; this one reads its checkpoints
    await net.publish()

    after = await fetch_block(net.client, net.peer, block)
    assert restarted.resumed and restarted.board.versions == coordinator.board.versions
    assert after.version == 1
    assert all(torch.equal(after.tensors[n], before.tensors[n]) for n in before.tensors)


async def test_a_long_poll_answers_when_the_blocks_version_closes(net: Net) -> None:
    coordinator = await net.start_coordinator()
    worker = await net.add_worker("a")
    await net.publish()
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


def signed_by(worker: BlockWorkerRole, coordinator: LivePeer, *, url: str, round: int,
              chunks: list) -> dict[str, str]:
    """The envelope header a worker's messenger would send for ``url`` (to replay it elsewhere)."""
    blob = seal(worker.ctx.identity, recipient=coordinator.record.peer_id, run_id=worker.ctx.manifest.run_id,
                round=round, method="PUT", target=request_target(url), payload_digest=payload_digest(*chunks),
                now=worker.ctx.now(), nonce=secrets.token_bytes(16))
    return {ENVELOPE_HEADER: base64.b64encode(blob).decode()}


async def test_an_update_moved_to_another_block_in_transit_is_refused_and_the_genuine_one_filed(
        net: Net) -> None:
    coordinator = await net.start_coordinator()
    worker = await net.add_worker("a")
    await net.publish()
    await coordinator.step()
    block = net.block_of("a")
    fetched = await worker.fetch(net.peer, block)
    loss = await asyncio.to_thread(worker.train, block)
    size, chunks = encode_safetensors(worker.difference(fetched), update_metadata(loss, 2))
    genuine = update_url(net.peer, fetched)
    headers = signed_by(worker, net.peer, url=genuine, round=fetched.version, chunks=chunks)
    moved = genuine.replace(f"/update/{block}/", f"/update/{1 - block}/")  # both blocks have the same shapes

    with pytest.raises(RemoteError) as refused:
        await net.client.put_body(moved, size, chunks, extra_headers=headers)
    answer = await net.client.put_body(genuine, size, chunks, extra_headers=headers)

    assert refused.value.status == 403 and answer["accepted"]
    assert coordinator.board.current(1 - block).arrived == []
    assert coordinator.board.current(block).arrived == [worker.ctx.identity.peer_id]


async def test_a_5000_digit_base_version_is_404_not_500(net: Net) -> None:
    coordinator = await net.start_coordinator()
    worker = await net.add_worker("a")
    await net.publish()
    await coordinator.step()
    fetched = await worker.fetch(net.peer, 0)
    size, chunks = encode_safetensors(worker.difference(fetched), update_metadata(1.0, 2))
    headers = signed_by(worker, net.peer, url=update_url(net.peer, fetched), round=0, chunks=chunks)

    with pytest.raises(RemoteError) as refused:
        await net.client.put_body(f"http://{net.peer.record.http_addr}/blocktrain/update/0/{'9' * 5000}", size,
                                  chunks, extra_headers=headers)

    assert refused.value.status == 404 and coordinator.board.current(0).arrived == []


async def test_the_finished_run_prints_a_sample_of_its_final_checkpoints(net: Net) -> None:
    coordinator = await net.start_coordinator()
    events: list[tuple[str, dict]] = []
    coordinator.ctx.events.observer = lambda event, fields: events.append((event, dict(fields)))
    workers = [await net.add_worker("a"), await net.add_worker("b")]
    await net.publish()
    await coordinator.step()
    for _ in range(12):  # 3 versions of 2 blocks; a worker may be moved to the block that is behind
        for name, worker in zip("ab", workers, strict=True):
            if not coordinator.finished:
                await train_and_send(net, worker, net.block_of(name))
                await coordinator.step()
    assert coordinator.finished

    finished = [fields for event, fields in events if event == "blocktrain.finished"]
    assert len(finished) == 1 and finished[0]["versions"] == [3, 3] and finished[0]["prompt"] == "The "
    config = coordinator.settings.model
    found = coordinator.checkpoints.read(config.num_blocks)
    assert found is not None
    blocks, embedding = found
    stack = build_stack(config, seed=0, device="cpu")  # what a host would build from the files on disk
    for k, block in enumerate(blocks):
        stack.load_block_state(k, block.tensors)
    if embedding is not None:
        stack.load_embedding_state(embedding.tensors)
    again = generate(stack, b"The ", new_bytes=24, passes=config.context // 2, temperature=0.8,
                     generator=torch.Generator().manual_seed(0))
    assert [b.version for b in blocks] == [3, 3]
    assert finished[0]["sample"] == again.decode("utf-8", "replace")
    initial = generate(build_stack(config, seed=0, device="cpu"), b"The ", new_bytes=24, passes=config.context // 2,
                       temperature=0.8, generator=torch.Generator().manual_seed(0))
    assert again != initial  # the sample comes from the trained versions, not the initial stack
