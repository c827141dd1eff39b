"""A learner's receiving route attacked by another admitted learner of an open run (issues 10 and
21), over real HTTP in a ``LocalNet``: parameters signed for ``/diloco/params/0`` and rewritten in
transit to ``/diloco/pgrad/0`` (same names and shapes with ``w2_subset = "all"``) are refused and
the genuine message is still accepted; a round of 5,000 digits is a 404, not a 500; a body
larger than the model is refused (413) before it is read."""

from __future__ import annotations

import base64
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from gossamer.crypto.envelope import payload_digest, seal
from gossamer.peer.kit.messaging import ENVELOPE_HEADER, request_target
from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.diloco.learner import LearnerRole
from gossamer.protocols.registry import PLUGINS
from gossamer.transport.errors import RemoteError
from gossamer.transport.safetensors_stream import encode_safetensors
from gossamer_harness.localnet import LocalNet

RUN = {
    "run": {"name": "hostile", "protocol": "diloco", "heartbeat_s": 30.0},
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "hyper": {"rounds": 1, "batch_size": 4, "mixing": {"w1": "global", "w2": "global", "w2_subset": "all"}},
}


@pytest.fixture
async def net(tmp_path: Path) -> AsyncIterator[LocalNet]:
    network = await LocalNet.create(RUN, plugins=PLUGINS, workdir=tmp_path)
    await network.add("victim", ("learner",))
    await network.add("sender", ("learner",))  # admitted (open run) and a learner: it may send
    try:
        yield network
    finally:
        await network.aclose()


def signed(net: LocalNet, *, url: str, round: int, body: list) -> dict[str, str]:
    sender, victim = net["sender"], net["victim"]
    blob = seal(sender.identity, recipient=victim.peer_id, run_id=net.manifest.run_id, round=round, method="PUT",
                target=request_target(url), payload_digest=payload_digest(*body), now=net.now(),
                nonce=secrets.token_bytes(16))
    return {ENVELOPE_HEADER: base64.b64encode(blob).decode()}


def url(net: LocalNet, path: str) -> str:
    return f"http://127.0.0.1:{net['victim'].http.address[1]}{path}"


async def test_params_rewritten_to_pgrad_in_transit_are_refused_and_the_genuine_message_accepted(
        net: LocalNet) -> None:
    victim: LearnerRole = net["victim"].role  # type: ignore[assignment]
    params = {name: t + 1.0 for name, t in flat_parameters(net["sender"].role.replica.module).items()}
    size, chunks = encode_safetensors(params)
    headers = signed(net, url=url(net, "/diloco/params/0"), round=0, body=chunks)

    with pytest.raises(RemoteError) as moved:
        await net.http_client.put_body(url(net, "/diloco/pgrad/0"), size, chunks, extra_headers=headers)
    answer = await net.http_client.put_body(url(net, "/diloco/params/0"), size, chunks, extra_headers=headers)

    assert moved.value.status == 403 and answer == {"accepted": True}
    assert list(await victim.inbox.collect("params", 0, [net["sender"].peer_id], timeout_s=0.0)) == \
        [net["sender"].peer_id]
    assert await victim.inbox.collect("pgrad", 0, [net["sender"].peer_id], timeout_s=0.0) == {}


async def test_a_5000_digit_round_is_404_not_500(net: LocalNet) -> None:
    params = flat_parameters(net["sender"].role.replica.module)
    size, chunks = encode_safetensors(params)
    headers = signed(net, url=url(net, "/diloco/params/0"), round=0, body=chunks)
    target = "/diloco/params/" + "9" * 5000  # (too long to sign; before the fix no route was signed)

    with pytest.raises(RemoteError) as refused:
        await net.http_client.put_body(url(net, target), size, chunks, extra_headers=headers)

    assert refused.value.status == 404


async def test_a_body_larger_than_the_model_is_refused_before_it_is_read(net: LocalNet) -> None:
    params = {**flat_parameters(net["sender"].role.replica.module), "padding": torch.zeros(4 << 20)}
    size, chunks = encode_safetensors(params)
    headers = signed(net, url=url(net, "/diloco/params/0"), round=0, body=chunks)

    with pytest.raises(RemoteError) as refused:
        await net.http_client.put_body(url(net, "/diloco/params/0"), size, chunks, extra_headers=headers)

    assert refused.value.status == 413
    assert net["victim"].http.budget.peak_bytes == 0
