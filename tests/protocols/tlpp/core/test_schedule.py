"""TL++ virtual batches: deterministic per (seed, epoch), every sample once, grouped by node, refusals."""

from __future__ import annotations

import pytest

from gossamer.protocols.tlpp.core import (
    TraversalError,
    VirtualBatch,
    VirtualBatchScheduler,
)

COUNTS = {"n2": 7, "n0": 5, "n1": 11}


def test_scheduler_is_deterministic_per_seed_and_epoch() -> None:
    a = VirtualBatchScheduler(COUNTS, batch_size=4, seed=3)
    b = VirtualBatchScheduler(dict(reversed(COUNTS.items())), batch_size=4, seed=3)
    assert a.epoch(2) == b.epoch(2)
    assert a.epoch(2) != a.epoch(3)
    assert a.epoch(2) != VirtualBatchScheduler(COUNTS, batch_size=4, seed=4).epoch(2)


@pytest.mark.parametrize(("batch_size", "drop_last", "steps"), [(4, False, 6), (4, True, 5), (23, False, 1),
                                                                 (1, False, 23), (30, False, 1)])
def test_every_sample_once_per_epoch(batch_size: int, drop_last: bool, steps: int) -> None:
    scheduler = VirtualBatchScheduler(COUNTS, batch_size=batch_size, seed=0, drop_last=drop_last)
    batches = scheduler.epoch(0)
    seen = [pair for batch in batches for pair in batch.order]
    assert scheduler.steps_per_epoch == len(batches) == steps
    assert len(seen) == len(set(seen))
    everything = {(node, i) for node, count in COUNTS.items() for i in range(count)}
    if drop_last:
        assert set(seen) <= everything and len(seen) == steps * batch_size
    else:
        assert set(seen) == everything
    assert [b.index for b in batches] == list(range(steps)) and {b.epoch for b in batches} == {0}


def test_batches_are_grouped_by_sorted_node_with_split_sizes() -> None:
    for batch in VirtualBatchScheduler(COUNTS, batch_size=9, seed=1).epoch(0):
        nodes = [node for node, _ in batch.order]
        assert nodes == sorted(nodes)
        by_node = batch.by_node()
        assert list(by_node) == sorted(by_node)
        assert batch.sizes() == {node: len(idx) for node, idx in by_node.items()}
        assert sum(batch.sizes().values()) == len(batch.order)
        assert [pair for node in by_node for pair in ((node, i) for i in by_node[node])] == list(batch.order)


def test_virtual_batch_views() -> None:
    batch = VirtualBatch(epoch=0, index=0, order=(("a", 3), ("a", 1), ("b", 0)))
    assert batch.by_node() == {"a": [3, 1], "b": [0]}
    assert batch.sizes() == {"a": 2, "b": 1}


def test_without_drops_nodes_and_keeps_settings() -> None:
    scheduler = VirtualBatchScheduler(COUNTS, batch_size=4, seed=5, drop_last=True)
    rest = scheduler.without(["n1"])
    assert rest.counts == {"n0": 5, "n2": 7}
    assert (rest.batch_size, rest.seed, rest.drop_last) == (4, 5, True)
    assert all(node != "n1" for batch in rest.epoch(0) for node, _ in batch.order)
    with pytest.raises(TraversalError, match="unknown nodes"):
        scheduler.without(["n9"])
    with pytest.raises(TraversalError, match="every node"):
        scheduler.without(COUNTS)


def test_joined_adds_nodes_and_keeps_settings() -> None:
    scheduler = VirtualBatchScheduler(COUNTS, batch_size=4, seed=5, drop_last=True, min_size=2)
    back = scheduler.without(["n1"]).joined({"n1": COUNTS["n1"]})
    assert back.counts == scheduler.counts and back.epoch(3) == scheduler.epoch(3)
    assert (back.batch_size, back.seed, back.drop_last, back.min_size) == (4, 5, True, 2)
    with pytest.raises(TraversalError, match="scheduled already"):
        scheduler.joined({"n0": 1})
    with pytest.raises(TraversalError, match=r"counts\['n9'\]"):
        scheduler.joined({"n9": 0})


@pytest.mark.parametrize(("counts", "kwargs", "match"), [
    ({}, {}, "counts"),
    ({"a": 0}, {}, r"counts\['a'\]"),
    ({"a": 2.5}, {}, r"counts\['a'\]"),
    ({"": 3}, {}, "node ids"),
    ({"a": 3}, {"batch_size": 0}, "batch_size"),
    ({"a": 3}, {"batch_size": True}, "batch_size"),
    ({"a": 3}, {"seed": -1}, "seed"),
    ({"a": 3}, {"batch_size": 4, "drop_last": True}, "no batch"),
])
def test_scheduler_refuses_bad_settings(counts: dict, kwargs: dict, match: str) -> None:
    settings = {"batch_size": 2, "seed": 0} | kwargs
    with pytest.raises(TraversalError, match=match):
        VirtualBatchScheduler(counts, **settings)


def test_bad_epoch_refused() -> None:
    with pytest.raises(TraversalError, match="epoch"):
        VirtualBatchScheduler(COUNTS, batch_size=2, seed=0).epoch(-1)
