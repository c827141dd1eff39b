"""A block worker stopped after some updates and started again with the same identity and checkpoint
folder takes back its block's AdamW state, generators and counts: its next cycle (the role's own
``_cycle``) trains to the very tensors of a worker never stopped, where a fresh one does not; with
``checkpoint_every`` it writes that state every N updates. The coordinator is not stepped, so
every cycle trains from version 0 and only what the worker kept differs between its lives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gossamer.crypto.identity import Identity
from gossamer.peer.kit.state_tree import unpack_state
from gossamer.protocols.blocktrain.worker import BlockWorkerRole
from gossamer.protocols.core.text_data import load_text
from tests.protocols.blocktrain.test_coordinator import Net

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes(load_text("builtin:pydoc")[:200_000])
    return path


async def worker(net: Net, name: str, me: Identity, folder: Path, **config: object) -> BlockWorkerRole:
    """A worker process with identity ``me`` and checkpoint folder ``folder`` (not started: the test
    runs its cycles); the previous process of that identity is gone."""
    for old in [n for n, peer in net.peers.items() if peer.peer_id == me.peer_id]:
        await net.kill(old)
        net.forget(old)
        del net.peers[old]
    peer = await net.add(name, ("block-worker",), identity=me, data=str(net.data), checkpoint_dir=folder, **config)
    return peer.role  # type: ignore[return-value]


async def cycles(net: Net, role: BlockWorkerRole, block: int, count: int) -> dict[str, torch.Tensor]:
    """``count`` of the worker's cycles; the block's tensors after the last (CPU copies)."""
    for _ in range(count):
        await role._cycle(net.peer, block)
    return {name: t.detach().to("cpu", copy=True) for name, t in role.stack.block_state(block).items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


async def test_a_stopped_worker_resumes_its_optimizer_generators_and_counts_bit_for_bit(
        tmp_path: Path, text_file: Path) -> None:
    net = await Net.make(tmp_path, text_file)
    me = Identity.generate()
    try:
        coordinator = await net.start_coordinator()
        straight = await worker(net, "straight", me, tmp_path / "straight")
        await net.publish()
        await coordinator.step()
        block = coordinator.assignment[me.peer_id]
        want = await cycles(net, straight, block, 3)

        first_life = await worker(net, "first", me, tmp_path / "stopped")
        await cycles(net, first_life, block, 2)
        written = await net.stop("first")
        assert written["block-worker"].endswith("-worker-state.safetensors")

        second_life = await worker(net, "second", me, tmp_path / "stopped")
        assert second_life.resumed_from == written["block-worker"]
        assert second_life.updates == first_life.updates and second_life.updates["sent"] == 2
        got = await cycles(net, second_life, block, 1)
        assert second_life.block == block and second_life.updates["sent"] == 3

        afresh = await worker(net, "afresh", me, tmp_path / "afresh")  # the control: nothing to resume
        assert afresh.resumed_from == "" and afresh.updates["sent"] == 0
        fresh = await cycles(net, afresh, block, 1)
    finally:
        await net.aclose()
    assert same(got, want)
    assert not same(fresh, want)


async def test_a_worker_writes_its_state_every_checkpoint_every_updates(tmp_path: Path, text_file: Path) -> None:
    net = await Net.make(tmp_path, text_file)
    me = Identity.generate()
    try:
        coordinator = await net.start_coordinator()
        role = await worker(net, "a", me, tmp_path / "worker", checkpoint_every=2)
        await net.publish()
        await coordinator.step()
        block = coordinator.assignment[me.peer_id]

        def saved_updates() -> int | None:
            found = role.checkpoints.read(role._state_name(), kind="state")
            return None if found is None else unpack_state(found[0])["updates"]["sent"]

        seen = []
        for _ in range(5):
            await cycles(net, role, block, 1)
            seen.append(saved_updates())
    finally:
        await net.aclose()
    assert seen == [None, 2, 2, 4, 4]
