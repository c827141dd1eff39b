"""hivemind's ``DecentralizedAverager`` rows of the transport benchmark: two peers average the
same-size tensor; each repetition times ``averager.step()``, matchmaking included."""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.connection import Connection
from typing import Any

import torch
from _common import BenchError, command_loop, make_tensor

LOCALHOST = "/ip4/127.0.0.1/tcp/0"


def _expected_mean(size_bytes: int, seed: int) -> torch.Tensor:
    return (make_tensor(size_bytes, seed) + make_tensor(size_bytes, seed + 1)) / 2


def _check_mean(averager: Any, size_bytes: int, seed: int) -> float:
    expected = _expected_mean(size_bytes, seed)
    with averager.get_tensors() as tensors:
        error = float((tensors[0] - expected).abs().max())
    if error > 1e-6:
        raise BenchError(f"hivemind averaged tensor is off the exact mean by up to {error}")
    return error


def peer(conn: Connection, params: dict[str, Any]) -> None:
    """One averaging peer: the first one starts the DHT swarm, the second joins it. Its averager has
    ``target_group_size=2`` and no compression (hivemind 1.1.12's 8-bit compression fails under
    NumPy 2); peer *i* starts from ``make_tensor(size, seed + i)`` and after the warm-up step checks
    that its tensor is exactly the mean of both, since hivemind 1.1.12 can report success after
    averaging only part of a tensor."""
    from hivemind import DHT

    # A spawned worker defaults to "spawn", but the averager is a plain mp.Process holding pipes and
    # weakrefs that cannot be pickled: hivemind needs its usual "fork" here.
    multiprocessing.set_start_method("fork", force=True)
    initial = params["peers"][0]["maddrs"] if params["peers"] else None
    dht = DHT(initial_peers=initial, start=True, host_maddrs=[LOCALHOST])
    try:
        _average(conn, params, dht)
    finally:
        dht.shutdown()
    conn.send(("done", {}))


def _average(conn: Connection, params: dict[str, Any], dht: Any) -> None:
    from hivemind.averaging import DecentralizedAverager
    from hivemind.compression import NoCompression

    size_bytes, seed = params["size_bytes"], params["seed"]
    averager = DecentralizedAverager(
        [make_tensor(size_bytes, seed + len(params["peers"]))], dht, start=True, prefix="gossamer_bench",
        target_group_size=2, min_group_size=2, min_matchmaking_time=params["min_matchmaking_time_s"],
        request_timeout=params["request_timeout_s"], compression=NoCompression())
    try:
        conn.send(("ready", {"maddrs": [str(maddr) for maddr in dht.get_visible_maddrs()]}))

        def on_go(index: int) -> dict[str, Any]:
            start = time.perf_counter()
            group = averager.step(timeout=params["step_timeout_s"])
            seconds = time.perf_counter() - start
            if group is None or len(group) != 2:
                raise BenchError(f"hivemind step {index} failed or ran without the other peer: {group!r}")
            error = _check_mean(averager, size_bytes, seed) if index == 0 else None
            return {"seconds": seconds, "group_size": len(group), "max_abs_error": error}

        command_loop(conn, on_go)
    finally:
        averager.shutdown()
