"""Byzantine attacks for tests and experiments: pure functions that return what an attacker sends.

``basic``: fixed recipes that do not look at the defence.

=====================  ==================================================================
``sign_flip``          -scale * v
``alie``               A Little Is Enough (Baruch et al., NeurIPS 2019): mean - z * std,
                       coordinate-wise over the honest vectors, z from the paper's formula
``ipm``                inner product manipulation (Xie et al., UAI 2019): -eps * mean
``gaussian``           pure noise N(0, sigma^2) shaped like v
``random_direction``   a uniformly random direction scaled to scale * ||v||
``stale``              the vector of ``lag`` rounds ago
``nan_update``         v with a NaN (one coordinate is all it takes)
``inf_update``         v with a +Inf
``huge_weight``        the same contribution, claiming weight 1e9
``label_flip``         data-level, for byte LMs: target y becomes num_classes - 1 - y
=====================  ==================================================================

``adaptive``: each knows its target's rule and public state (see that module for the threat model).

=====================  ==================================================================
``radius_sign_flip``   center - 0.99 tau u: the honest pull on the target's center,
                       flipped, just inside the clipping radius; with
                       ``invert_momentum``, lands there through a worker momentum
``alie_strongest``     ALIE with the z that moves the target's output furthest
``ipm_strongest``      IPM with the eps that moves the target's output furthest
``krum_capture``       identical copies of mean - lambda sign(mean), the largest lambda
                       the target still takes (Fang et al. 2020, against Krum)
``mimic``              every attacker copies one honest peer (``most_atypical``)
``withhold``           silence: nothing is sent
``sleeper``            honest-looking until a round, then another attack
=====================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from gossamer.protocols.core.attacks.adaptive import (
    ALIE_ZS,
    IPM_EPSILONS,
    KRUM_LAMBDAS,
    MARGIN,
    Oracle,
    alie_strongest,
    direction,
    invert_momentum,
    ipm_strongest,
    krum_capture,
    mimic,
    most_atypical,
    radius_sign_flip,
    sleeper,
    strongest,
    withhold,
)
from gossamer.protocols.core.attacks.basic import (
    HUGE_WEIGHT,
    alie,
    alie_z,
    gaussian,
    huge_weight,
    inf_update,
    ipm,
    label_flip,
    nan_update,
    random_direction,
    sign_flip,
    stale,
)

__all__ = [
    "ALIE_ZS", "ATTACKS", "HUGE_WEIGHT", "IPM_EPSILONS", "KRUM_LAMBDAS", "MARGIN", "Oracle", "alie",
    "alie_strongest", "alie_z", "direction", "gaussian", "huge_weight", "inf_update", "invert_momentum", "ipm",
    "ipm_strongest", "krum_capture", "label_flip", "mimic", "most_atypical", "nan_update", "radius_sign_flip",
    "random_direction", "sign_flip", "sleeper", "stale", "strongest", "withhold",
]

ATTACKS: Mapping[str, Callable[..., object]] = MappingProxyType({
    "sign_flip": sign_flip,
    "alie": alie,
    "ipm": ipm,
    "gaussian": gaussian,
    "random_direction": random_direction,
    "stale": stale,
    "nan_update": nan_update,
    "inf_update": inf_update,
    "huge_weight": huge_weight,
    "label_flip": label_flip,
    "radius_sign_flip": radius_sign_flip,
    "alie_strongest": alie_strongest,
    "ipm_strongest": ipm_strongest,
    "krum_capture": krum_capture,
    "mimic": mimic,
    "withhold": withhold,
    "sleeper": sleeper,
})
"""Attacks by function name (signatures differ: see each function)."""
