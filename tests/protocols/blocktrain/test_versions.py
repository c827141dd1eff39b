"""The coordinator's version board: updates against the current version are averaged into the next
one, stale and malformed ones are refused and written in the ledger of the version they came
from, and versions close at the deadline or once every assigned worker was heard from; with adaptive pacing
the deadline follows the measured update times and a persistently slow worker is not waited for."""

from __future__ import annotations

import random

import pytest
import torch

from gossamer.protocols.blocktrain.versions import BlockVersions


def state(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((2, 3), value), "b": torch.full((3,), value)}


def board(*, num_blocks: int = 2, averaged: bool = False, max_norm: float = 100.0,
          adaptive: bool = True) -> BlockVersions:
    return BlockVersions([state(float(k)) for k in range(num_blocks)], {"weight": torch.zeros(4, 2)},
                         deadline_s=10.0, max_norm=max_norm, embedding_averaged=averaged, now=0.0,
                         adaptive=adaptive)


def update(value: float, embedding: float | None = None) -> dict[str, dict[str, torch.Tensor]]:
    parts = {"block": state(value)}
    if embedding is not None:
        parts["embedding"] = {"weight": torch.full((4, 2), embedding)}
    return parts


def test_updates_against_the_current_version_are_averaged_into_the_next() -> None:
    versions = board()
    assert versions.offer(1, 0, "a", update(0.5), loss=2.0, now=0.5) is None
    assert versions.offer(1, 0, "b", update(1.5), loss=4.0, now=0.5) is None

    ledger = versions.close(1, now=1.0)

    assert versions.versions == [0, 1]
    assert torch.equal(versions.blocks[1]["w"], torch.full((2, 3), 2.0))  # 1 + mean(0.5, 1.5)
    assert torch.equal(versions.blocks[0]["w"], torch.zeros(2, 3))  # other blocks untouched
    assert (ledger.version, ledger.used, ledger.train_loss, ledger.closed) == (0, ["a", "b"], 3.0, True)


def test_a_stale_update_is_refused_and_written_in_the_ledger_of_its_own_version() -> None:
    versions = board()
    versions.offer(0, 0, "a", update(1.0), loss=1.0, now=0.5)
    versions.close(0, now=1.0)

    reason = versions.offer(0, 0, "b", update(1.0), loss=1.0, now=0.5)

    assert reason is not None and reason.startswith("stale: trained from version 0 of block 0")
    old, new = versions.ledgers.get((0, 0)), versions.ledgers.get((0, 1))
    assert old is not None and old.rejected == {"b": reason} and old.used == ["a"]
    assert new is not None and new.rejected == {} and new.arrived == []
    assert torch.equal(versions.blocks[0]["w"], torch.ones(2, 3))


@pytest.mark.parametrize(
    ("parts", "reason"),
    [
        ({"block": {"w": torch.zeros(2, 3)}}, "missing ['b']"),
        ({"block": {**state(0.0), "extra": torch.zeros(1)}}, "unexpected ['extra']"),
        ({"block": {"w": torch.zeros(3, 2), "b": torch.zeros(3)}}, "'w' is (3, 2)"),
        ({"block": {"w": torch.zeros(2, 3, dtype=torch.float64), "b": torch.zeros(3)}}, "torch.float64"),
        ({"block": {"w": torch.full((2, 3), float("nan")), "b": torch.zeros(3)}}, "NaN or Inf"),
        ({"block": state(1e3)}, "over max_norm"),
        ({"block": state(0.0), "embedding": {"weight": torch.zeros(4, 2)}}, "embedding tensors do not match"),
    ],
)
def test_malformed_updates_are_refused_with_a_reason_and_change_nothing(parts, reason: str) -> None:
    versions = board()

    got = versions.offer(0, 0, "a", parts, loss=1.0, now=0.5)

    assert got is not None and reason in got
    assert versions.current(0).rejected == {"a": got} and versions.current(0).arrived == []
    assert not versions.due(0, ["a"], now=100.0)  # nothing to average


def test_a_duplicate_and_a_future_base_version_are_refused() -> None:
    versions = board()
    versions.offer(0, 0, "a", update(1.0), loss=1.0, now=0.5)

    assert "duplicate" in (versions.offer(0, 0, "a", update(2.0), loss=1.0, now=0.5) or "")
    assert "no version 3 yet" in (versions.offer(0, 3, "b", update(2.0), loss=1.0, now=0.5) or "")
    assert "no block 5" in (versions.offer(5, 0, "b", update(2.0), loss=1.0, now=0.5) or "")


def test_a_version_closes_once_every_assigned_worker_was_heard_or_at_the_deadline() -> None:
    versions = board()
    versions.offer(0, 0, "a", update(1.0), loss=1.0, now=0.5)

    assert not versions.due(0, ["a", "b"], now=5.0)  # b has not sent yet
    assert versions.due(0, ["a"], now=5.0)
    assert versions.due(0, ["a", "b"], now=10.0)  # the deadline
    versions.offer(0, 0, "b", {"block": {"w": torch.zeros(1)}}, loss=1.0, now=0.5)
    assert versions.due(0, ["a", "b"], now=5.0)  # a refused update counts as heard


def test_an_empty_version_is_extended_not_published_and_silent_workers_time_out() -> None:
    versions = board()
    versions.expect(0, ["a", "b"])

    assert versions.overdue_and_empty(0, now=10.0)
    versions.extend(0, now=10.0)
    assert versions.deadlines[0] == 20.0 and versions.versions == [0, 0]
    versions.offer(0, 0, "a", update(1.0), loss=1.0, now=0.5)
    ledger = versions.close(0, now=21.0)

    assert (ledger.deadline_extensions, ledger.used, ledger.timed_out) == (1, ["a"], ["b"])


