"""FoMoE expert hosts as real daemons through the CLI on 127.0.0.1: four hosts (four experts,
r = 2) train with the held-out loss falling; one is SIGKILLed, and the other three re-place its
experts among themselves with none lost and go on training; ``gossamer status`` shows every
expert with two live holders; Ctrl+C stops each host cleanly, writing its part
(``gossamer_harness.fomoe.hosts.kill_one_host``, which ``scripts/chaos/fomoe_hosts.py`` runs too, beside
the preset run: ``gossamer swarm --preset fomoe``, 8 rounds, checkpoints of every expert in two)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gossamer_harness.fomoe.hosts import kill_one_host

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]


def test_four_hosts_train_and_a_killed_one_is_re_placed_with_no_expert_lost(tmp_path: Path) -> None:
    seen = kill_one_host(tmp_path)
    assert sorted(seen["experts_held_after"]) == [0, 1, 2, 3]
