"""A ring stopped mid-run (Ctrl+C on every shard: each writes its state) and started again with the
same identities and checkpoint folders goes on from where it stopped, to the very parameters one
process computes for the whole run (a shard stopped a step behind the other downloads its state:
no step is trained twice or skipped)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gossamer.crypto.identity import Identity
from gossamer.protocols.context.shard import CpShardRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet
from tests.protocols.context.harness import drain, identities, reference, run_config

pytestmark = pytest.mark.timeout(240)
STEPS = 5
RUN = run_config(steps=STEPS)


async def ring(workdir: Path, owner: Identity, members: list[Identity]) -> tuple[LocalNet, list[CpShardRole]]:
    net = await LocalNet.create(RUN, plugins=PLUGINS, workdir=workdir, owner=owner)
    roles = [(await net.add(f"s{i}", ("cp-shard",), identity=me, checkpoint_every=0)).role
             for i, me in enumerate(members)]
    return net, roles  # type: ignore[return-value]


async def test_a_stopped_ring_resumes_where_it_stopped_and_ends_where_one_process_does(tmp_path: Path) -> None:
    owner, members = Identity.generate(), identities(2)
    net, first_life = await ring(tmp_path, owner, members)
    try:
        await net.start()
        assert await first_life[1].until_step(2, timeout_s=120)
        written = [await net.stop(name) for name in ("s0", "s1")]
    finally:
        await net.aclose()
    stopped_at = [role.replica.version for role in first_life]
    assert all(paths["cp-shard"].endswith("-state.safetensors") for paths in written)
    assert min(stopped_at) >= 2

    net, second_life = await ring(tmp_path, owner, members)
    try:
        await net.start()
        assert [role.resumed_from for role in second_life] == [paths["cp-shard"] for paths in written]
        await drain(second_life)
    finally:
        await net.aclose()
    applied = [ledger.step for ledger in second_life[0].runner.history if ledger.applied]
    assert applied == list(range(max(stopped_at), STEPS))  # no step trained twice, none skipped
    expected = dict(reference(second_life[0].settings, chunks=2, steps=STEPS).named_parameters())
    for role in second_life:
        assert role.finished and role.replica.version == STEPS
        for name, param in role.replica.model.named_parameters():
            assert torch.equal(param, expected[name]), name
