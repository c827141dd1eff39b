"""BlockTrain's one error type and the argument checks that raise it, naming the field."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gossamer.protocols.core.errors import ProtocolError

if TYPE_CHECKING:
    from gossamer.protocols.blocktrain.core.config import BlockTrainConfig


class BlockTrainError(ProtocolError, ValueError):
    """A bad BlockTrain setting, tensor or state; the message names the field or value."""


def check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BlockTrainError(f"{name}: must be a positive integer, got {value!r}")


def check_finite(name: str, value: Any, *, positive: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        kind = "a finite number > 0" if positive else "a finite number"
        raise BlockTrainError(f"{name}: must be {kind}, got {value!r}")


def check_block(config: BlockTrainConfig, k: Any) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < config.num_blocks:
        raise BlockTrainError(f"block: must be an int in [0, {config.num_blocks}), got {k!r}")
