"""Vectorised kernels of the robust aggregators over n flat vectors of d float32 values: each input
value read once, in column blocks on the calling thread; order statistics from a comparator
network; geometric median, Krum and clipping in coefficient space over a Gram matrix (README.md
of protocols/core, "Kernels")."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ParamSpec, TypeVar

import numpy as np
import torch

CPU_BLOCK_COLUMNS = 16_384
"""Columns per block on CPU: 16 inputs' block (1 MiB) stays in cache."""
DEVICE_BLOCK_COLUMNS = 1 << 22
"""Columns per block on accelerators."""

P = ParamSpec("P")
R = TypeVar("R")
Array = Any
"""A numpy array (CPU) or a torch tensor (other devices): the kernels use only ops both have."""


def _quiet(kernel: Callable[P, R]) -> Callable[P, R]:
    """NaN, Inf and overflowing products are expected inputs here (they are rejected from the
    norms the kernel reports), not numpy warnings."""
    @functools.wraps(kernel)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with np.errstate(over="ignore", invalid="ignore"):
            return kernel(*args, **kwargs)
    return run


def block_width(vector: torch.Tensor) -> int:
    """Columns per block for vectors like ``vector``."""
    limit = CPU_BLOCK_COLUMNS if vector.device.type == "cpu" else DEVICE_BLOCK_COLUMNS
    return max(1, min(limit, vector.numel()))


def _numpy(vector: torch.Tensor) -> bool:
    """Whether kernels work on numpy views of tensors like ``vector`` (CPU) or on torch ops."""
    return vector.device.type == "cpu"


def _arrays(vectors: Sequence[torch.Tensor]) -> list[Array]:
    """Zero-copy numpy views on CPU, the tensors themselves elsewhere."""
    return [v.detach().numpy() for v in vectors] if _numpy(vectors[0]) else list(vectors)


def _empty(like: torch.Tensor, *shape: int) -> tuple[torch.Tensor, Array]:
    """A new float32 tensor on ``like``'s device and its array view."""
    tensor = like.new_empty(shape)
    return tensor, (tensor.numpy() if _numpy(tensor) else tensor)


def _columns(numel: int, width: int) -> Iterator[slice]:
    for start in range(0, numel, width):
        yield slice(start, min(start + width, numel))


def _binary(numpy_op: Callable[..., object], torch_op: Callable[..., object]) -> Callable[[Array, object, Array], None]:
    """``op(a, b, out=out)`` with numpy's op on arrays (the CPU path), torch's on tensors."""

    def op(a: Array, b: object, out: Array) -> None:
        (numpy_op if isinstance(out, np.ndarray) else torch_op)(a, b, out=out)

    return op


_minimum = _binary(np.minimum, torch.minimum)
_maximum = _binary(np.maximum, torch.maximum)
_add = _binary(np.add, torch.add)
_subtract = _binary(np.subtract, torch.sub)
_scale = _binary(np.multiply, torch.mul)
_matmul = _binary(np.matmul, torch.matmul)


def _dot(a: Array) -> float:
    return float(np.dot(a, a)) if isinstance(a, np.ndarray) else float(torch.dot(a, a))


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


class _Network:
    """Runs a trimming network over one block at a time, the inputs read in place."""

    def __init__(self, like: torch.Tensor, n: int, f: int) -> None:
        self.n, self.f, self.pairs = n, f, trimming_network(n, f)
        width = block_width(like)
        self._rows = [_empty(like, width)[1] for _ in range(n + 1)]

    def middle_mean(self, sources: list[Array], out: Array) -> None:
        """Write the mean of each column's middle n - 2f values of ``sources`` into ``out``."""
        width = out.shape[0]
        rows, owned = list(sources), [False] * self.n
        free = [row[:width] for row in self._rows]
        for low, high in self.pairs:
            a, b = rows[low], rows[high]
            smaller = free.pop()
            _minimum(a, b, smaller)
            larger = b if owned[high] else free.pop()
            _maximum(a, b, larger)
            if owned[low]:
                free.append(a)
            rows[low], rows[high], owned[low], owned[high] = smaller, larger, True, True
        middle = rows[self.f:self.n - self.f]
        if len(middle) == 1:
            out[:] = middle[0]
            return
        _add(middle[0], middle[1], out)
        for row in middle[2:]:
            _add(out, row, out)
        out /= len(middle)


@_quiet
def trimmed_mean(vectors: Sequence[torch.Tensor], f: int) -> tuple[torch.Tensor, list[float]]:
    """Coordinate-wise mean after dropping the f smallest and f largest values (needs 2f < n),
    and the inputs' squared norms."""
    network = _Network(vectors[0], len(vectors), f)
    arrays, squares = _arrays(vectors), [0.0] * len(vectors)
    value, out = _empty(vectors[0], vectors[0].numel())
    for cols in _columns(vectors[0].numel(), block_width(vectors[0])):
        sources = [array[cols] for array in arrays]
        network.middle_mean(sources, out[cols])
        for i, source in enumerate(sources):
            squares[i] += _dot(source)
    return value, squares


