"""protocols.core.robust: aggregators against naive loop references and closed forms, permutation
invariance, boundedness under attack, refusal of impossible settings, sanitizing."""

from __future__ import annotations

import math
import random

import pytest
import torch

from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates
from gossamer.protocols.core.robust import (
    AGGREGATORS,
    Contribution,
    Failure,
    coordinate_median,
    geometric_median,
    kernels,
    krum,
    mean,
    multi_krum,
    sanitize,
    trimmed_mean,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def contributions(xs: list[torch.Tensor], prefix: str = "p") -> list[Contribution]:
    return [Contribution(f"{prefix}{i:02d}", x) for i, x in enumerate(xs)]


def randoms(n: int, d: int, seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(d, generator=gen) * scale for _ in range(n)]


# ---- naive references: Python loops over coordinates / pairs, float64 ----

def ref_trimmed(xs: list[torch.Tensor], f: int) -> torch.Tensor:
    out = []
    for j in range(xs[0].numel()):
        column = sorted(float(x[j]) for x in xs)
        middle = column[f:len(column) - f]
        out.append(sum(middle) / len(middle))
    return torch.tensor(out, dtype=torch.float64)


def ref_median(xs: list[torch.Tensor]) -> torch.Tensor:
    return ref_trimmed(xs, (len(xs) - 1) // 2)


def ref_krum_scores(xs: list[torch.Tensor], f: int) -> list[float]:
    scores = []
    for i, a in enumerate(xs):
        dists = sorted(float(((a.double() - b.double()) ** 2).sum()) for j, b in enumerate(xs) if j != i)
        scores.append(sum(dists[:len(xs) - f - 2]))
    return scores


def ref_geomed(xs: list[torch.Tensor], nu: float = 1e-6, max_iters: int = 100, tol: float = 1e-7) -> torch.Tensor:
    points = [x.double() for x in xs]
    z = sum(points) / len(points)
    objective = sum(float((z - p).norm()) for p in points)
    for _ in range(max_iters):
        weights = [1.0 / max(nu, float((z - p).norm())) for p in points]
        z = sum(w * p for w, p in zip(weights, points, strict=True)) / sum(weights)
        previous, objective = objective, sum(float((z - p).norm()) for p in points)
        if previous - objective <= tol * objective:
            break
    return z


def ref_clip_step(xs: list[torch.Tensor], center: torch.Tensor, tau: float) -> torch.Tensor:
    step = torch.zeros_like(center)
    for x in xs:
        diff = x.double() - center
        step += diff * min(1.0, tau / float(diff.norm())) if float(diff.norm()) > 0 else diff
    return center + step / len(xs)


def ref_cc(xs: list[torch.Tensor], tau: float, iters: int) -> torch.Tensor:
    center = ref_median(xs)
    for _ in range(iters):
        center = ref_clip_step(xs, center, tau)
    return center


def ref_multi_krum(xs: list[torch.Tensor], f: int, m: int) -> torch.Tensor:
    scores = ref_krum_scores(xs, f)
    chosen = sorted(range(len(xs)), key=lambda i: (scores[i], i))[:m]
    return sum(xs[i].double() for i in chosen) / m


# name -> (call(contributions, f), reference(xs, f), largest f for n)
SPECS = {
    "mean": (lambda cs, f: mean(cs), lambda xs, f: sum(x.double() for x in xs) / len(xs), lambda n: 0),
    "median": (lambda cs, f: coordinate_median(cs, f=f), lambda xs, f: ref_median(xs), lambda n: (n - 1) // 2),
    "trimmed_mean": (lambda cs, f: trimmed_mean(cs, f=f), ref_trimmed, lambda n: (n - 1) // 2),
    "trimmed_mean_f1": (lambda cs, f: trimmed_mean(cs, f=min(f, 1)), lambda xs, f: ref_trimmed(xs, min(f, 1)),
                        lambda n: (n - 1) // 2),
    "geometric_median": (lambda cs, f: geometric_median(cs, f=f), lambda xs, f: ref_geomed(xs), lambda n: (n - 1) // 2),
    "krum": (lambda cs, f: krum(cs, f=f), lambda xs, f: ref_multi_krum(xs, f, 1), lambda n: (n - 3) // 2),
    "multi_krum": (lambda cs, f: multi_krum(cs, f=f), lambda xs, f: ref_multi_krum(xs, f, len(xs) - f),
                   lambda n: (n - 3) // 2),
    "centered_clipping": (lambda cs, f: AGGREGATORS["centered_clipping"](cs, f=f, tau=0.7, iters=4),
                          lambda xs, f: ref_cc(xs, 0.7, 4), lambda n: (n - 1) // 2),
}
SIZES = [(1, 5), (2, 3), (3, 8), (4, 13), (5, 1), (6, 9), (7, 10), (8, 16), (9, 11), (16, 7)]
CASES = [(name, n, d) for name in SPECS for n, d in SIZES if SPECS[name][2](n) >= 0]


@pytest.mark.parametrize("block_columns", [3, kernels.CPU_BLOCK_COLUMNS])
@pytest.mark.parametrize(("name", "n", "d"), CASES)
def test_aggregator_matches_naive_reference(name: str, n: int, d: int, block_columns: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "CPU_BLOCK_COLUMNS", block_columns)
    call, reference, largest_f = SPECS[name]
    xs, f = randoms(n, d, seed=n * 100 + d), largest_f(n)

    result = call(contributions(xs), f)

    assert result.value.dtype == torch.float32 and result.value.shape == (d,)
    torch.testing.assert_close(result.value.double(), reference(xs, f), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("n", range(1, 18))
def test_trimming_network_leaves_middle_values_for_every_f(n: int) -> None:
    xs = randoms(n, 300, seed=n)
    stacked = torch.stack(xs).sort(dim=0).values
    for f in range((n + 1) // 2):
        torch.testing.assert_close(kernels.trimmed_mean(xs, f)[0], stacked[f:n - f].mean(dim=0))


@pytest.mark.parametrize("block_columns", [7, kernels.CPU_BLOCK_COLUMNS])
def test_every_kernel_reports_the_squared_norms_it_read(block_columns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The norms that sanitizing needs come out of each kernel's one pass over the inputs."""
    monkeypatch.setattr(kernels, "CPU_BLOCK_COLUMNS", block_columns)
    xs = randoms(9, 50, seed=8, scale=3.0)
    expected = [float(x.double().square().sum()) for x in xs]
    for squares in (kernels.mean(xs)[1], kernels.median(xs)[1], kernels.trimmed_mean(xs, 2)[1],
                    kernels.centred_gram(xs, center="median")[2], kernels.centred_gram(xs, center="mean")[2],
                    kernels.distances_to(xs, xs[0])[1]):
        assert squares == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(("points", "expected"), [
    ([[0, 0], [2, 0], [0, 2], [2, 2]], [1, 1]),            # square corners -> center
    ([[0, 0], [1, 1], [3, 3]], [1, 1]),                    # collinear -> middle point
    ([[5, -1], [5, -1], [5, -1], [100, 100]], [5, -1]),   # majority of equal points
    ([[1, 0], [-0.5, 3**0.5 / 2], [-0.5, -(3**0.5) / 2]], [0, 0]),  # equilateral triangle -> centroid
])
def test_geometric_median_closed_forms(points: list[list[float]], expected: list[float]) -> None:
    result = geometric_median(contributions([torch.tensor(p, dtype=torch.float32) for p in points]))
    torch.testing.assert_close(result.value, torch.tensor(expected, dtype=torch.float32), atol=1e-4, rtol=0)


@pytest.mark.parametrize(("values", "f", "median_value", "trimmed_value"), [
    ([3, 1, 2], 1, 2.0, 2.0),
    ([4, 1, 3, 2], 1, 2.5, 2.5),
    ([10, -50, 1, 2, 3, 1000], 2, 2.5, 2.5),
    ([7, 1, 2, 3, 100], 1, 3.0, 4.0),
    ([5], 0, 5.0, 5.0),
])
def test_median_and_trimmed_mean_on_known_sets(values: list[float], f: int, median_value: float,
                                               trimmed_value: float) -> None:
    cs = contributions([torch.tensor([v, -v], dtype=torch.float32) for v in values])
    assert coordinate_median(cs, f=f).value.tolist() == [median_value, -median_value]
    assert trimmed_mean(cs, f=f).value.tolist() == pytest.approx([trimmed_value, -trimmed_value])


ROBUST = ["median", "trimmed_mean", "geometric_median", "krum", "multi_krum", "centered_clipping"]
ALL = ["mean", *ROBUST]


def aggregate(name: str, cs: list[Contribution], f: int, failures: tuple[Failure, ...] = (), **params):
    """Run a registered aggregator; f is ignored by the mean; clipping gets tau=0.1."""
    if "clipping" in name:
        params.setdefault("tau", 0.1)
    return AGGREGATORS[name](cs, failures, f=0 if name == "mean" else f, **params)


@pytest.mark.parametrize("name", ALL)
def test_permutation_invariant(name: str) -> None:
    xs = [*randoms(9, 21, seed=3), torch.full((21,), 50.0)]
    cs = contributions(xs)
    expected = aggregate(name, cs, 2)
    for seed in range(4):
        shuffled = cs[:]
        random.Random(seed).shuffle(shuffled)

        got = aggregate(name, shuffled, 2)

        assert torch.equal(got.value, expected.value)
        assert got.used == expected.used and got.rejected == expected.rejected


@pytest.mark.parametrize("name", ROBUST)
def test_bounded_under_huge_byzantine_inputs_while_mean_is_not(name: str) -> None:
    honest = randoms(7, 10, seed=11, scale=0.01)
    byzantine = [torch.full((10,), 1e6 * (-1) ** i) for i in range(3)]
    cs = contributions(honest, "h") + contributions(byzantine, "b")
    honest_mean = torch.stack(honest).mean(dim=0)

    robust_error = float((aggregate(name, cs, 3).value - honest_mean).norm())
    mean_error = float((mean(cs).value - honest_mean).norm())

    assert robust_error < 0.2
    assert mean_error > 1e5


@pytest.mark.parametrize(("name", "n", "f"), [
    ("median", 4, 2), ("trimmed_mean", 6, 3), ("geometric_median", 2, 1), ("krum", 6, 2),
    ("multi_krum", 4, 1), ("centered_clipping", 4, 2), ("mean", 5, 1),
])
def test_impossible_f_refused_naming_f_and_n(name: str, n: int, f: int) -> None:
    cs = contributions(randoms(n, 4, seed=0))
    with pytest.raises(InvalidSetting, match=rf"f={f}.*n={n}"):
        AGGREGATORS[name](cs, (), f=f)


@pytest.mark.parametrize("name", list(AGGREGATORS))
def test_too_few_usable_is_not_enough_updates(name: str) -> None:
    cs = [*contributions(randoms(3, 4, seed=0)), Contribution("nan", torch.full((4,), math.nan))]
    timed_out = [Failure("late1", "timed out"), Failure("late2", "timed out")]
    # the NaN sender counts against f; the f left still needs more than the 2 usable
    f = 0 if name == "mean" else 1 if name in ("krum", "multi_krum") else 2
    with pytest.raises(NotEnoughUpdates, match="nan: contains NaN"):
        AGGREGATORS[name]([cs[3]], timed_out, f=0)
    if name != "mean":
        with pytest.raises(NotEnoughUpdates, match="late1: timed out"):
            AGGREGATORS[name](cs[:2] + cs[3:], timed_out, f=f)  # n = 5 could work, 2 usable cannot
    with pytest.raises(NotEnoughUpdates):
        AGGREGATORS[name]([], (), f=0)


def test_sanitize_rejects_each_bad_contribution_with_a_reason() -> None:
    good = contributions(randoms(3, 4, seed=1))
    bad = [
        Contribution("nan", torch.tensor([0.0, math.nan, 0.0, 0.0])),
        Contribution("inf", torch.tensor([0.0, 0.0, -math.inf, 0.0])),
        Contribution("absurd", torch.full((4,), 1e9)),
        Contribution("overflow", torch.full((4,), 3e38)),
        Contribution("dtype", torch.zeros(4, dtype=torch.float64)),
        Contribution("shape", torch.zeros(5)),
        Contribution("matrix", torch.zeros(2, 2)),
        Contribution("weight", torch.zeros(4), weight=math.nan),
        Contribution("dup", torch.zeros(4)), Contribution("dup", torch.ones(4)),
    ]

    kept, rejected = sanitize(bad + good, expected_numel=4, max_norm=1e6)

    assert [c.sender for c in kept] == ["p00", "p01", "p02"]
    reasons = {failure.sender: failure.reason for failure in rejected}
    assert len(rejected) == len(reasons) == 9
    for sender, expected in [("nan", "NaN or Inf"), ("inf", "NaN or Inf"), ("absurd", "exceeds max_norm"),
                             ("overflow", "overflows float32"), ("dtype", "float64"), ("shape", "(5,)"),
                             ("matrix", "(2, 2)"), ("weight", "weight"), ("dup", "duplicate sender")]:
        assert expected in reasons[sender], (sender, reasons[sender])


@pytest.mark.parametrize("name", ALL)
def test_bad_contributions_are_dropped_before_aggregation(name: str) -> None:
    cs = contributions(randoms(7, 6, seed=5))
    bad = [Contribution("x-nan", torch.full((6,), math.nan)), Contribution("x-big", torch.full((6,), 1e12))]
    clean = aggregate(name, cs, 1)

    result = aggregate(name, cs + bad, 1, (Failure("late", "timed out"),), max_norm=1e6)

    assert torch.equal(result.value, clean.value)
    assert {x.sender for x in result.rejected} >= {"late", "x-nan", "x-big"}


@pytest.mark.parametrize("name", ALL)
def test_claimed_huge_weight_changes_nothing(name: str) -> None:
    cs = contributions(randoms(7, 6, seed=8))
    liar = [Contribution(c.sender, c.vector, 1e9) if i == 6 else c for i, c in enumerate(cs)]
    assert torch.equal(aggregate(name, liar, 1).value, aggregate(name, cs, 1).value)
    trusted = mean(liar, trust_weights=True).value
    torch.testing.assert_close(trusted, cs[6].vector, atol=1e-6, rtol=0)


def test_multi_krum_accounts_for_unselected_and_majority_size() -> None:
    xs = [*randoms(6, 5, seed=2), torch.full((5,), 30.0)]
    result = multi_krum([*contributions(xs), Contribution("short", torch.zeros(3))], f=1, m=3)
    assert len(result.used) == 3 and "p06" not in result.used
    reasons = {x.sender: x.reason for x in result.rejected}
    assert "not selected by multi_krum" in reasons["p06"] and "(5,)" in reasons["short"]
    assert set(result.used) | set(reasons) == {f"p{i:02d}" for i in range(7)} | {"short"}
    with pytest.raises(InvalidSetting, match="m=7"):
        multi_krum(contributions(xs), f=1, m=7)


def test_gram_overflow_falls_back_to_float64() -> None:
    # |x| < 1.8e19 passes sanitize, but x - median reaches 2.4e19 and its square overflows float32
    xs = [torch.tensor([1.2e19, 1.2e19]), torch.tensor([-1.2e19, -1.2e19]), torch.tensor([-1.2e19, -1.2e19])]
    result = geometric_median(contributions(xs))
    torch.testing.assert_close(result.value, xs[1], rtol=1e-5, atol=0)


def test_geometric_median_smoothing_nu_beyond_the_spread_gives_the_mean() -> None:
    xs = randoms(5, 6, seed=12)
    result = geometric_median(contributions(xs), nu=100.0)
    torch.testing.assert_close(result.value, torch.stack(xs).mean(dim=0), atol=1e-6, rtol=0)
    torch.testing.assert_close(result.value.double(), ref_geomed(xs, nu=100.0), atol=1e-6, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ALL)
def test_device_and_default_blocks_match_small_cpu_blocks(name: str, device: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cs = contributions(randoms(9, 70_001, seed=4))
    monkeypatch.setattr(kernels, "CPU_BLOCK_COLUMNS", 1000)
    expected = aggregate(name, cs, 2).value
    monkeypatch.undo()

    got = aggregate(name, [Contribution(c.sender, c.vector.to(device)) for c in cs], 2).value

    assert got.device.type == device
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["median", "trimmed_mean", "geometric_median", "centered_clipping"])
def test_senders_caught_by_sanitize_count_against_f(name: str) -> None:
    """9 honest and 7 NaN senders with f = 7: the NaN ones are caught, so the round still aggregates
    the honest 9 (before, 2f + 1 = 15 usable were required and every such round stalled)."""
    honest = contributions(randoms(9, 6, seed=3))
    nans = [Contribution(f"z{i}", torch.full((6,), math.nan)) for i in range(7)]
    result = AGGREGATORS[name]([*honest, *nans], (), f=7)
    assert sorted(result.used) == sorted(c.sender for c in honest)
    assert {failure.sender for failure in result.rejected} >= {c.sender for c in nans}
    stacked = torch.stack([c.vector for c in honest])
    assert torch.all(result.value >= stacked.min(0).values - 1e-6) and torch.all(result.value <= stacked.max(0).values + 1e-6)


@pytest.mark.parametrize("name", ALL)
def test_the_torch_path_of_the_kernels_matches_the_numpy_path(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Accelerators run the same kernels as torch ops: forced onto them on CPU, the results agree."""
    cs = contributions(randoms(9, 5_001, seed=6))
    expected = aggregate(name, cs, 2).value
    monkeypatch.setattr(kernels, "_numpy", lambda vector: False)
    torch.testing.assert_close(aggregate(name, cs, 2).value, expected, atol=1e-5, rtol=1e-5)
