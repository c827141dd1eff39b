"""One case of BlockTrain's fault matrix on a ``LocalNet``: four block workers w0..w3 (two a block),
the block coordinator (its lives c0, c1, ..., each crash restarted on the same identity and
checkpoint folder) and two block servers h0, h1 holding both blocks, trained to ``versions`` with
fixed pacing, then two client passes. A fault is ``(kind, peer, version)``; what each kind does to
each role: ``docs/RELIABILITY.md``, "Faults survived: BlockTrain workers, hosts and the coordinator"."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gossamer.crypto.identity import Identity
from gossamer.peer.route.client import RemoteRoute, RouteFailed, hosts_from_view
from gossamer.peer.route.pool import HopPool
from gossamer.protocols.blocktrain import names
from gossamer.protocols.blocktrain.client import BlockTrainClient
from gossamer.protocols.blocktrain.coordinator import BlockCoordinatorRole
from gossamer.protocols.blocktrain.core import BlockTrainConfig, build_stack, denoise_pass
from gossamer.protocols.blocktrain.host import METHOD
from gossamer.protocols.blocktrain.server import BlockServerRole
from gossamer.protocols.blocktrain.worker import BlockWorkerRole
from gossamer_harness.blocktrain.recheck import VersionStates
from gossamer_harness.localnet import LocalNet

Fault = tuple[str, str, int]  # (kind, peer, version)
KINDS = {"worker": ("crash_before", "crash_mid_send", "slow_send", "hang"),
         "coordinator": ("crash_before", "crash_mid_send", "crash_mid_aggregate", "slow_send", "hang"),
         "host": ("crash_before", "crash_mid_send", "slow_send", "hang")}
CRASHES = ("crash_before", "crash_mid_send", "crash_mid_aggregate")
PASS_FAULTS = ("crash_mid_send", "slow_send", "hang")  # a host's, at the passes after training
WORKERS, HOSTS, NUM_BLOCKS = 4, 2, 2
MODEL = {"d_model": 16, "n_heads": 2, "context": 16, "num_blocks": NUM_BLOCKS}
POLL_S = 0.05  # how often a wait looks at the roles' state (a kill emits no event; the bound is ``timeout_s``)


@dataclass(frozen=True, kw_only=True)
class CaseConfig:
    """One case's run and fault sizes (times in seconds)."""

    data: Path  # the text the workers train on
    versions: int = 3  # every block is trained to this version
    deadline_s: float = 3.0  # a version waits at most this long (fixed pacing)
    slow_s: float = 1.0  # a slow send, inside the deadline and the route budget
    hang_s: float = 4.5  # a hang, past the deadline and the route budget
    route_timeout_s: float = 2.0  # the client's budget for one route
    slack_s: float = 2.0  # the event loop's own latency past a deadline (a busy machine)
    timeout_s: float = 240.0  # the whole case


def role_of(peer: str) -> str:
    return "coordinator" if peer == "c" else "worker" if peer.startswith("w") else "host"


def run_doc(config: CaseConfig) -> dict[str, Any]:
    return {"run": {"name": "bt-faults", "protocol": "blocktrain", "heartbeat_s": 30.0}, "model": MODEL,
            "hyper": {"versions": config.versions, "local_steps": 2, "batch_size": 4, "deadline_s": config.deadline_s,
                      "pacing": "fixed", "eval_batches": 0, "sample_bytes": 0, "min_workers": WORKERS,
                      "route_timeout_s": config.route_timeout_s}}


