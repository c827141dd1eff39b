"""A block coordinator started again on its checkpoint folder (a crash, then a restart with the
same identity), with real block workers over real HTTP on 127.0.0.1 (``test_coordinator.Net``):
a run that had started goes on with the workers left, even fewer than ``min_workers`` (the gate
applies to the start of a run only)."""

from __future__ import annotations

from pathlib import Path

from tests.protocols.blocktrain.test_coordinator import Net, text_file, train_and_send

__all__ = ["text_file"]  # a fixture


async def test_a_restarted_coordinator_does_not_gate_a_started_run_on_min_workers_again(tmp_path: Path,
                                                                                      text_file: Path) -> None:
    net = await Net.make(tmp_path, text_file, min_workers=2)
    try:
        coordinator = await net.start_coordinator()
        a = await net.add_worker("a")
        await net.add_worker("b")
        await net.publish()
        await coordinator.step()
        assert (await train_and_send(net, a, net.block_of("a")))["accepted"]
        await coordinator.step()  # a version closed: the run has started
        net.forget("b")  # a worker left while the coordinator was down

        restarted = await net.start_coordinator()
        await net.publish()
        await restarted.step()

        assert restarted.resumed and restarted.board.versions != [0, 0]
        assert list(restarted.assignment) == [a.ctx.identity.peer_id]  # the one worker left trains on
    finally:
        await net.aclose()
