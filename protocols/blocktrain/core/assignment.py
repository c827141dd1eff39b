"""Which block each BlockTrain worker trains: even coverage that follows peers as they come and go.

``assign_blocks`` is a pure function of the live workers, the previous assignment and the blocks'
versions, recomputed by the block coordinator whenever one of them changes:

1. Quotas. Of the blocks still training (not finished), every block gets ``W // A`` workers and
   ``W % A`` of them one more, so coverage never differs by more than one worker between blocks.
   The extra workers go to the blocks that are furthest behind (lowest version), then to blocks
   that already have that many workers (so nobody moves without need), then by block index. With
   fewer workers than blocks this rotates the workers over the blocks: a block whose version
   just closed is ahead of the others and gives its worker up to the block furthest behind, so
   every block keeps advancing.
2. Placement. A worker keeps its previous block while the block's quota allows (workers in peer
   id order); the others fill the open places, the block furthest behind first.

A worker that crashes drops out of the live set after its record's TTL, and its block is covered
again by the next recomputation (a worker moves from a block with more than its share, or, with
fewer workers than blocks, the orphaned block soon is the one furthest behind).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence


def block_quotas(versions: Sequence[int], num_workers: int, *, previous_counts: Sequence[int],
                 finished: Collection[int] = ()) -> list[int]:
    """Workers each block should have (see the module docstring); 0 for finished blocks."""
    active = [k for k in range(len(versions)) if k not in finished]
    quotas = [0] * len(versions)
    if not active:
        return quotas
    base, extra = divmod(num_workers, len(active))
    order = sorted(active, key=lambda k: (versions[k], -min(previous_counts[k], base + 1), k))
    for rank, k in enumerate(order):
        quotas[k] = base + (1 if rank < extra else 0)
    return quotas


def assign_blocks(num_blocks: int, workers: Collection[str], *, previous: Mapping[str, int],
                  versions: Sequence[int], finished: Collection[int] = ()) -> dict[str, int]:
    """Block per live worker; ``previous`` entries for blocks out of range or for gone workers are
    ignored. Every worker gets a block unless every block is finished (then the result is empty)."""
    if len(versions) != num_blocks:
        raise ValueError(f"versions has {len(versions)} entries for {num_blocks} blocks")
    live = sorted(set(workers))
    kept = {w: previous[w] for w in live
            if 0 <= previous.get(w, -1) < num_blocks and previous[w] not in finished}
    counts = [sum(1 for b in kept.values() if b == k) for k in range(num_blocks)]
    quotas = block_quotas(versions, len(live), previous_counts=counts, finished=finished)
    assignment: dict[str, int] = {}
    filled = [0] * num_blocks
    for worker in live:
        block = kept.get(worker)
        if block is not None and filled[block] < quotas[block]:
            assignment[worker] = block
            filled[block] += 1
    open_blocks = sorted(range(num_blocks), key=lambda k: (versions[k], k))
    for worker in live:
        if worker in assignment:
            continue
        block = next((k for k in open_blocks if filled[k] < quotas[k]), None)
        if block is None:
            break
        assignment[worker] = block
        filled[block] += 1
    return assignment


def coverage(assignment: Mapping[str, int], num_blocks: int) -> list[int]:
    """Workers per block."""
    counts = [0] * num_blocks
    for block in assignment.values():
        counts[block] += 1
    return counts
