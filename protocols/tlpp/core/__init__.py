"""TL++ traversal learning, pure: declared models and their split at the cut (``stages``,
``builtins``, ``model``), virtual batches (``schedule``), each side's step math (``step``), input
normalisation (``normalize``), secure mode's share arithmetic (``secure``), the node pacing
(``pacing``), the byte formulas (``traffic``) and ``errors`` (``TraversalError``)."""

from gossamer.protocols.tlpp.core.builtins import BUILTINS, builtin_stages
from gossamer.protocols.tlpp.core.errors import TraversalError
from gossamer.protocols.tlpp.core.model import affine_layer, check_node_side, digits_cnn, split_model
from gossamer.protocols.tlpp.core.normalize import (
    ChannelStats,
    Normalize,
    channel_stats,
    pool_stats,
    read_stats,
)
from gossamer.protocols.tlpp.core.schedule import VirtualBatch, VirtualBatchScheduler
from gossamer.protocols.tlpp.core.stages import (
    Declaration,
    build_stages,
    check_cut,
    check_secure,
    infer_shapes,
)
from gossamer.protocols.tlpp.core.step import (
    OrchestratorStep,
    logit_gradient,
    node_backward,
    node_forward,
    orchestrator_step,
    sum_grads,
)
from gossamer.protocols.tlpp.core.traffic import full_sync_step_bytes, tlpp_secure_step_bytes, tlpp_step_bytes

__all__ = [
    "BUILTINS",
    "ChannelStats",
    "Declaration",
    "Normalize",
    "OrchestratorStep",
    "TraversalError",
    "VirtualBatch",
    "VirtualBatchScheduler",
    "affine_layer",
    "build_stages",
    "builtin_stages",
    "channel_stats",
    "check_cut",
    "check_node_side",
    "check_secure",
    "digits_cnn",
    "full_sync_step_bytes",
    "infer_shapes",
    "logit_gradient",
    "node_backward",
    "node_forward",
    "orchestrator_step",
    "pool_stats",
    "read_stats",
    "split_model",
    "sum_grads",
    "tlpp_secure_step_bytes",
    "tlpp_step_bytes",
]
