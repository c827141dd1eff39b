"""Vectorised kernels of the robust aggregators, over n flat vectors x_1..x_n of d float32 values.

**Column blocks.** A kernel walks the d coordinates in blocks of columns: the n vectors' values in
columns [start, stop) are stacked into one reused [n, width] buffer, so each pass reads every input
byte once and the [n, d] stack is never materialised. On CPU a block row holds 32768 values,
torch's parallel grain size, so every op runs on the calling thread: on a shared 2-core host the
same kernels split over torch's thread pool ran ~1.7x faster when the host was idle but 4-10x
slower as soon as another process held a core (every small op waits at a barrier for a preempted
thread), while the single-threaded blocks kept their speed. On other devices blocks are wide
(2^22 columns) so that launches are few.

**Order statistics** come from a comparator network (min/max of whole rows, no per-coordinate
Python): Batcher's odd-even merge sort, padded to a power of two, pruned to what a trimmed mean
needs (see ``trimming_network``).

**Coefficient space.** Geometric median, Krum and centered clipping only ever need distances
between the inputs and combinations of them. With y_i = x_i - m (m the coordinate-wise median, so
that the values are small and float32 products lose little), one pass computes the Gram matrix
G = Y Y^T; every iteration then works on n coefficients in float64 (a point c = m + sum_j a_j y_j
has ||x_i - c||^2 = G_ii - 2 (G a)_i + a^T G a), and one last pass forms the combination.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

CPU_BLOCK_COLUMNS = 32_768
"""Columns per block on CPU: torch runs ops of at most this many elements on one thread."""
DEVICE_BLOCK_COLUMNS = 1 << 22
"""Columns per block on accelerators."""


def block_width(vector: torch.Tensor) -> int:
    """Columns per block for vectors like ``vector``."""
    limit = CPU_BLOCK_COLUMNS if vector.device.type == "cpu" else DEVICE_BLOCK_COLUMNS
    return max(1, min(limit, vector.numel()))


def column_blocks(vectors: Sequence[torch.Tensor]) -> Iterator[tuple[slice, torch.Tensor]]:
    """Yield (columns, [n, width] stack of the vectors' values there); the buffer is reused."""
    first, width = vectors[0], block_width(vectors[0])
    buffer = first.new_empty((len(vectors), width))
    for start in range(0, first.numel(), width):
        cols = slice(start, min(start + width, first.numel()))
        size = cols.stop - start
        block = buffer if size == width else first.new_empty((len(vectors), size))
        torch.stack([vector[cols] for vector in vectors], out=block)
        yield cols, block


def _odd_even_merge_sort(size: int) -> list[tuple[int, int]]:
    """Batcher's comparators (low wire, high wire) sorting ``size`` (a power of two) wires."""
    pairs: list[tuple[int, int]] = []
    span = 1
    while span < size:
        step = span
        while step >= 1:
            for base in range(step % span, size - step, 2 * step):
                for i in range(min(step, size - base - step)):
                    low, high = base + i, base + i + step
                    if low // (2 * span) == high // (2 * span):
                        pairs.append((low, high))
            step //= 2
        span *= 2
    return pairs


def trimming_network(n: int, f: int) -> list[tuple[int, int]]:
    """Comparators after which wires f..n-f-1 hold the middle n - 2f values (in some order).

    Batcher's network for the next power of two, minus comparators that touch padding wires
    (padding = +inf never moves), minus trailing comparators that only swap two values within
    one class (bottom f, middle, top f), which the trimmed mean cannot tell apart.
    """
    size = 1 << max(0, (n - 1).bit_length())
    pairs = [(low, high) for low, high in _odd_even_merge_sort(size) if high < n]

    def band(wire: int) -> int:
        return 0 if wire < f else (1 if wire < n - f else 2)

    touched: set[int] = set()
    kept: list[tuple[int, int]] = []
    for low, high in reversed(pairs):
        if low not in touched and high not in touched and band(low) == band(high):
            continue
        kept.append((low, high))
        touched.update((low, high))
    return kept[::-1]


def _middle_mean_into(out: torch.Tensor, block: torch.Tensor, network: list[tuple[int, int]], f: int,
                      scratch: torch.Tensor) -> None:
    """Write the mean of each column's middle values into ``out``; ``block`` is clobbered."""
    rows, spare = list(block.unbind(0)), scratch
    for low, high in network:
        torch.minimum(rows[low], rows[high], out=spare)
        torch.maximum(rows[low], rows[high], out=rows[high])
        rows[low], spare = spare, rows[low]
    middle = rows[f:len(rows) - f]
    if len(middle) == 1:
        out.copy_(middle[0])
        return
    torch.add(middle[0], middle[1], out=out)
    for row in middle[2:]:
        out.add_(row)
    out.div_(len(middle))


def trimmed_mean(vectors: Sequence[torch.Tensor], f: int) -> torch.Tensor:
    """Coordinate-wise mean after dropping the f smallest and f largest values (needs 2f < n)."""
    network = trimming_network(len(vectors), f)
    out = torch.empty_like(vectors[0])
    scratch = vectors[0].new_empty(block_width(vectors[0]))
    for cols, block in column_blocks(vectors):
        _middle_mean_into(out[cols], block, network, f, scratch[:block.shape[1]])
    return out


def median(vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Coordinate-wise median (the mean of the two middle values when n is even)."""
    return trimmed_mean(vectors, (len(vectors) - 1) // 2)


def median_and_gram(vectors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The coordinate-wise median m and the float64 Gram matrix of y_i = x_i - m (on CPU: it is n x n).

    One pass: each block's median, then its centred rows' upper-triangle products (matrix-vector
    products in float32 over one block, summed over blocks in float64).
    """
    n, f = len(vectors), (len(vectors) - 1) // 2
    network = trimming_network(n, f)
    center = torch.empty_like(vectors[0])
    scratch = vectors[0].new_empty(block_width(vectors[0]))
    block_gram = vectors[0].new_zeros((n, n))
    gram = torch.zeros((n, n), dtype=torch.float64, device=vectors[0].device)
    for cols, block in column_blocks(vectors):
        _middle_mean_into(center[cols], block, network, f, scratch[:block.shape[1]])
        for i, vector in enumerate(vectors):
            torch.sub(vector[cols], center[cols], out=block[i])
        for i in range(n):
            torch.mv(block[i:], block[i], out=block_gram[i, i:])
        gram.add_(block_gram)
    if not bool(torch.isfinite(gram).all()):
        gram = _gram_float64(vectors, center)
    return center, _symmetric(gram).cpu()


def _gram_float64(vectors: Sequence[torch.Tensor], center: torch.Tensor) -> torch.Tensor:
    """Upper-triangle Gram of x_i - center in float64: the fallback when float32 products overflow."""
    gram = torch.zeros((len(vectors), len(vectors)), dtype=torch.float64, device=center.device)
    for cols, block in column_blocks(vectors):
        centred = block.double() - center[cols].double()
        gram.add_((centred @ centred.T).triu())
    return gram


def _symmetric(upper: torch.Tensor) -> torch.Tensor:
    return upper.triu() + upper.triu(1).T


def distances_to(vectors: Sequence[torch.Tensor], center: torch.Tensor) -> torch.Tensor:
    """||x_i - center|| for every i, float64 on CPU."""
    scratch = center.new_empty(block_width(center))
    block_norms = center.new_empty(len(vectors))
    squares = torch.zeros(len(vectors), dtype=torch.float64, device=center.device)
    for start in range(0, center.numel(), scratch.numel()):
        cols = slice(start, min(start + scratch.numel(), center.numel()))
        diff = scratch[:cols.stop - start]
        for i, vector in enumerate(vectors):
            torch.sub(vector[cols], center[cols], out=diff)
            torch.linalg.vector_norm(diff, out=block_norms[i])
        squares.add_(block_norms.double().square())
    return squares.sqrt().cpu()


def combine(vectors: Sequence[torch.Tensor], coeffs: Sequence[float], *, center: torch.Tensor | None = None,
            center_coeff: float = 0.0) -> torch.Tensor:
    """center_coeff * center + sum_i coeffs[i] * x_i, one block of columns at a time."""
    first = vectors[0] if vectors else center
    assert first is not None, "combine needs vectors or a center"
    out, width = torch.empty_like(first), block_width(first)
    terms = [(vector, float(a)) for vector, a in zip(vectors, coeffs, strict=True) if a != 0]
    for start in range(0, first.numel(), width):
        cols = slice(start, min(start + width, first.numel()))
        chunk = out[cols]
        if center is not None and center_coeff != 0:
            torch.mul(center[cols], center_coeff, out=chunk)
        else:
            chunk.zero_()
        for vector, a in terms:
            chunk.add_(vector[cols], alpha=a)
    return out


def spread(gram: torch.Tensor, coeffs: torch.Tensor) -> torch.Tensor:
    """||y_i - sum_j coeffs_j y_j|| for every i, from the Gram matrix of the y's."""
    pulled = gram @ coeffs
    return (gram.diagonal() - 2 * pulled + coeffs @ pulled).clamp_min(0).sqrt()


def weiszfeld(gram: torch.Tensor, *, nu: float, max_iters: int, tol: float) -> torch.Tensor:
    """Coefficients (summing to 1) of the smoothed geometric median: Weiszfeld from the mean.

    Each step reweights by 1 / max(nu, distance); it stops after ``max_iters`` steps or when the
    sum of distances improves by at most ``tol`` times itself.
    """
    n = gram.shape[0]
    coeffs = torch.full((n,), 1.0 / n, dtype=torch.float64)
    distances = spread(gram, coeffs)
    objective = float(distances.sum())
    for _ in range(max_iters):
        inverse = 1.0 / distances.clamp_min(nu)
        coeffs = inverse / inverse.sum()
        distances = spread(gram, coeffs)
        previous, objective = objective, float(distances.sum())
        if previous - objective <= tol * objective:
            break
    return coeffs


def krum_scores(gram: torch.Tensor, f: int) -> torch.Tensor:
    """Krum score of each input: its summed squared distances to its n - f - 2 nearest others."""
    n = gram.shape[0]
    diagonal = gram.diagonal()
    squared = (diagonal[:, None] + diagonal[None, :] - 2 * gram).clamp_min(0)
    squared.fill_diagonal_(float("inf"))
    return squared.sort(dim=1).values[:, :n - f - 2].sum(dim=1)


def clipping_coefficients(gram: torch.Tensor, *, tau: float, iters: int) -> torch.Tensor:
    """Coefficients a of centered clipping run from the median: c = m + sum_j a_j y_j.

    Each iteration c <- c + (1/n) sum_i min(1, tau / ||x_i - c||) (x_i - c).
    """
    n = gram.shape[0]
    coeffs = torch.zeros(n, dtype=torch.float64)
    for _ in range(iters):
        scale = (tau / spread(gram, coeffs)).clamp(max=1.0)
        coeffs = coeffs * (1 - float(scale.sum()) / n) + scale / n
    return coeffs
