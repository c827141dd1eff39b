"""The learner's pure pieces: when it is out of step with the swarm (and whose records count: the
learners whose work it used), and its manifest settings."""

from __future__ import annotations

import itertools

import pytest

from gossamer.peer.cli.swarm import Swarm, SwarmOptions
from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.diloco.settings import DilocoSettings
from gossamer.protocols.diloco.steering import Evidence, claimed_rounds, out_of_step, reach_rounds
from gossamer.protocols.registry import PLUGINS


def learner_settings(run: RunConfig) -> DilocoSettings:
    return PLUGINS.plugin("diloco").read_settings(run)


@pytest.mark.parametrize(
    ("mine", "others", "want"),
    [
        (0, [], None),  # alone: nothing to catch up with
        (4, [4, 5, 3], None),  # in step
        (2, [4, 4], None),  # behind by less than the threshold
        (1, [4, 4], 4),  # a stalled learner catches up
        (9, [4, 5, 4], 5),  # one that raced ahead alone goes back to the swarm
        (4, [4, 4, 1_000_000], None),  # one peer advertising a far-off round moves nobody
        (0, [0, 10, 10], 10),  # a tie between two halves goes to the further-on one
        (10, [0, 0, 10], None),
    ],
)
def test_out_of_step_measures_from_the_median_round_of_all_learners(mine: int, others: list[int],
                                                                    want: int | None) -> None:
    assert out_of_step(mine, others, threshold=3) == want


@pytest.mark.parametrize("threshold", [1, 2, 3, 4])
@pytest.mark.parametrize("learners", [2, 3, 4, 5])
def test_every_two_learners_the_catch_up_rule_leaves_alone_are_in_each_others_reach(threshold: int,
                                                                                   learners: int) -> None:
    """Where no learner is out of step, the one behind keeps the one ahead's contributions: with an
    inbox window of 2 and the default threshold of 3, rounds (0, 1, 3) left the first and the last
    timing out on each other for good (an e2e run stuck there)."""
    reach = reach_rounds(threshold)
    for rounds in itertools.product(range(2 * threshold + 2), repeat=learners):
        if all(out_of_step(r, [*rounds[:i], *rounds[i + 1:]], threshold=threshold) is None
               for i, r in enumerate(rounds)):
            assert max(rounds) - min(rounds) <= reach, (rounds, reach)
    assert reach_rounds(3) > 2  # the window the stuck run had was too small


def test_min_learners_and_catch_up_rounds_come_from_the_manifest() -> None:
    settings = learner_settings(RunConfig(name="r", protocol="diloco", hyper={"min_learners": 4, "catch_up_rounds": 5}))

    assert (settings.min_learners, settings.catch_up_rounds) == (4, 5)
    assert learner_settings(RunConfig(name="r", protocol="diloco")).min_learners == 1


@pytest.mark.parametrize("key", ["min_learners", "catch_up_rounds"])
def test_settings_refuse_a_count_below_one(key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        learner_settings(RunConfig(name="r", protocol="diloco", hyper={key: 0}))


def test_a_swarm_too_small_for_min_learners_is_refused_before_anything_starts(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"min_learners = 3 .* 2 learner"):
        Swarm(SwarmOptions(preset="demo", peers=2, workdir=tmp_path / "swarm"), PLUGINS)

    assert not (tmp_path / "swarm").exists()


def test_the_text_settings_keep_their_manifest_keys() -> None:
    settings = learner_settings(RunConfig(name="r", protocol="diloco", data={"source": "/tmp/x.txt"},
                                          hyper={"batch_size": 8, "seed": 3, "max_norm": 5.0}))

    assert (settings.text.data_source, settings.text.batch_size, settings.text.seed) == ("/tmp/x.txt", 8, 3)
    assert (settings.text.max_norm, settings.text.num_shards, settings.text.heldout_fraction) == (5.0, 16, 0.05)


@pytest.mark.parametrize(("aggregator", "why"), [({"name": "mean", "f": 1}, "mean is not Byzantine-robust"),
                                                 ({"name": "krum", "f": 1, "tau": 0.5}, "tau")])
def test_an_aggregator_that_cannot_run_is_refused_with_the_run_config(aggregator: dict, why: str) -> None:
    with pytest.raises(ConfigError, match=f"hyper.aggregator.*{why}"):
        learner_settings(RunConfig(name="r", protocol="diloco", hyper={"aggregator": aggregator}))


def test_evidence_keeps_the_senders_used_lately_and_forgets_after_its_window() -> None:
    evidence = Evidence(window_rounds=4)
    evidence.saw(["a", "b"], 3)
    evidence.saw(["a"], 6)
    evidence.saw(["a"], 5)  # an older round never lowers what was seen

    assert evidence.recent(6) == {"a": 6, "b": 3}
    assert evidence.recent(8) == {"a": 6}  # b's round 3 is more than 4 rounds back


def test_a_contributor_cannot_claim_a_round_below_the_one_its_work_was_used_in() -> None:
    assert claimed_rounds({"a": 0, "b": 9, "c": 2}, {"a": 7, "b": 7}) == [7, 9, 2]
