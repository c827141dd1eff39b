"""The noise schedule: equal-probability bands of sigma, sampling within a band, EDM coefficients.
Block k owns [edges[k], edges[k+1]] of a log-normal(p_mean, p_std) restricted to [sigma_min,
sigma_max], 1/num_blocks of its mass; EDM is Karras et al. 2022, table 1."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gossamer.protocols.blocktrain.core.errors import BlockTrainError, check_block

if TYPE_CHECKING:
    from gossamer.protocols.blocktrain.core.config import BlockTrainConfig


def _band_quantiles(config: BlockTrainConfig, fractions: torch.Tensor) -> torch.Tensor:
    """sigma at the given fractions (float64, in [0, 1]) of the truncated log-normal's mass.

    Works on whichever tail of the normal keeps precision (survival function above the median).
    """
    a = (math.log(config.sigma_min) - config.p_mean) / config.p_std
    b = (math.log(config.sigma_max) - config.p_mean) / config.p_std
    ndtr = torch.special.ndtr
    if a >= 0:  # upper tail: interpolate survival probabilities S(x) = ndtr(-x)
        s_a, s_b = ndtr(torch.tensor(-a, dtype=torch.float64)), ndtr(torch.tensor(-b, dtype=torch.float64))
        x = -torch.special.ndtri(s_a - fractions * (s_a - s_b))
    else:
        p_a, p_b = ndtr(torch.tensor(a, dtype=torch.float64)), ndtr(torch.tensor(b, dtype=torch.float64))
        x = torch.special.ndtri(p_a + fractions * (p_b - p_a))
    sigma = torch.exp(config.p_mean + config.p_std * x)
    return sigma.clamp(config.sigma_min, config.sigma_max)


def band_edges(config: BlockTrainConfig) -> list[float]:
    """num_blocks + 1 increasing edges; band k = [edges[k], edges[k+1]] has 1/num_blocks of the mass."""
    fractions = torch.arange(config.num_blocks + 1, dtype=torch.float64) / config.num_blocks
    edges = _band_quantiles(config, fractions).tolist()
    edges[0], edges[-1] = config.sigma_min, config.sigma_max
    if not all(lo < hi for lo, hi in itertools.pairwise(edges)):
        raise BlockTrainError(
            f"sigma_min/sigma_max: [{config.sigma_min}, {config.sigma_max}] holds too little mass of "
            f"log-normal({config.p_mean}, {config.p_std}) to split into {config.num_blocks} bands"
        )
    return edges


def sample_sigma(config: BlockTrainConfig, k: int, count: int, *, generator: torch.Generator) -> torch.Tensor:
    """``count`` noise levels from block k's band of the truncated log-normal (float64, generator's device)."""
    check_block(config, k)
    u = torch.rand(count, dtype=torch.float64, generator=generator, device=generator.device)
    fractions = (k + u.cpu()) / config.num_blocks
    edges = band_edges(config)
    return _band_quantiles(config, fractions).clamp(edges[k], edges[k + 1]).to(generator.device)


@dataclass(frozen=True)
class EdmCoefficients:
    """EDM preconditioning at noise level(s) sigma (Karras et al. 2022, table 1)."""

    c_skip: torch.Tensor
    c_out: torch.Tensor
    c_in: torch.Tensor
    c_noise: torch.Tensor


def edm_coefficients(sigma: torch.Tensor, sigma_data: float) -> EdmCoefficients:
    """c_skip, c_out, c_in, c_noise for each sigma (same shape and dtype as ``sigma``)."""
    total = sigma**2 + sigma_data**2
    return EdmCoefficients(
        c_skip=sigma_data**2 / total,
        c_out=sigma * sigma_data / total.sqrt(),
        c_in=1.0 / total.sqrt(),
        c_noise=sigma.log() / 4.0,
    )


def loss_weight(sigma: torch.Tensor, sigma_data: float) -> torch.Tensor:
    """lambda(sigma) = (sigma^2 + sigma_d^2) / (sigma sigma_d)^2 = 1 / c_out^2."""
    return (sigma**2 + sigma_data**2) / (sigma * sigma_data) ** 2

