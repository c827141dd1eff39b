"""Compressed context parallelism, pure (the method and a step: ``protocols/context/README.md``):
``errors`` ContextError > InvalidRing, MessageRefused > BasisMismatch; ``config`` ``SubspaceConfig``; ``subspace``
``SubspaceAttention`` and the Stiefel helpers; ``model`` ``build_context_model``, ``coding_of``; ``blockwise`` one
attention block and the online-softmax merge; ``wire`` coefficient messages and their checks; ``member``
``RingMember``, ``clip_shares``, ``reduce_gradients``, ``apply_update``; ``ring`` ``split_chunks``, ``run_ring`` (one process).
"""

from gossamer.protocols.context.core.config import SubspaceConfig
from gossamer.protocols.context.core.errors import BasisMismatch, ContextError, InvalidRing, MessageRefused
from gossamer.protocols.context.core.member import (
    Outgoing,
    RingMember,
    apply_update,
    clip_shares,
    reduce_gradients,
    ring_spec,
    share_norm,
)
from gossamer.protocols.context.core.model import build_context_model, coding_of, subspace_of
from gossamer.protocols.context.core.ring import RingTrace, Sent, run_ring, split_chunks
from gossamer.protocols.context.core.subspace import (
    SubspaceAttention,
    basis_hash,
    orthonormality_error,
    project_basis_grads,
    retract_bases,
)
from gossamer.protocols.context.core.wire import (
    BACKWARD,
    FORWARD,
    KVMessage,
    MessageSpec,
    PlannedSend,
    check_message,
    decode_message,
    encode_message,
    forward_to,
    message_plan,
    payload_bytes,
    sequence_payload_bytes,
)

__all__ = [
    "BACKWARD",
    "FORWARD",
    "BasisMismatch",
    "ContextError",
    "InvalidRing",
    "KVMessage",
    "MessageRefused",
    "MessageSpec",
    "Outgoing",
    "PlannedSend",
    "RingMember",
    "RingTrace",
    "Sent",
    "SubspaceAttention",
    "SubspaceConfig",
    "apply_update",
    "basis_hash",
    "build_context_model",
    "check_message",
    "clip_shares",
    "coding_of",
    "decode_message",
    "encode_message",
    "forward_to",
    "message_plan",
    "orthonormality_error",
    "payload_bytes",
    "project_basis_grads",
    "reduce_gradients",
    "retract_bases",
    "ring_spec",
    "run_ring",
    "sequence_payload_bytes",
    "share_norm",
    "split_chunks",
    "subspace_of",
]
