"""BlockTrain's one error type (a bad tensor, argument or state; config refusals are ``InvalidSetting``)
and the call-time argument checks that raise it, naming the argument."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gossamer.protocols.core.errors import ProtocolError

if TYPE_CHECKING:
    from gossamer.protocols.blocktrain.core.config import BlockTrainConfig


class BlockTrainError(ProtocolError, ValueError):
    """A bad BlockTrain tensor, argument or state; the message names the argument or value."""


def check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BlockTrainError(f"{name}: must be a positive integer, got {value!r}")


def check_block(config: BlockTrainConfig, k: Any) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < config.num_blocks:
        raise BlockTrainError(f"block: must be an int in [0, {config.num_blocks}), got {k!r}")
