"""Which block each BlockTrain worker trains: a pure function of the live workers, the previous
assignment and the blocks' versions. Coverage never differs by more than one worker between the
blocks still training, nobody moves without need, and with fewer workers than blocks the workers
rotate so every block keeps advancing (the rules: ``protocols/blocktrain/README.md``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence


def block_quotas(versions: Sequence[int], num_workers: int, *, previous_counts: Sequence[int],
                 finished: Collection[int] = ()) -> list[int]:
    """Workers each block should have; 0 for finished blocks. Of the A blocks still training each
    gets ``num_workers // A`` and ``num_workers % A`` of them one more: the blocks furthest behind,
    then those that already have that many (nobody moves without need), then by index."""
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
