"""A learner stopped mid-run (Ctrl+C: its roles write their checkpoints) and started again with the
same identity and checkpoint directory continues the same trajectory: on one process its final
parameters and every loss it reports are bit-identical to a run that was never stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from gossamer.crypto.identity import Identity
from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.diloco.learner import LearnerRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet

pytestmark = pytest.mark.timeout(300)
ROUNDS = 4
RUN = {
    "run": {"name": "resume", "protocol": "diloco", "heartbeat_s": 30.0},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32},
    "hyper": {"rounds": ROUNDS, "batch_size": 8, "eval_batches": 2, "min_learners": 1, "w1_grace_s": 0.0,
              "diloco": {"inner_steps": 6, "inner_lr": 0.003}, "aggregator": {"name": "mean"}},
}


async def learner(workdir: Path, owner: Identity, me: Identity) -> tuple[LocalNet, LearnerRole]:
    net = await LocalNet.create(RUN, plugins=PLUGINS, workdir=workdir, owner=owner)
    peer = await net.add("learner", ("learner",), identity=me, checkpoint_every=0)
    return net, peer.role  # type: ignore[return-value]


async def run_to_the_end(net: LocalNet, role: LearnerRole) -> None:
    await net.start()
    await asyncio.wait_for(role.drain(), timeout=240)
    assert role.finished and role.round == ROUNDS


async def test_a_stopped_learner_resumes_the_same_trajectory_bit_for_bit(tmp_path: Path) -> None:
    owner, me = Identity.generate(), Identity.generate()
    net, straight = await learner(tmp_path / "straight", owner, me)
    try:
        await run_to_the_end(net, straight)
    finally:
        await net.aclose()

    net, first_life = await learner(tmp_path / "stopped", owner, me)
    try:
        await net.start()
        # two rounds KEPT (the series grows in the same step as the kept state), not just stepped:
        # replica.round moves at the outer step, before the held-out evaluation and the keeping
        await net["learner"].ctx.until_view(lambda: len(first_life.series["heldout_loss"]) >= 2, timeout_s=240)
        written = await net.stop("learner")
    finally:
        await net.aclose()
    assert "learner" in written and written["learner"].endswith("-state.safetensors")

    net, second_life = await learner(tmp_path / "stopped", owner, me)
    try:
        assert second_life.resumed_from == written["learner"] and second_life.round >= 2
        await run_to_the_end(net, second_life)
    finally:
        await net.aclose()

    want, got = flat_parameters(straight.replica.module), flat_parameters(second_life.replica.module)
    assert want.keys() == got.keys() and all(torch.equal(want[name], got[name]) for name in want)
    assert second_life.series == straight.series  # every round's train and held-out loss, exactly


async def test_a_learner_writes_its_state_every_checkpoint_every_rounds(tmp_path: Path) -> None:
    """With ``checkpoint_every = 2`` the state file is written after rounds 2 and 4 (of 5), each
    time holding the round it was written at; nothing is written between (each round's event goes
    out before that round's write, so it sees the write before it)."""
    net = await LocalNet.create({**RUN, "hyper": {**RUN["hyper"], "rounds": 5}}, plugins=PLUGINS, workdir=tmp_path)
    role: LearnerRole = (await net.add("learner", ("learner",), checkpoint_every=2)).role  # type: ignore[assignment]

    def saved_round() -> str | None:
        found = role.kept.checkpoints.read(role.kept.name, kind="state")
        return None if found is None else found[1]["round"]

    seen: list[str | None] = []
    net.watchers.append(lambda peer, event, fields: seen.append(saved_round()) if event == "diloco.round" else None)
    try:
        await net.start()
        await asyncio.wait_for(role.drain(), timeout=240)
        assert role.finished and role.round == 5
    finally:
        await net.aclose()
    assert seen == [None, None, "2", "2", "4"]
    assert saved_round() == "4"  # the end writes the final parameters (their own file), not the state