class Case:
    """The net of one case, its faults and what it observed. Crashed workers and hosts lose their
    records at once (a short TTL); h0 has the lower peer id, so a client's route takes it first."""

    def __init__(self, net: LocalNet, faults: list[Fault], config: CaseConfig) -> None:
        self.net, self.faults, self.config = net, faults, config
        self.states = VersionStates()
        self.lives: list[str] = []
        self.pool = HopPool()
        self.passes: list[tuple[str, float]] = []  # ("equal" | "differs" | "route failed: ...", seconds)
        net.watchers.append(self.states)

    @property
    def coordinator(self) -> BlockCoordinatorRole:
        return self.net[self.lives[-1]].role_named(names.COORDINATOR)  # type: ignore[return-value]

    def workers(self) -> dict[str, BlockWorkerRole]:
        return {f"w{i}": self.net[f"w{i}"].role for i in range(WORKERS)}  # type: ignore[misc]

    def servers(self) -> dict[str, BlockServerRole]:
        return {f"h{i}": self.net[f"h{i}"].role for i in range(HOSTS)}  # type: ignore[misc]

    async def build(self) -> None:
        await self._new_life()
        for i in range(WORKERS):
            await self.net.add(f"w{i}", (names.WORKER,), data=str(self.config.data))
        for i, identity in enumerate(sorted((Identity.generate() for _ in range(HOSTS)), key=lambda x: x.peer_id)):
            await self.net.add(f"h{i}", (names.SERVER,), identity=identity,
                               role_options={names.SERVER: {"refresh_s": 0.2}})
        for fault in self.faults:
            if role_of(fault[1]) != "coordinator":
                self._declare(fault, fault[1])

    async def _new_life(self) -> str:
        """Start a coordinator life (after the last one died), with the faults not yet fired."""
        name = f"c{len(self.lives)}"
        peer = await self.net.add(name, (names.COORDINATOR,), data=str(self.config.data),
                                  checkpoint_dir=self.net.workdir / "checkpoints")
        self.states.watch(name, peer.role_named(names.COORDINATOR))  # type: ignore[arg-type]
        for fault in self.faults:
            if role_of(fault[1]) == "coordinator" and not self.fired(fault):
                self._declare(fault, name)
        self.lives.append(name)
        return name

    def fired(self, fault: Fault) -> bool:
        """Whether a crash fault has fired on any life of its peer (a slow one: never counted)."""
        kind, peer, version = fault
        op = self._op(kind, peer)
        owners = self.lives if peer == "c" else [peer]
        step = self.config.versions if (role_of(peer) == "host" and kind in PASS_FAULTS) else version
        return kind in CRASHES and any(self.net.faults.plan.crash.get((n, step, op), 0) < 0 for n in owners)

    def _op(self, kind: str, peer: str) -> str:
        ops = {"worker": {"crash_before": "train", "crash_mid_send": "update", "slow_send": "update",
                          "hang": "update"},
               "coordinator": {"crash_before": "open", "crash_mid_send": "publish",
                               "crash_mid_aggregate": "aggregate", "slow_send": "publish", "hang": "aggregate"},
               "host": {"crash_before": "load", "crash_mid_send": "pass", "slow_send": "pass", "hang": "pass"}}
        return ops[role_of(peer)][kind]

    def _declare(self, fault: Fault, name: str) -> None:
        kind, peer, version = fault
        op, role = self._op(kind, peer), role_of(peer)
        step = self.config.versions if (role == "host" and kind in PASS_FAULTS) else version
        if kind in CRASHES:
            self.net.crash(name, step, op, expire=role != "coordinator")
        else:
            self.net.slow(name, self.config.slow_s if kind == "slow_send" else self.config.hang_s, op=op, step=step)

    async def until(self, predicate, what: str) -> None:
        """Wait until ``predicate()`` holds (looked at every ``POLL_S``); TimeoutError naming ``what``."""
        deadline = time.monotonic() + self.config.timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {self.config.timeout_s:.0f} s")
            await asyncio.sleep(POLL_S)

    async def restarts(self) -> None:
        """Start the coordinator again each time it dies, until it finishes the run."""
        while True:
            await self.until(lambda: self.coordinator.finished or not self.net[self.lives[-1]].alive,
                             "the coordinator finished or died")
            if self.coordinator.finished:
                return
            await self.net.start(await self._new_life())

    async def train(self) -> None:
        await self.net.start()
        restarting = asyncio.create_task(self.restarts(), name="coordinator-restarts")
        try:
            await self.until(lambda: self.coordinator.finished or restarting.done(), "the run finished")
            if restarting.done():
                restarting.result()  # a restart that failed raises here
        finally:
            restarting.cancel()
            await asyncio.gather(restarting, return_exceptions=True)
        final = dict.fromkeys(range(NUM_BLOCKS), self.config.versions)
        await self.until(lambda: all(s.versions == final for n, s in self.servers().items() if self.net[n].alive),
                         "the live servers serve the final versions")

    async def client_passes(self) -> None:
        """Two passes through the servers, each compared bit for bit with the protocol's pass over
        the coordinator's final blocks (or the reason the route failed)."""
        net, model = self.net, BlockTrainConfig(**MODEL)
        route = RemoteRoute(method=METHOD, run_id=net.manifest.run_id, order=list(range(NUM_BLOCKS))[::-1],
                            hosts=self._hosts, pool=self.pool, budget_s=self.config.route_timeout_s)
        client = BlockTrainClient(route, model, self.coordinator.board.embedding, device=torch.device("cpu"))
        stack = build_stack(model, seed=0, device="cpu")
        for k in range(NUM_BLOCKS):
            stack.load_block_state(k, self.states.copies[k, self.config.versions][0].block)
        stack.load_embedding_state(self.coordinator.board.embedding)
        for seed in (1, 2):
            context = torch.randint(0, 256, (2, MODEL["context"]), generator=torch.Generator().manual_seed(seed))
            started = time.monotonic()
            try:
                remote = await client.denoise_pass(context, generator=torch.Generator().manual_seed(seed))
                local = denoise_pass(stack, context, generator=torch.Generator().manual_seed(seed))
                outcome = "equal" if torch.equal(remote, local) else "differs"
            except RouteFailed as exc:
                outcome = f"route failed: {exc}"
            self.passes.append((outcome, time.monotonic() - started))

    async def _hosts(self, refresh: bool):
        return hosts_from_view(self.net.view, now=self.net.now(), role=names.SERVER, key="blocks")

    async def aclose(self) -> None:
        await self.pool.aclose()
