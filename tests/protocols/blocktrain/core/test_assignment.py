"""Block assignment: coverage stays even (max - min <= 1 over the blocks still training) as workers
come and go, nobody moves without need, a crashed worker's block is covered again, and with fewer
workers than blocks the workers rotate so that every block keeps advancing."""

from __future__ import annotations

import itertools

import pytest

from gossamer.protocols.blocktrain.core.assignment import assign_blocks, block_quotas, coverage


def workers(count: int) -> list[str]:
    return [f"w{i:02d}" for i in range(count)]


@pytest.mark.parametrize(("num_blocks", "num_workers"),
                         list(itertools.product([1, 2, 3, 4, 7], [0, 1, 2, 3, 5, 8, 13])))
def test_coverage_is_even_and_everyone_gets_a_block(num_blocks: int, num_workers: int) -> None:
    assignment = assign_blocks(num_blocks, workers(num_workers), previous={}, versions=[0] * num_blocks)

    counts = coverage(assignment, num_blocks)
    assert sorted(assignment) == workers(num_workers)
    assert max(counts) - min(counts) <= 1
    assert sum(counts) == num_workers


def test_recomputing_with_nothing_changed_moves_nobody() -> None:
    first = assign_blocks(3, workers(5), previous={}, versions=[2, 0, 1])

    assert assign_blocks(3, workers(5), previous=first, versions=[2, 0, 1]) == first


def test_a_joining_worker_goes_to_the_least_covered_block_and_nobody_else_moves() -> None:
    before = {"w00": 0, "w01": 1, "w02": 2, "w03": 0}

    after = assign_blocks(3, [*before, "w04"], previous=before, versions=[0, 0, 0])

    assert {w: after[w] for w in before} == before
    assert after["w04"] in (1, 2)


def test_a_crashed_workers_block_is_covered_again_by_a_worker_from_a_block_with_more() -> None:
    before = {"w00": 0, "w01": 0, "w02": 1, "w03": 2}

    after = assign_blocks(3, ["w00", "w01", "w03"], previous=before, versions=[3, 3, 3])  # w02 is gone

    assert coverage(after, 3) == [1, 1, 1]
    assert after["w03"] == 2 and {after["w00"], after["w01"]} == {0, 1}


def test_with_fewer_workers_than_blocks_the_blocks_furthest_behind_are_covered() -> None:
    after = assign_blocks(4, ["w00", "w01"], previous={"w00": 0, "w01": 1}, versions=[5, 3, 2, 4])

    assert sorted(after.values()) == [1, 2]
    assert after["w01"] == 1  # kept its block: it is one of the two furthest behind


def test_one_worker_rotating_over_the_blocks_advances_all_of_them_evenly() -> None:
    versions, assignment, trained = [0, 0, 0], {}, []
    for _ in range(9):
        assignment = assign_blocks(3, ["w00"], previous=assignment, versions=versions)
        block = assignment["w00"]
        trained.append(block)
        versions[block] += 1  # its update closes a version of that block

    assert max(versions) - min(versions) <= 1 and sum(versions) == 9
    assert set(trained) == {0, 1, 2}


def test_finished_blocks_get_no_workers_and_all_finished_means_no_assignment() -> None:
    after = assign_blocks(3, workers(4), previous={}, versions=[4, 1, 4], finished=[0, 2])

    assert set(after.values()) == {1}
    assert assign_blocks(2, workers(3), previous={}, versions=[4, 4], finished=[0, 1]) == {}


def test_previous_entries_for_gone_workers_or_unknown_blocks_are_ignored() -> None:
    after = assign_blocks(2, ["w00", "w01"], previous={"w00": 7, "gone": 0, "w01": 1}, versions=[0, 0])

    assert after == {"w00": 0, "w01": 1}


def test_quotas_give_the_extra_workers_to_the_blocks_furthest_behind() -> None:
    assert block_quotas([3, 1, 2, 1], 6, previous_counts=[0, 0, 0, 0]) == [1, 2, 1, 2]
    assert block_quotas([1, 1, 1], 4, previous_counts=[1, 2, 1]) == [1, 2, 1]  # tie: where they are


def test_a_versions_list_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="versions has 2 entries for 3 blocks"):
        assign_blocks(3, workers(2), previous={}, versions=[0, 0])
