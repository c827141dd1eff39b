"""Byzantine attacks for tests and experiments: pure functions that return what an attacker sends
(README.md of protocols/core, "Attacks", tabulates them and the threat model).

- ``basic``     fixed recipes that do not look at the defence (sign flip, ALIE, IPM, noise, NaN, ...).
- ``adaptive``  attacks that know their target's rule and public state (strongest ALIE/IPM, Krum
                capture, radius sign flip, mimic, withhold, sleeper)."""

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
