"""Virtual batches: each epoch's shuffle of the global (node, local index) list, cut into batches.

The shuffle depends only on (seed, epoch) and the per-node counts; a batch is grouped by node
(nodes in sorted order), and activations are concatenated and gradients sliced in that order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from gossamer.protocols.tlpp.core.errors import TraversalError, check_count


@dataclass(frozen=True)
class VirtualBatch:
    """One step's samples: ``order`` is (node id, local index), grouped by node (nodes sorted), each
    node's samples in the order the epoch's shuffle drew them. Activations are concatenated and
    gradients sliced in exactly this order."""

    epoch: int
    index: int
    order: tuple[tuple[str, int], ...]

    def by_node(self) -> dict[str, list[int]]:
        """Each node's local indices, nodes in sorted order."""
        out: dict[str, list[int]] = {}
        for node, local in self.order:
            out.setdefault(node, []).append(local)
        return out

    def sizes(self) -> dict[str, int]:
        """How many samples each node contributes: the split sizes that route gradient slices back."""
        return {node: len(indices) for node, indices in self.by_node().items()}


class VirtualBatchScheduler:
    """Cuts each epoch's shuffle of the global (node, index) list into virtual batches.

    The shuffle depends only on (seed, epoch) and the counts, so the orchestrator can replay any
    epoch and every node could check the schedule it is asked to follow. ``min_size``: an epoch's
    short tail batch is dropped when it holds fewer samples (secure mode's minimum batch;
    ``drop_last`` drops any short tail).
    """

    def __init__(self, counts: Mapping[str, int], *, batch_size: int, seed: int,
                 drop_last: bool = False, min_size: int = 1) -> None:
        if not isinstance(counts, Mapping) or not counts:
            raise TraversalError("counts: need at least one node with samples")
        for node, count in counts.items():
            if not isinstance(node, str) or not node:
                raise TraversalError(f"counts: node ids must be non-empty strings, got {node!r}")
            check_count(f"counts[{node!r}]", count, low=1)
        self.counts = {node: counts[node] for node in sorted(counts)}
        self.batch_size = check_count("batch_size", batch_size, low=1)
        self.seed = check_count("seed", seed, low=0)
        self.drop_last = bool(drop_last)
        self.min_size = check_count("min_size", min_size, low=1)
        self.total = sum(self.counts.values())
        if self.drop_last and self.total < self.batch_size:
            raise TraversalError(f"batch_size: {batch_size} > {self.total} samples: drop_last leaves "
                                 "no batch")
        if self.total < self.min_size:
            raise TraversalError(f"min_size: {min_size} > {self.total} samples: no batch is large enough")

    @property
    def steps_per_epoch(self) -> int:
        whole, rest = divmod(self.total, self.batch_size)
        return whole + (1 if rest >= self.min_size and not self.drop_last else 0)

    def epoch(self, epoch: int) -> list[VirtualBatch]:
        """The epoch's virtual batches: every sample exactly once (but a dropped short tail)."""
        check_count("epoch", epoch, low=0)
        nodes = list(self.counts)
        node_of = np.repeat(np.arange(len(nodes)), [self.counts[n] for n in nodes])
        local_of = np.concatenate([np.arange(self.counts[n]) for n in nodes])
        perm = np.random.default_rng([self.seed, epoch]).permutation(self.total)
        batches = []
        for index in range(self.steps_per_epoch):
            picked = perm[index * self.batch_size:(index + 1) * self.batch_size]
            grouped = picked[np.argsort(node_of[picked], kind="stable")]
            order = tuple((nodes[node_of[i]], int(local_of[i])) for i in grouped)
            batches.append(VirtualBatch(epoch=epoch, index=index, order=order))
        return batches

    def joined(self, counts: Mapping[str, int]) -> VirtualBatchScheduler:
        """The schedule after nodes with ``counts`` joined (same batch size, seed, drop_last and min_size)."""
        again = sorted(set(counts) & set(self.counts))
        if again:
            raise TraversalError(f"counts: nodes {again} are scheduled already")
        return VirtualBatchScheduler({**self.counts, **counts}, batch_size=self.batch_size, seed=self.seed,
                                     drop_last=self.drop_last, min_size=self.min_size)

    def without(self, node_ids: Iterable[str]) -> VirtualBatchScheduler:
        """The schedule after ``node_ids`` left (same batch size, seed, drop_last and min_size)."""
        leaving = set(node_ids)
        unknown = sorted(leaving - set(self.counts))
        if unknown:
            raise TraversalError(f"node_ids: unknown nodes {unknown}")
        remaining = {node: count for node, count in self.counts.items() if node not in leaving}
        if not remaining:
            raise TraversalError("node_ids: every node would leave; a schedule needs at least one")
        return VirtualBatchScheduler(remaining, batch_size=self.batch_size, seed=self.seed,
                                     drop_last=self.drop_last, min_size=self.min_size)