def test_an_averaged_embedding_moves_by_the_mean_difference_over_the_number_of_blocks() -> None:
    versions = board(num_blocks=2, averaged=True)
    versions.offer(0, 0, "a", update(0.0, embedding=1.0), loss=1.0, now=0.5)
    versions.offer(0, 0, "b", update(0.0, embedding=3.0), loss=1.0, now=0.5)

    versions.close(0, now=1.0)

    assert torch.equal(versions.embedding["weight"], torch.full((4, 2), 1.0))  # mean 2.0 / 2 blocks
    assert versions.embedding_version == 1


def run_versions(versions: BlockVersions, times: dict[str, float], rounds: int, *, start: float = 0.0) -> float:
    """Block 0 through ``rounds`` versions, as the coordinator's loop would: each worker's update
    arrives ``times[worker]`` after the version opened; the version closes once ``due`` (all it
    waits for heard, or its deadline); what arrives later is stale. Returns the clock."""
    now = start
    for _ in range(rounds):
        arrivals = sorted((now + took, worker) for worker, took in times.items())
        close_at = None
        for at, worker in arrivals:
            if versions.due(0, list(times), now=min(at, versions.deadlines[0])):
                close_at = min(at, versions.deadlines[0])
                break
            versions.offer(0, versions.versions[0], worker, update(1.0), loss=1.0, now=at)
            if versions.due(0, list(times), now=at):
                close_at = at
                break
        close_at = close_at if close_at is not None else max(versions.deadlines[0], arrivals[-1][0])
        heard = set(versions.current(0).arrived)
        versions.close(0, now=close_at)
        for at, worker in arrivals:
            if worker not in heard:  # trained from the version that just closed: stale, but timed
                versions.offer(0, versions.versions[0] - 1, worker, update(1.0), loss=1.0, now=at)
        now = close_at
    return now


def test_the_deadline_shrinks_to_the_measured_update_times_and_the_ceiling_stays_the_bound() -> None:
    versions = board()
    first = versions.next_wait_s()

    run_versions(versions, {"a": 1.0, "b": 1.2}, rounds=6)

    assert first == 10.0  # nothing measured yet: the configured deadline
    assert versions.next_wait_s() == pytest.approx(1.5 * 1.2, rel=0.05)
    assert versions.current(0).deadline_s is None and versions.ledgers.get((0, 5)).deadline_s < 10.0


def test_a_persistently_slow_worker_is_flagged_in_the_ledger_and_no_longer_waited_for() -> None:
    adaptive, fixed = board(), board(adaptive=False)
    times = {"a": 1.0, "b": 1.05, "c": 0.95, "slow": 4.0}

    adaptive_clock = run_versions(adaptive, times, rounds=12)
    fixed_clock = run_versions(fixed, times, rounds=12)

    assert adaptive.pacing_status()["slow_workers"] == ["slow"]
    assert any(ledger.slow == ["slow"] for ledger in adaptive.ledgers.values())
    assert fixed_clock == pytest.approx(12 * 4.0)  # every version waited for the slow worker
    assert adaptive_clock < 0.6 * fixed_clock
    assert fixed.pacing_status()["slow_workers"] == ["slow"]  # measured either way, waited for only when fixed


def test_jitter_flags_no_worker() -> None:
    versions = board()
    rng = random.Random(3)
    for r in range(30):
        run_versions(versions, {w: 1.0 * (1 + rng.uniform(-0.05, 0.05)) for w in "abcd"}, rounds=1, start=r * 10.0)

    assert versions.pacing_status()["slow_workers"] == []
    assert not any(ledger.slow for ledger in versions.ledgers.values())


def test_a_refused_second_update_of_a_worker_the_version_used_leaves_it_used() -> None:
    versions = board()
    versions.expect(0, ["a", "b"])
    versions.offer(0, 0, "a", update(1.0), loss=1.0, now=0.5)
    duplicate = versions.offer(0, 0, "a", update(9.0), loss=1.0, now=0.6)
    versions.offer(0, 0, "b", update(3.0), loss=1.0, now=0.7)
    ledger = versions.close(0, now=1.0)

    stale = versions.offer(0, 0, "a", update(9.0), loss=1.0, now=1.5)  # trained again from the closed version

    assert duplicate is not None and stale is not None and stale.startswith("stale")
    assert ledger.used == ["a", "b"] and ledger.rejected == {} and ledger.refused_again == [("a", duplicate), ("a", stale)]
    assert ledger.balance_problems() == []
    assert torch.equal(versions.blocks[0]["w"], torch.full((2, 3), 2.0))  # 0 + mean(1, 3): both were used


def test_a_worker_that_timed_out_and_is_heard_late_is_rejected_not_timed_out() -> None:
    versions = board(adaptive=False)
    versions.expect(0, ["a", "late"])
    versions.offer(0, 0, "a", update(1.0), loss=1.0, now=0.5)
    ledger = versions.close(0, now=10.0)
    assert ledger.timed_out == ["late"]

    reason = versions.offer(0, 0, "late", update(1.0), loss=1.0, now=12.0)

    assert reason is not None and ledger.rejected == {"late": reason} and ledger.timed_out == []
    assert ledger.balance_problems() == []
