"""One Byzantine expert host among four (LocalNet, real HTTP, signed messages): it sends its own
update sign-flipped x20 and claims pair counts for the experts it holds (issue 30). Counts above
what its batches hold get its update refused by every honest host; counts at the bound get it
used, and the default rules keep the honest hosts close to a clean run on the same shards. Under
the trusting rules (the defaults before: plain and token-weighted means) it lifts them far."""

from __future__ import annotations

from pathlib import Path

import pytest

from gossamer.crypto.identity import Identity
from gossamer.protocols.fomoe.host import ExpertHostRole
from gossamer_harness.fomoe.byzantine import run_hosts
from tests.protocols.fomoe.test_hosts_localnet import run_with

pytestmark = pytest.mark.timeout(240)
ROUNDS = 2
MARGIN = 0.25
"""Nats over the clean run's last held-out loss that the attack may cost an honest host."""
TRUSTING = {"dense": "mean", "expert": "token_weighted_mean", "clip": False}


def heldout(role: ExpertHostRole) -> list[float]:
    return [ledger.heldout_loss for ledger in role.history]


async def clean_and_attacked(tmp_path: Path, claim: int | str, **hyper: object
                             ) -> tuple[list[ExpertHostRole], list[ExpertHostRole], ExpertHostRole]:
    """(clean hosts, the attacked run's honest hosts, the Byzantine one), the same four identities."""
    run = run_with(rounds=ROUNDS, update_deadline_s=20.0, commit_deadline_s=20.0, **hyper)
    identities = [Identity.generate() for _ in range(4)]
    clean = await run_hosts(tmp_path / "clean", run, identities)
    attacked = await run_hosts(tmp_path / "attacked", run, identities, byzantine={3: {"claim": claim}})
    return clean[:3], attacked[:3], attacked[3]


@pytest.mark.parametrize("claim", ["absurd", "bound"])
async def test_a_byzantine_host_does_not_corrupt_the_honest_hosts(tmp_path: Path, claim: str) -> None:
    clean, honest, byzantine = await clean_and_attacked(tmp_path, 10**9 if claim == "absurd" else "bound")

    for role, reference in zip(honest, clean, strict=True):
        losses, clean_losses = heldout(role), heldout(reference)
        assert len(losses) == ROUNDS and losses[-1] < clean_losses[-1] + MARGIN, (losses, clean_losses)
        first = role.history.get(0)
        assert first is not None
        if claim == "absurd":  # refused whole: more pairs than the host's batches hold
            assert "tokens" in first.updates.rejected.get(byzantine.peer_id, ""), first.to_json()
            assert byzantine.peer_id not in first.agreed
        else:  # used, and bounded by the rules
            assert byzantine.peer_id in first.agreed


async def test_under_the_trusting_rules_the_same_host_corrupts_them(tmp_path: Path) -> None:
    """The attack bites: what an allowlist run that sets the plain means accepts."""
    clean, honest, byzantine = await clean_and_attacked(tmp_path, "bound", aggregator=TRUSTING)

    for role, reference in zip(honest, clean, strict=True):
        losses, clean_losses = heldout(role), heldout(reference)
        assert losses[-1] > clean_losses[-1] + 2 * MARGIN, (losses, clean_losses)
        assert all(byzantine.peer_id in ledger.agreed for ledger in role.history)
