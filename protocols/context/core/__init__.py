"""Compressed context parallelism: ring attention whose keys and values cross the wire as subspace
coefficients (after "Mixtures of Subspaces for Bandwidth Efficient Context Parallel Training").

P **members** each hold one **chunk** (a contiguous T tokens) of every sequence of a batch and the
whole model. Attention is causal ring attention with blockwise online-softmax accumulation. Per
head, K = X A_K U_K^T and V = X A_V U_V^T with U (d_head x r) orthonormal: a member sends the
**coefficients** C = X A (r numbers per head per token for K, r for V) instead of K and V, and the
receiver rebuilds them exactly. With a **mixture** of M subspaces per head a gate picks one per
token, and the message carries its index too. In the backward the member that used chunk p's
keys sends dC = dK U back to p, which sums them and backpropagates; the basis gradient dU stays
with whoever computed it and is summed with every other weight gradient. Bases stay orthonormal
(tangent projection + QR retraction), are identical on every member, and every message carries
their hash.

Map of the package:

- ``errors``     ContextError > InvalidRing, MessageRefused > BasisMismatch.
- ``config``     ``SubspaceConfig`` (rank r or dense, mixtures M).
- ``subspace``   ``SubspaceAttention``; the Stiefel helpers (init, tangent projection, retraction,
                 orthonormality error) and ``basis_hash``.
- ``model``      ``build_context_model`` (a ``ByteTransformer``, dense or subspace-coded) and
                 ``coding_of`` (what the ring needs from an attention layer).
- ``blockwise``  one block of attention forward/backward and the online-softmax merge.
- ``wire``       ``KVMessage``; the frame format, ``encode_message``/``decode_message`` with every
                 check; routing (``forward_to``); the step's message plan; byte counts.
- ``member``     ``RingMember`` (one member's step as a state machine), ``ring_spec`` (what a
                 step's messages must look like), ``reduce_gradients``, ``apply_update``.
- ``ring``       ``split_chunks`` and ``run_ring``: a whole ring in one process.
"""

from gossamer.protocols.context.core.config import SubspaceConfig
from gossamer.protocols.context.core.errors import BasisMismatch, ContextError, InvalidRing, MessageRefused
from gossamer.protocols.context.core.member import (
    Outgoing,
    RingMember,
    apply_update,
    reduce_gradients,
    ring_spec,
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
    "split_chunks",
    "subspace_of",
]
