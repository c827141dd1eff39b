"""Coefficient messages: exact round trip, counted bytes, and every malformed message refused by type."""

from __future__ import annotations

import copy
import dataclasses

import msgpack
import pytest
import torch

from gossamer.protocols.context.core import (
    BasisMismatch,
    MessageRefused,
    RingMember,
    SubspaceConfig,
    basis_hash,
    decode_message,
    encode_message,
    payload_bytes,
    reduce_gradients,
    run_ring,
    sequence_payload_bytes,
    split_chunks,
)
from gossamer.protocols.context.core.wire import KVMessage
from gossamer.protocols.core.models import ModelConfig
from gossamer.transport.frames import Frame, FrameType, decode_frame, encode_frame
from tests.protocols.context.core.conftest import batch, tiny_model


def first_messages(subspace: SubspaceConfig, *, config: ModelConfig | None = None, dtype=torch.float64):
    """Member 0's forward message to member 1, and member 1 (which expects it)."""
    kwargs = {} if config is None else {"config": config}
    model = tiny_model(subspace, **kwargs).to(dtype)
    tokens, targets = batch(length=model.config.context)
    pieces = split_chunks(tokens, targets, 2)
    sender = RingMember(model, index=0, chunks=2, step=7, tokens=pieces[0][0], targets=pieces[0][1])
    receiver = RingMember(model, index=1, chunks=2, step=7, tokens=pieces[1][0], targets=pieces[1][1])
    (send,) = sender.step()
    return send.message, receiver


def wire(message: KVMessage, receiver: RingMember) -> tuple[dict, bytes]:
    header, parts = encode_message(message, mixtures=receiver.spec.mixtures)
    return msgpack.unpackb(msgpack.packb(header)), b"".join(bytes(memoryview(p)) for p in parts)


@pytest.mark.parametrize("subspace", [SubspaceConfig(), SubspaceConfig(rank=2, mixtures=3)], ids=lambda s: s.label())
def test_a_message_survives_the_wire_exactly(subspace: SubspaceConfig) -> None:
    message, receiver = first_messages(subspace)
    header, payload = wire(message, receiver)

    got = decode_message(header, bytearray(payload), receiver.spec)

    assert got.key == message.key == ("kv", 0, 0, None)
    assert torch.equal(got.k, message.k) and torch.equal(got.v, message.v)
    assert (got.index is None) == (message.index is None)
    if got.index is not None:
        assert torch.equal(got.index, message.index)
    assert len(payload) == payload_bytes(receiver.spec, "kv")


WIDE = ModelConfig(d_model=128, n_layers=1, n_heads=4, context=32)


@pytest.mark.parametrize(("rank", "mixtures"), [(2, 1), (1, 1), (2, 4), (1, 4)])
def test_counted_bytes_are_r_over_d_head_of_dense_plus_the_index(rank: int, mixtures: int) -> None:
    dense, dense_receiver = first_messages(SubspaceConfig(), config=WIDE, dtype=torch.float32)
    coded, coded_receiver = first_messages(SubspaceConfig(rank=rank, mixtures=mixtures), config=WIDE,
                                           dtype=torch.float32)
    dense_bytes = len(wire(dense, dense_receiver)[1])
    coded_bytes = len(wire(coded, coded_receiver)[1])
    batch_size, heads, tokens, d_head = dense.k.shape
    index_bytes = batch_size * heads * tokens if mixtures > 1 else 0

    assert dense_bytes == 2 * batch_size * heads * tokens * d_head * 4
    assert coded_bytes - index_bytes == dense_bytes * rank // d_head
    assert coded_bytes == payload_bytes(coded_receiver.spec, "kv")


@pytest.mark.parametrize("subspace", [SubspaceConfig(), SubspaceConfig(rank=2, mixtures=2)], ids=lambda s: s.label())
def test_a_whole_step_sends_exactly_the_counted_bytes(subspace: SubspaceConfig) -> None:
    model = tiny_model(subspace)
    tokens, targets = batch()
    members = [RingMember(model, index=i, chunks=4, step=0, tokens=x, targets=y)
               for i, (x, y) in enumerate(split_chunks(tokens, targets, 4))]
    trace = run_ring(members)

    sent: dict[str, int] = {"kv": 0, "dkv": 0}
    for record in trace.sent:
        sent[record.message.kind] += len(wire(record.message, members[record.target])[1])
    assert sent == sequence_payload_bytes(members[0].spec)


def _corrupt_payload(payload: bytes, dtype: torch.dtype, value: float) -> bytearray:
    data = bytearray(payload)
    torch.frombuffer(data, dtype=dtype, count=1)[0] = value
    return data


