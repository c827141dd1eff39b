"""BlockTrain noise bands: equal-probability edges, sampling within a band, EDM coefficients."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from gossamer.protocols.blocktrain.core import (
    BlockTrainConfig,
    band_edges,
    edm_coefficients,
    loss_weight,
    sample_sigma,
)
from tests.protocols.blocktrain.core.support import gen


def _truncated_cdf(config: BlockTrainConfig, sigma: float) -> float:
    """Reference CDF of the log-normal restricted to [sigma_min, sigma_max], via math.erf."""

    def phi(s: float) -> float:
        return 0.5 * (1.0 + math.erf((math.log(s) - config.p_mean) / (config.p_std * math.sqrt(2.0))))

    return (phi(sigma) - phi(config.sigma_min)) / (phi(config.sigma_max) - phi(config.sigma_min))


def test_band_edges_for_four_blocks_match_the_spec() -> None:
    edges = band_edges(BlockTrainConfig())

    assert edges == pytest.approx([1.000, 1.238, 1.623, 2.428, 10.000], abs=1e-3)  # 2.4285 in full


@pytest.mark.parametrize(
    "config",
    [BlockTrainConfig(), BlockTrainConfig(num_blocks=3, sigma_min=0.002, sigma_max=80.0),
     BlockTrainConfig(num_blocks=5, sigma_min=20.0, sigma_max=80.0)],
)
def test_each_band_has_equal_probability_under_the_truncated_log_normal(config: BlockTrainConfig) -> None:
    cdf = [_truncated_cdf(config, edge) for edge in band_edges(config)]

    masses = [hi - lo for lo, hi in itertools.pairwise(cdf)]
    assert masses == pytest.approx([1.0 / config.num_blocks] * config.num_blocks, abs=1e-9)


def test_sampled_sigmas_stay_in_their_band_and_split_it_at_the_median() -> None:
    config = BlockTrainConfig()
    edges = band_edges(config)
    for k in range(config.num_blocks):
        sigma = sample_sigma(config, k, 4000, generator=gen(k))

        assert bool((sigma >= edges[k]).all()) and bool((sigma <= edges[k + 1]).all())
        median_mass = _truncated_cdf(config, float(sigma.median()))
        assert median_mass == pytest.approx((k + 0.5) / config.num_blocks, abs=0.01)


def test_edm_coefficients_and_loss_weight_match_hand_values() -> None:
    sigma = torch.tensor([1.0, 10.0], dtype=torch.float64)

    coeff = edm_coefficients(sigma, 0.5)

    assert coeff.c_skip.tolist() == pytest.approx([0.25 / 1.25, 0.25 / 100.25])
    assert coeff.c_out.tolist() == pytest.approx([0.4472135955, 0.4993761694])
    assert coeff.c_in.tolist() == pytest.approx([0.8944271910, 0.0998752338])
    assert coeff.c_noise.tolist() == pytest.approx([0.0, math.log(10.0) / 4.0])
    assert loss_weight(sigma, 0.5).tolist() == pytest.approx([5.0, 4.01])
    assert torch.allclose(loss_weight(sigma, 0.5), coeff.c_out**-2)
