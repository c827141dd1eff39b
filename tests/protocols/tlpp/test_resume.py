"""The TL++ orchestrator stopped mid-run (Ctrl+C: its roles write their checkpoints) and started
again with the same identity and checkpoint folder, its data nodes still up, goes on from the step
it stopped at (model, Adam state, step and schedule position taken back) and finishes with the very
parameters of a run that was never stopped; and with ``checkpoint_every`` it writes its state
every N steps while it trains."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from gossamer.crypto.identity import Identity
from gossamer.protocols.tlpp.orchestrator import TlppOrchestratorRole
from tests.protocols.tlpp.harness import Tlpp

pytestmark = pytest.mark.timeout(180)
STEPS = 8
SOURCES = [f"builtin:digits:shard={i}/3" for i in range(3)]
HYPER = {"mode": "base", "batch_size": 24, "optimizer": "adam", "lr": 0.01, "steps": STEPS, "eval_every": 0,
         "min_nodes": 3, "node_timeout_s": 10.0}


def identities() -> dict[str, Identity]:
    return {name: Identity.generate() for name in ["node0", "node1", "node2", "orchestrator"]}


async def train_to_the_end(role: TlppOrchestratorRole) -> None:
    await role.start()
    await asyncio.wait_for(role.done.wait(), timeout=120)
    assert role.finished and not role.error and role.step == STEPS


def saved_step(role: TlppOrchestratorRole) -> str | None:
    """The ``step`` of the state file the orchestrator wrote last (None: none yet)."""
    found = role.checkpoints.read(role._state_name(), kind="state")
    return None if found is None else found[1]["step"]


async def restart_orchestrator(net: Tlpp, **config: Any) -> TlppOrchestratorRole:
    """The orchestrator's process again: same identity, same checkpoint folder, new servers
    (``config``: its PeerConfig fields)."""
    await net.kill("orchestrator")  # already stopped, or never started
    net.forget("orchestrator")
    del net.peers["orchestrator"]
    await net.add("orchestrator", ("orchestrator", "tlpp-orchestrator"), identity=net.identities["orchestrator"], **config)
    return net.orchestrator


async def test_a_stopped_orchestrator_resumes_from_its_step_and_ends_where_an_unstopped_one_does(
        tmp_path: Path) -> None:
    ids = identities()
    straight = await Tlpp.create(tmp_path / "straight", hyper=HYPER, sources=SOURCES, helper=False, identities=ids)
    try:
        await train_to_the_end(straight.orchestrator)
        want = {name: t.detach().clone() for name, t in straight.orchestrator.model.state_dict().items()}
    finally:
        await straight.aclose()

    net = await Tlpp.create(tmp_path / "stopped", hyper=HYPER, sources=SOURCES, helper=False, identities=ids)
    try:
        two_steps = asyncio.Event()
        net.watchers.append(lambda peer, event, fields: two_steps.set()
                            if event == "tlpp.step" and fields["step"] >= 1 else None)
        first_life = net.orchestrator
        await first_life.start()
        await asyncio.wait_for(two_steps.wait(), timeout=120)
        written = await net.stop("orchestrator")
        stopped_at = first_life.step
        assert not first_life.finished and 2 <= stopped_at < STEPS, stopped_at
        assert written["tlpp-orchestrator"].endswith("-tlpp-state.safetensors")

        second_life = await restart_orchestrator(net)
        assert second_life.resumed_from == written["tlpp-orchestrator"]
        assert (second_life.step, second_life.position) == (stopped_at, (0, stopped_at))
        assert second_life.driver.version == first_life.driver.version
        await train_to_the_end(second_life)
    finally:
        await net.aclose()
    assert [ledger.step for ledger in second_life.history] == list(range(stopped_at, STEPS))  # none twice
    got = second_life.model.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[name], got[name]) for name in want)


async def test_the_orchestrator_writes_its_state_every_checkpoint_every_steps(tmp_path: Path) -> None:
    net = await Tlpp.create(tmp_path, hyper={**HYPER, "steps": 5}, sources=SOURCES, helper=False)
    await restart_orchestrator(net, checkpoint_every=2)  # not started yet: a first life with the option
    seen: list[str | None] = []  # the state file's step as each step's event goes out (before that step's write)

    def on_event(peer: str, event: str, fields: Mapping[str, Any]) -> None:
        if event == "tlpp.step":
            seen.append(saved_step(net.orchestrator))

    net.watchers.append(on_event)
    try:
        await net.orchestrator.start()
        await asyncio.wait_for(net.orchestrator.done.wait(), timeout=120)
        assert net.orchestrator.finished
        assert seen == [None, None, "2", "2", "4"]  # steps 1..5 done: written after steps 2 and 4
        assert saved_step(net.orchestrator) == "4"  # the end writes the model (its own file), not the state
    finally:
        await net.aclose()
