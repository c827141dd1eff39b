"""Block-server and AR-stage route methods attacked over real TCP: finite but absurd inputs (z = 1e38,
x = 1e20) overflow inside the units, and the host that computed NaN refuses the frame itself
rather than serving it on (the next, honest hop would refuse it and be routed around); through a
daemon's TCP server, oversized route frames, a payload on ``blocktrain.embedding`` and unknown
methods with a payload are refused before the payload is read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gossamer.peer.route.pool import HopPool
from gossamer.peer.route.wire import FailedHop, Hop, parse_answer, request_frame
from gossamer.protocols.blocktrain.ar_stage import build_stages, matched_model_config
from gossamer.protocols.blocktrain.core import BlockTrainConfig, initial_noise
from gossamer.protocols.blocktrain.host import EMBEDDING_METHOD, METHOD, max_route_payload_bytes
from gossamer.protocols.registry import PLUGINS
from gossamer.transport.errors import RemoteError
from gossamer.transport.frames import FrameType
from gossamer.transport.tcp import tcp_connect
from gossamer_harness.localnet import LocalNet
from tests.protocols.blocktrain.test_host import CONFIG, MODEL, Hosts
from tests.transport.support import RawClient, frame_head


def pass_inputs(z_value: float | None = None) -> dict[str, torch.Tensor]:
    z = initial_noise(CONFIG, (1, 8), generator=torch.Generator().manual_seed(0), device="cpu")
    return {"z": z if z_value is None else torch.full_like(z, z_value), "context": torch.zeros(1, 8, dtype=torch.long)}


async def test_absurd_inputs_are_refused_by_the_host_that_overflows_not_blamed_on_the_next(hosts: Hosts) -> None:
    await hosts.add_blocks("h2", (2,))
    await hosts.add_blocks("h1", (1,))
    route = (Hop(hosts.addr("h2"), (2,)), Hop(hosts.addr("h1"), (1,)))
    pool = HopPool()
    try:
        absurd = parse_answer(await pool.call(METHOD, run_id=hosts.manifest.run_id, request_id="a", budget_s=10.0,
                                              route=route, tensors=pass_inputs(1e38)))
        honest = parse_answer(await pool.call(METHOD, run_id=hosts.manifest.run_id, request_id="h", budget_s=10.0,
                                              route=route, tensors=pass_inputs()))
    finally:
        await pool.aclose()

    assert isinstance(absurd, FailedHop) and absurd.addr == hosts.addr("h2") and "NaN or Inf" in absurd.reason
    assert (hosts.host("h1").served, hosts.host("h1").refused) == (1, 0)  # only the honest pass reached h1
    assert isinstance(honest, dict) and bool(torch.isfinite(honest["z"]).all())


async def test_an_ar_stage_refuses_inputs_that_overflow_instead_of_answering_nan_logits(hosts: Hosts) -> None:
    stages = build_stages(matched_model_config(CONFIG), (1, 2), 3, seed=5, device=torch.device("cpu"))
    await hosts.add_stages("s12", (1, 2), stages)
    connection = await tcp_connect("127.0.0.1", hosts.servers["s12"][2].address[1])
    try:
        frame = request_frame("ar.forward", run_id=hosts.manifest.run_id, request_id="a", budget_s=10.0,
                              route=(Hop(hosts.addr("s12"), (1, 2)),), tensors={"x": torch.full((1, 8, 16), 1e20)})
        with pytest.raises(RemoteError, match="NaN or Inf"):
            await connection.request(frame)
        honest = request_frame("ar.forward", run_id=hosts.manifest.run_id, request_id="h", budget_s=10.0,
                               route=(Hop(hosts.addr("s12"), (1, 2)),), tensors={"x": torch.randn(1, 8, 16)})
        logits = parse_answer(await connection.request(honest))
    finally:
        await connection.aclose()

    assert isinstance(logits, dict) and logits["logits"].shape == (1, 256)
    assert (hosts.host("s12").served, hosts.host("s12").refused) == (1, 1)


@pytest.mark.parametrize(("method", "size", "message"), [
    (METHOD, None, "exceeds this method's cap"),
    (EMBEDDING_METHOD, 1, "exceeds this method's cap of 0"),
    ("no.such.method", 1 << 30, "unknown method"),
])
async def test_a_daemons_tcp_server_refuses_oversized_route_frames_before_reading_them(
        tmp_path: Path, method: str, size: int | None, message: str) -> None:
    run = {"run": {"name": "bt", "protocol": "blocktrain", "heartbeat_s": 30.0}, "model": MODEL,
           "hyper": {"max_batch": 4}}
    net = await LocalNet.create(run, plugins=PLUGINS, workdir=tmp_path)
    try:
        peer = await net.add("server", ("block-server",))  # not started: the gate needs no blocks
        cap = max_route_payload_bytes(BlockTrainConfig(**MODEL), 4)
        raw = await RawClient.connect(peer.tcp.address)
        try:
            await raw.send(frame_head({"method": method, "rid": 1}, cap + 1 if size is None else size) + bytes(1000))
            refused = await raw.read_frame()
            leftover = await raw.read_until_eof()
        finally:
            await raw.aclose()
        connection = await tcp_connect("127.0.0.1", peer.tcp.address[1])
        try:
            with pytest.raises(RemoteError, match="still loading its blocks"):  # passed the gate, reached the role
                await connection.request(request_frame(METHOD, run_id=net.manifest.run_id, request_id="h",
                                                       budget_s=5.0, route=(Hop("x:1", (2,)),),
                                                       tensors=pass_inputs()))
        finally:
            await connection.aclose()
    finally:
        await net.aclose()

    assert refused.type is FrameType.ERROR and refused.header["code"] == "refused" and leftover == b""
    assert message in refused.header["message"]
    assert peer.tcp.budget.peak_bytes == CONFIG.d_model * 8 * 4 + 8 * 8  # only the honest frame was held