def median(vectors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[float]]:
    """Coordinate-wise median (the mean of the two middle values when n is even), and the
    inputs' squared norms."""
    return trimmed_mean(vectors, (len(vectors) - 1) // 2)


@_quiet
def mean(vectors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[float]]:
    """The coordinate-wise mean and the inputs' squared norms."""
    arrays, squares = _arrays(vectors), [0.0] * len(vectors)
    value, out = _empty(vectors[0], vectors[0].numel())
    for cols in _columns(vectors[0].numel(), block_width(vectors[0])):
        chunk = out[cols]
        chunk[:] = arrays[0][cols]
        squares[0] += _dot(arrays[0][cols])
        for i, array in enumerate(arrays[1:], start=1):
            _add(chunk, array[cols], chunk)
            squares[i] += _dot(array[cols])
        chunk /= len(arrays)
    return value, squares


@_quiet
def centred_gram(vectors: Sequence[torch.Tensor], *, center: str) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """The center m (``"median"``: coordinate-wise median; ``"mean"``: coordinate-wise mean), the
    float64 Gram matrix of y_i = x_i - m (on CPU: it is n x n) and the inputs' squared norms
    (||x_i||^2 = ||y_i||^2 + 2 y_i.m + ||m||^2), in one pass. Non-finite inputs make every norm
    non-finite (they reach m); float32 products that overflow are redone in float64."""
    n, like = len(vectors), vectors[0]
    network = _Network(like, n, (n - 1) // 2) if center == "median" else None
    arrays, width = _arrays(vectors), block_width(like)
    centre, m = _empty(like, like.numel())
    _, centred = _empty(like, n, width)
    _, block_gram = _empty(like, n, n)
    _, block_cross = _empty(like, n)
    on_cpu = isinstance(m, np.ndarray)
    gram = np.zeros((n, n)) if on_cpu else torch.zeros((n, n), dtype=torch.float64, device=like.device)
    cross = np.zeros(n) if on_cpu else torch.zeros(n, dtype=torch.float64, device=like.device)
    centre_square = 0.0
    for cols in _columns(like.numel(), width):
        sources, chunk = [array[cols] for array in arrays], m[cols]
        if network is not None:
            network.middle_mean(sources, chunk)
        else:
            chunk[:] = sources[0]
            for source in sources[1:]:
                _add(chunk, source, chunk)
            _scale(chunk, 1.0 / n, chunk)
        ys = centred[:, :chunk.shape[0]]
        for i, source in enumerate(sources):
            _subtract(source, chunk, ys[i])
        _matmul(ys, ys.T, block_gram)
        gram += block_gram
        _matmul(ys, chunk, block_cross)
        cross += block_cross
        centre_square += _dot(chunk)
    gram = torch.as_tensor(gram, dtype=torch.float64).cpu()
    if not bool(torch.isfinite(gram).all()) and all(bool(torch.isfinite(v).all()) for v in vectors):
        gram = _gram_float64(vectors, centre)
    squares = (gram.diagonal() + 2 * torch.as_tensor(cross).cpu() + centre_square).tolist()
    return centre, gram, squares


def _gram_float64(vectors: Sequence[torch.Tensor], center: torch.Tensor) -> torch.Tensor:
    """Gram of x_i - center in float64: the fallback when float32 products overflow."""
    gram = torch.zeros((len(vectors), len(vectors)), dtype=torch.float64, device=center.device)
    for cols in _columns(center.numel(), block_width(center)):
        block = torch.stack([v[cols] for v in vectors]).double() - center[cols].double()
        gram.add_(block @ block.T)
    return gram.cpu()


@_quiet
def distances_to(vectors: Sequence[torch.Tensor], center: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """||x_i - center|| for every i (float64 on CPU) and the inputs' squared norms."""
    arrays, (c,) = _arrays(vectors), _arrays([center])
    _, diff = _empty(center, block_width(center))
    squares, norms = [0.0] * len(vectors), [0.0] * len(vectors)
    for cols in _columns(center.numel(), block_width(center)):
        scratch = diff[:cols.stop - cols.start]
        for i, array in enumerate(arrays):
            _subtract(array[cols], c[cols], scratch)
            squares[i] += _dot(scratch)
            norms[i] += _dot(array[cols])
    return torch.tensor(squares, dtype=torch.float64).sqrt(), norms


@_quiet
def combine(vectors: Sequence[torch.Tensor], coeffs: Sequence[float], *, center: torch.Tensor | None = None,
            center_coeff: float = 0.0) -> torch.Tensor:
    """center_coeff * center + sum_i coeffs[i] * x_i, one block of columns at a time."""
    first = vectors[0] if vectors else center
    assert first is not None, "combine needs vectors or a center"
    terms = [(array, float(a)) for array, a in zip(_arrays(vectors) if vectors else [], coeffs, strict=True) if a != 0]
    c = _arrays([center])[0] if center is not None and center_coeff != 0 else None
    value, out = _empty(first, first.numel())
    _, spare = _empty(first, block_width(first))
    for cols in _columns(first.numel(), block_width(first)):
        chunk, scratch = out[cols], spare[:cols.stop - cols.start]
        rest = terms
        if c is not None:
            _scale(c[cols], center_coeff, chunk)
        elif terms:
            _scale(terms[0][0][cols], terms[0][1], chunk)
            rest = terms[1:]
        else:
            chunk[:] = 0
        for array, a in rest:
            _scale(array[cols], a, scratch)
            _add(chunk, scratch, chunk)
    return value


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