MALFORMED = {
    "missing key": (lambda h, p: ({k: v for k, v in h.items() if k != "basis"}, p), "header"),
    "extra key": (lambda h, p: ({**h, "note": 1}, p), "header"),
    "wire version": (lambda h, p: ({**h, "v": 2}, p), "header"),
    "kind": (lambda h, p: ({**h, "kind": "grad"}, p), "header"),
    "step as text": (lambda h, p: ({**h, "step": "7"}, p), "header"),
    "layer out of range": (lambda h, p: ({**h, "layer": 9}, p), "header"),
    "kv names a user": (lambda h, p: ({**h, "user": 1}, p), "header"),
    "shape": (lambda h, p: ({**h, "shape": [h["shape"][0], h["shape"][1], h["shape"][2] - 1, h["shape"][3]]}, p),
              "shape"),
    "rank": (lambda h, p: ({**h, "shape": [*h["shape"][:3], h["shape"][3] + 1]}, p), "shape"),
    "mixtures": (lambda h, p: ({**h, "mixtures": 5}, p), "shape"),
    "dtype not allowed": (lambda h, p: ({**h, "dtype": "int64"}, p), "dtype"),
    "dtype not ours": (lambda h, p: ({**h, "dtype": "float32"}, p), "dtype"),
    "short payload": (lambda h, p: (h, p[:-1]), "length"),
    "long payload": (lambda h, p: (h, p + b"\0"), "length"),
    "NaN": (lambda h, p: (h, _corrupt_payload(p, torch.float64, float("nan"))), "nonfinite"),
    "Inf": (lambda h, p: (h, _corrupt_payload(p, torch.float64, float("inf"))), "nonfinite"),
    "index out of range": (lambda h, p: (h, p[:-1] + bytes([9])), "index"),
    "other step": (lambda h, p: ({**h, "step": 8}, p), "order"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_messages_are_refused_with_a_typed_error_and_the_member_keeps_serving(case: str) -> None:
    message, receiver = first_messages(SubspaceConfig(rank=2, mixtures=3))
    header, payload = wire(message, receiver)
    corrupt, code = MALFORMED[case]
    bad_header, bad_payload = corrupt(copy.deepcopy(header), payload)

    with pytest.raises(MessageRefused) as refused:
        decode_message(bad_header, bytearray(bad_payload), receiver.spec)
    assert refused.value.code == code

    receiver.deliver(decode_message(header, bytearray(payload), receiver.spec))
    assert receiver.waiting_for is None


def test_a_basis_hash_mismatch_is_refused_never_used() -> None:
    message, receiver = first_messages(SubspaceConfig(rank=2))
    header, payload = wire(message, receiver)
    with torch.no_grad():
        receiver.model.blocks[0].attn.k_basis[0, 0] *= -1  # still orthonormal, but other bases
    diverged = dataclasses.replace(receiver.spec, bases=tuple(
        basis_hash(block.attn, i) for i, block in enumerate(receiver.model.blocks)))
    assert diverged.bases[0] != receiver.spec.bases[0] and diverged.bases[1] == receiver.spec.bases[1]
    with pytest.raises(BasisMismatch) as refused:
        decode_message(header, bytearray(payload), diverged)
    assert refused.value.code == "basis"
    with pytest.raises(BasisMismatch):
        receiver.deliver(dataclasses.replace(message, basis="0" * 32))


def test_the_ring_refuses_messages_that_are_not_this_members_to_take() -> None:
    message, receiver = first_messages(SubspaceConfig(rank=2))
    receiver.deliver(message)
    with pytest.raises(MessageRefused, match="already arrived") as duplicate:
        receiver.deliver(message)
    assert duplicate.value.code == "order"
    for bad in (dataclasses.replace(message, owner=1),
                dataclasses.replace(message, kind="dkv", user=0, owner=1),
                dataclasses.replace(message, kind="dkv", user=1, owner=0)):
        with pytest.raises(MessageRefused) as refused:
            receiver.deliver(bad)
        assert refused.value.code == "order"


def test_a_refused_message_leaves_the_step_result_unchanged() -> None:
    model = tiny_model(SubspaceConfig(rank=2, mixtures=2))
    tokens, targets = batch()
    pieces = split_chunks(tokens, targets, 2)
    clean = [RingMember(model, index=i, chunks=2, step=0, tokens=x, targets=y) for i, (x, y) in enumerate(pieces)]
    run_ring(clean)

    members = [RingMember(model, index=i, chunks=2, step=0, tokens=x, targets=y) for i, (x, y) in enumerate(pieces)]
    for send in members[0].step():
        poisoned = dataclasses.replace(send.message, k=send.message.k.clone().fill_(float("nan")))
        with pytest.raises(MessageRefused):
            members[1].deliver(poisoned)
        members[1].deliver(send.message)
    run_ring(members)

    assert torch.equal(sum(m.loss for m in members), sum(m.loss for m in clean))
    want = reduce_gradients([m.gradients() for m in clean])
    got = reduce_gradients([m.gradients() for m in members])
    assert all(torch.equal(got[name], grad) for name, grad in want.items())


def test_a_message_fits_a_gossamer_tcp_frame_unchanged() -> None:
    message, receiver = first_messages(SubspaceConfig(rank=1, mixtures=4))
    header, parts = encode_message(message, mixtures=receiver.spec.mixtures)
    data = b"".join(bytes(memoryview(part).cast("B")) for part in encode_frame(Frame(FrameType.ONEWAY, header, parts)))

    frame = decode_frame(bytearray(data))
    got = decode_message(frame.header, frame.payload, receiver.spec)

    assert frame.header == header
    assert torch.equal(got.k, message.k) and torch.equal(got.index, message.index)
