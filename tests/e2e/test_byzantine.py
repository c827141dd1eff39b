"""Byzantine learners in a real network (daemons through the CLI on 127.0.0.1).

- The strongest adaptive attack against the run's default aggregator (the geometric median), sent
  by one learner of four, leaves the honest learners' held-out loss within ``MARGIN`` of the same
  run without it, started beside it (the same identities, so the same shards and batches), and
  the geometric median weighs the attacker's update in (down) rather than rejecting anyone.
- Peers that never send their pseudo-gradients do not switch Krum off: every round the honest
  learners count them as failures and degrade to the coordinate-wise median instead of falling
  back to their own pseudo-gradients (``robust.aggregate_or_degrade``).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from gossamer.crypto.identity import Identity
from gossamer.protocols.core.robust import DEFAULT
from gossamer_harness.localproc import LOOPBACK, GossamerProcess, Processes
from tests.e2e.test_learners import RUN

# Every wait follows the processes' progress; the limit is the last resort (each test takes one to
# two minutes at load 2, and many times that on a machine as loaded as a busy CI host)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

STRONGEST = "mimic"
"""The adaptive attack that cost the geometric median most in scripts/experiments/byzantine.py,
averaged over f = 1, 2, 3 of 8 and in its worst cell (+0.44 nats at f = 3; docs/EXPERIMENTS.md 2a):
every attacker sends a copy of the honest update farthest from the honest mean, chosen once."""
ROUNDS = 8
"""Past the first rounds' plateau: at 4 rounds the loss was still falling steeply and paired runs
(the same identities, clean beside attacked) came out -0.34 to +0.53 apart with either attack, as
the break from the plateau came a round earlier or later; at 8 rounds, paired differences of
-0.01 to -0.03 (radius sign flip, 3 pairs) and -0.12 / -0.17 (IPM, 2 pairs), clean runs ending at
2.8-3.5 (measured with centered clipping, the default before the full grid; the geometric median
passes the same margin)."""
MARGIN = 0.4
"""Nats/byte the honest learners' mean final held-out loss may exceed the paired clean run's:
more than twice the largest paired difference measured at ``ROUNDS`` (above), less than what the
clean run learns after round 0 (0.34-0.57 in those pairs)."""


class Swarm:
    """An orchestrator and one learner per identity (the run of ``test_learners.RUN``: a 1-layer
    byte LM, 15 inner steps, global W1 and W2)."""

    def __init__(self, processes: Processes, work: Path, identities: list[Path], *, name: str, rounds: int,
                 aggregator: str, f: int, attacks: dict[int, str], w2_deadline_s: float, extra: str = "") -> None:
        run_dir = work / name
        run_dir.mkdir()
        (run_dir / "run.toml").write_text(RUN.format(name=name, rounds=rounds, w2_deadline_s=w2_deadline_s,
                                                     learners=len(identities), aggregator=aggregator, f=f,
                                                     aggregator_extra=extra, heartbeat_s=1.0))
        self.rounds, self.attacks, self.processes = rounds, attacks, processes
        self.orchestrator = processes.start(["orchestrator", "-c", str(run_dir / "run.toml"), "--new_swarm",
                                             "--events", *LOOPBACK, "--identity_path", str(run_dir / "owner.pem")],
                                            log_path=run_dir / "orch.log")
        self.learners: list[GossamerProcess] = []
        self._identities, self._dir = identities, run_dir

    def start_learners(self) -> None:
        ready = self.orchestrator.wait_ready()
        for i, identity in enumerate(self._identities):
            attack = ["--attack", self.attacks[i]] if i in self.attacks else []
            self.learners.append(self.processes.start(
                ["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--roles", "learner",
                 "--events", *LOOPBACK, "--threads", "1", "--identity_path", str(identity), "--checkpoint_dir",
                 str(self._dir / "ckpt"), *attack], log_path=self._dir / f"l{i}.log"))

    def honest_rounds(self, *, others: list[GossamerProcess]) -> dict[int, list[dict]]:
        """Every honest learner's round events, all rounds (as long as the swarm or ``others`` make progress)."""
        everyone = [self.orchestrator, *self.learners, *others]
        return {i: [proc.wait_event(lambda e: e["event"] == "diloco.round", also=everyone) for _ in range(self.rounds)]
                for i, proc in enumerate(self.learners) if i not in self.attacks}


