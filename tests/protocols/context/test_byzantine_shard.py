"""A Byzantine ring member (LocalNet, real TCP frames, signatures) sends its gradient share
sign-flipped x20 to the leader, who sums every share into the step. With ``hyper.share_clip``
(the default 1: each share scaled down to the median share norm) the honest shards end close to
a clean ring's model; with 0 (the exact sum, trusting every member) the attack lifts their loss."""

from __future__ import annotations

from pathlib import Path

import pytest

from gossamer.protocols.core.text_data import evaluate
from gossamer_harness.context.byzantine import run_ring
from tests.protocols.context.harness import identities, reference, run_config

pytestmark = pytest.mark.timeout(240)
STEPS = 6
SHARDS = 4
MARGIN = 0.3
"""Nats over the clean ring's held-out loss that the attack may cost under the default."""


@pytest.mark.parametrize("share_clip", [1.0, 0.0])
async def test_a_byzantine_member_moves_the_ring_only_as_far_as_share_clip_allows(tmp_path: Path,
                                                                                  share_clip: float) -> None:
    roles = await run_ring(tmp_path, run_config(steps=STEPS, share_clip=share_clip), identities(SHARDS),
                           byzantine=[SHARDS - 1])
    settings, leader = roles[0].settings, roles[0]
    context = SHARDS * settings.chunk_tokens
    clean = evaluate(reference(settings, chunks=SHARDS, steps=STEPS), leader.data.heldout, context=context,
                     max_batches=settings.eval_batches, device="cpu")
    attacked = [role.replica.heldout_loss(role.data.heldout, context=context) for role in roles]

    assert all(role.replica.version == STEPS for role in roles)
    clipped = [ledger.clipped for ledger in leader.runner.history if ledger.applied]
    if share_clip:
        assert all(loss < clean + MARGIN for loss in attacked), (attacked, clean)
        assert all(roles[-1].peer_id in c for c in clipped), clipped  # its share was scaled every step
    else:
        assert all(loss > clean + 2 * MARGIN for loss in attacked), (attacked, clean)
        assert all(c == {} for c in clipped), clipped
