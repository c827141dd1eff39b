"""A TL++ host whose whole process stops mid-request (SIGSTOP, a suspended VM), emulated by blocking
the event loop past the request's deadline while the answer is on its way: ``timing.within`` gives
a deadline the process slept through once more, so no helper request stops training and no node is
dropped for it. ``tests/e2e/test_tlpp_hang.py`` stops real processes."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest

from gossamer.protocols.tlpp.timing import STALL_S, within
from tests.protocols.tlpp.harness import Tlpp

pytestmark = pytest.mark.timeout(120)
SOURCES = [f"builtin:digits:shard={i}/3" for i in range(3)]
DEADLINE_S = 2.0
FREEZE_S = DEADLINE_S + 2 * STALL_S  # past the deadline, and late enough to tell from a busy loop
HYPER = {"batch_size": 48, "optimizer": "adam", "lr": 0.01, "eval_every": 0, "min_nodes": 3, "steps": 3,
         "node_timeout_s": DEADLINE_S, "helper_timeout_s": DEADLINE_S, "helper_wait_s": 1.0}


async def test_within_gives_a_deadline_the_process_slept_through_once_more() -> None:
    answer = socket.socketpair()
    for end in answer:
        end.setblocking(False)
    loop = asyncio.get_running_loop()

    async def call() -> bytes:
        return await loop.sock_recv(answer[0], 16)

    def freeze() -> None:
        answer[1].send(b"late")  # the answer arrives while the process does not run
        time.sleep(FREEZE_S)

    loop.call_later(0.1, freeze)
    try:
        assert await within(call(), DEADLINE_S) == b"late"
        with pytest.raises(TimeoutError, match=r"no response within 0\.2 s"):
            await within(asyncio.Event().wait(), 0.2)  # a peer that never answers still times out
    finally:
        for end in answer:
            end.close()


@pytest.mark.parametrize(("mode", "frozen", "phase"), [("secure", "helper", "logits"), ("base", "node2", "forward")])
async def test_a_host_frozen_mid_request_is_not_taken_for_a_failed_peer(tmp_path: Path, mode: str, frozen: str,
                                                                       phase: str) -> None:
    net = await Tlpp.create(tmp_path, hyper={**HYPER, "mode": mode}, sources=SOURCES, helper=mode == "secure")
    injected = net.faults.fault_point
    froze = threading.Event()

    async def fault_point(name: str, at: str, step: int) -> None:
        if (name, at, step) == (frozen, phase, 1):
            froze.set()
            time.sleep(FREEZE_S)  # noqa: ASYNC251 (the point: the whole process stops, the orchestrator's request with it)
        await injected(name, at, step)

    net.faults.fault_point = fault_point  # type: ignore[method-assign]
    try:
        await net.orchestrator.start()
        await net.orchestrator.done.wait()
        ledgers = list(net.orchestrator.history)
        everyone = {net.id_of(f"node{i}") for i in range(3)}

        assert froze.is_set()
        assert net.orchestrator.error == "" and net.orchestrator.finished
        assert [ledger.step for ledger in ledgers] == [0, 1, 2]
        assert all(ledger.applied and set(ledger.used) == everyone for ledger in ledgers), \
            [(ledger.used, ledger.rejected) for ledger in ledgers]
        assert all(not ledger.balance_problems() for ledger in ledgers)
    finally:
        await net.aclose()