def identities(work: Path, count: int) -> tuple[list[Path], list[str]]:
    paths = [work / f"learner{i}.pem" for i in range(count)]
    return paths, [Identity.create(path).peer_id for path in paths]


def summary(events: list[dict]) -> list[tuple]:
    return [(e["round"], round(e["heldout_loss"], 3), e["pgrads_used"], e["timed_out"], e["rejected"], e["note"])
            for e in events]


def test_the_strongest_adaptive_attack_stays_within_a_margin_of_the_clean_run(processes: Processes,
                                                                             tmp_path: Path) -> None:
    paths, ids = identities(tmp_path, 4)
    # a round ends as soon as every pseudo-gradient is in: the long deadline only matters on a busy host
    common = {"rounds": ROUNDS, "aggregator": DEFAULT, "f": 1, "w2_deadline_s": 60.0}
    swarms = [Swarm(processes, tmp_path, paths, name="clean", attacks={}, **common),
              Swarm(processes, tmp_path, paths, name="attacked", attacks={3: STRONGEST}, **common)]
    for swarm in swarms:
        swarm.start_learners()
    clean, attacked = (swarm.honest_rounds(others=processes.started) for swarm in swarms)
    processes.close()

    for events in [*clean.values(), *attacked.values()]:
        for e in events:  # the geometric median rejects nobody: it weighs the attacker's update in
            assert ids[3] not in e["rejected"], summary(events)
            assert e["pgrads_used"] <= 3 - len(e["timed_out"]), summary(events)
    # rounds in which all three neighbours were used: the attacker's update went into the aggregate
    assert any(e["pgrads_used"] == 3 for events in attacked.values() for e in events), attacked
    # the last two rounds of every honest learner: one learner's one round swung 0.5 between clean runs
    clean_final = statistics.mean(e["heldout_loss"] for events in clean.values() for e in events[-2:])
    attacked_final = statistics.mean(e["heldout_loss"] for events in attacked.values() for e in events[-2:])
    assert attacked_final <= clean_final + MARGIN, ({i: summary(e) for i, e in clean.items()},
                                                    {i: summary(e) for i, e in attacked.items()})


def test_peers_that_never_send_do_not_switch_the_defence_off(processes: Processes, tmp_path: Path) -> None:
    """Krum with f = 1 needs 2f + 3 = 5 usable of the five learners; one never sends. In every round
    whose ledger has it timed out, the honest learner degrades to the coordinate-wise median of
    what did arrive (before, it fell back to its own pseudo-gradient: no defence, no mixing).

    A round in which a learner's live view held nobody else (seen on a host at load 30: heartbeats
    lapse) has no silent peer in its ledger and no neighbourhood to defend; it is not what this
    test is about, so the claim is on the rounds that name the silent peer, and each learner must
    have at least one."""
    paths, ids = identities(tmp_path, 5)
    swarm = Swarm(processes, tmp_path, paths, name="silent", rounds=3, aggregator="krum", f=1,
                  attacks={4: "withhold"}, w2_deadline_s=30.0)  # every round waits this long for the silent peer
    swarm.start_learners()
    rounds = swarm.honest_rounds(others=[])
    processes.close()

    everything = {i: summary(events) for i, events in rounds.items()}
    for events in rounds.values():
        withheld = [e for e in events if ids[4] in e["timed_out"]]
        assert withheld, everything
        for e in withheld:  # whatever else arrived in time, the round aggregates robustly: it never gives up
            assert e["note"].startswith("degraded to the coordinate-wise median"), everything
    assert any(e["pgrads_used"] == 3 for events in rounds.values() for e in events), everything
