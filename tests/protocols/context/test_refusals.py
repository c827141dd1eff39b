"""Malformed or misplaced ring frames are refused with a typed reason while the cp-shard goes on
serving (on a LocalNet). The test plays the ring's leader itself: it signs a plan as the peer the
shard takes for the leader, then sends the shard coefficient frames that are wrong in one way
each (shape, dtype, NaN, basis, length, a tampered or replayed envelope, a sender out of place,
a stranger), then a good one, then aborts the step; the real leader then starts and the two
train to the end."""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest

from gossamer.crypto.identity import Identity
from gossamer.protocols.context.core import RingMember, build_context_model, encode_message
from gossamer.protocols.context.shard import CpShardRole
from gossamer.protocols.context.wire import ABORT, KV, PLAN, Plan, frame_for, new_attempt, outbound
from gossamer.protocols.registry import PLUGINS
from gossamer.transport.errors import RemoteError
from gossamer.transport.frames import Frame
from gossamer.transport.tcp import TcpConnection, tcp_connect
from gossamer_harness.localnet import LocalNet
from tests.protocols.context.harness import drain, identities, run_config

pytestmark = pytest.mark.timeout(180)
STEPS = 2


def first_kv(shard: CpShardRole, plan: Plan) -> tuple[dict, list[bytes]]:
    """Member 0's real first kv message of ``plan`` (computed as the leader would)."""
    settings = shard.settings
    model = build_context_model(settings.model, settings.subspace, seed=settings.seed)
    tokens, targets = shard.data.chunk(step=plan.step, seed=settings.seed, batch_size=plan.batch_size,
                                       chunks=plan.chunks, chunk_tokens=plan.chunk_tokens, index=0)
    member = RingMember(model, index=0, chunks=plan.chunks, step=plan.step, tokens=tokens, targets=targets)
    sends = member.step()
    assert sends and sends[0].message.kind == KV
    header, payload = encode_message(sends[0].message, mixtures=member.spec.mixtures)
    return header, [bytes(memoryview(part).cast("B")) for part in payload]


async def refusal(connection: TcpConnection, frame: Frame) -> str:
    with pytest.raises(RemoteError) as caught:
        await connection.request(frame, timeout_s=30)
    return str(caught.value)


async def test_malformed_coefficient_frames_are_refused_and_the_shard_serves_on(tmp_path: Path) -> None:
    leader_id, shard_id, bystander_id = identities(3)
    net = await LocalNet.create(run_config(steps=STEPS), plugins=PLUGINS, workdir=tmp_path)
    try:
        await net.add("leader", ("cp-shard",), identity=leader_id)
        shard: CpShardRole = (await net.add("shard", ("cp-shard",), identity=shard_id)).role  # type: ignore[assignment]
        await net.add("bystander", ("cp-shard",), identity=bystander_id)
        await net.start("shard")
        run_id = net.manifest.run_id
        connection = await tcp_connect(*net["shard"].tcp.address)

        def sealed(identity: Identity, op: str, body: dict, payload=b"") -> Frame:
            return frame_for(outbound(op, 0, body, payload), identity, recipient=shard.peer_id, run_id=run_id,
                             now=net.now())

        plan = Plan(step=0, attempt=new_attempt(), members=(leader_id.peer_id, shard.peer_id),
                    chunk_tokens=shard.settings.chunk_tokens, batch_size=shard.settings.batch_size,
                    data=shard.data.digest)
        answer = await connection.request(sealed(leader_id, PLAN, plan.body()), timeout_s=30)
        assert answer.header["accepted"] is True
        attempt = shard.runner.attempt
        assert attempt is not None and attempt.id == plan.attempt

        header, payload = first_kv(shard, plan)
        body = {"attempt": plan.attempt}
        floats = numpy.frombuffer(payload[0], dtype=numpy.float32).copy()
        floats[0] = numpy.nan
        batch, heads, tokens, width = header["shape"]
        cases = {
            "shape": sealed(leader_id, KV, {**body, "msg": {**header, "shape": [batch, heads, width, tokens]}}, payload),
            "dtype": sealed(leader_id, KV, {**body, "msg": {**header, "dtype": "float16"}},
                            [payload[0][:len(payload[0]) // 2], payload[1][:len(payload[1]) // 2]]),
            "nonfinite": sealed(leader_id, KV, {**body, "msg": header}, [floats.tobytes(), payload[1]]),
            "basis": sealed(leader_id, KV, {**body, "msg": {**header, "basis": "0" * 64}}, payload),
            "length": sealed(leader_id, KV, {**body, "msg": header}, [*payload, b"four"]),
            "sender": sealed(bystander_id, KV, {**body, "msg": header}, payload),
        }
        for code, frame in cases.items():
            assert f"refused ({code})" in await refusal(connection, frame), code
        assert "refused (sender)" in await refusal(connection, sealed(Identity.generate(), KV, {**body, "msg": header},
                                                                         payload))
        good = sealed(leader_id, KV, {**body, "msg": header}, payload)
        tampered = Frame(good.type, good.header, [payload[0][:-1] + b"\x00", payload[1]])
        assert "refused (envelope)" in await refusal(connection, tampered)
        assert "refused (envelope)" in await refusal(connection, cases["shape"])  # a replay
        assert shard.runner.attempt is attempt and not attempt.aborted and attempt.inbox.empty()

        assert "held" not in (await connection.request(good, timeout_s=30)).header
        assert attempt.ledger.coefficients.arrived == [leader_id.peer_id]
        await connection.request(sealed(leader_id, ABORT, {**body, "reason": "test over", "suspect": None}),
                                 timeout_s=30)
        await connection.aclose()
        net.forget("bystander")  # it never runs its role: the real ring is the leader and the shard
        leader: CpShardRole = net["leader"].role  # type: ignore[assignment]
        await net.start("leader")
        await drain([leader, shard])

        assert shard.links.refused == {"shape": 1, "dtype": 1, "nonfinite": 1, "basis": 1, "length": 1, "sender": 2,
                                 "envelope": 2}
        aborted, *applied = list(shard.runner.history)
        assert aborted.attempt == plan.attempt and aborted.aborted.startswith(f"aborted by {leader_id.peer_id[:12]}")
        assert aborted.coefficients.rejected == {leader_id.peer_id: "discarded: the step aborted"}
        assert [ledger.step for ledger in applied] == list(range(STEPS)) and all(ledger.applied for ledger in applied)
        assert shard.finished and leader.finished
    finally:
        await net.aclose()
