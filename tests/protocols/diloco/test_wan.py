"""Learners whose every message crosses an emulated WAN link (``LocalNet.shape``: 30 ms +-15 ms
each way, 10 Mbit/s, 2% of chunks stalled 0.2 s as a retransmission would): they mix in every
round, every ledger balances, and with global mixing they end in agreement, as on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.diloco.learner import LearnerRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet
from gossamer_harness.wan import LinkProfile

pytestmark = pytest.mark.timeout(300)
ROUNDS = 2
RUN = {
    "run": {"name": "wan", "protocol": "diloco", "heartbeat_s": 30.0},
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "hyper": {"rounds": ROUNDS, "batch_size": 4, "eval_batches": 1, "min_learners": 3, "w1_grace_s": 60.0,
              "w2_deadline_s": 60.0, "diloco": {"inner_steps": 2, "inner_lr": 0.003},
              "mixing": {"w1": "global", "w2": "global"}, "aggregator": {"name": "mean"}},
}


async def test_learners_mix_across_wan_links_with_latency_jitter_a_rate_cap_and_stalls(tmp_path: Path) -> None:
    net = await LocalNet.create(RUN, plugins=PLUGINS, workdir=tmp_path)
    roles: list[LearnerRole] = []
    for i in range(3):
        roles.append((await net.add(f"l{i}", ("learner",))).role)  # type: ignore[arg-type]
        link = LinkProfile.from_mbit(10, 30, jitter_s=0.015, drop_probability=0.02, seed=i)
        await net.shape(f"l{i}", link)
    try:
        await net.start()
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in roles)), timeout=240)

        stats = [net[f"l{i}"].link.stats for i in range(3)]  # type: ignore[union-attr]
        assert all(s.up.bytes_forwarded > 0 and s.down.bytes_forwarded > 0 for s in stats), stats
        for role in roles:
            assert role.finished and role.round == ROUNDS
            for ledger in role.history:
                assert len(ledger.params.used) == 2 and len(ledger.pseudo_gradients.used) == 2, ledger.to_json()
                assert ledger.balance_problems() == [] and not ledger.partial(), ledger.to_json()
        first = flat_parameters(roles[0].replica.module)
        for role in roles[1:]:
            other = flat_parameters(role.replica.module)
            assert all(torch.allclose(first[k], other[k], atol=1e-6) for k in first)
    finally:
        await net.aclose()
