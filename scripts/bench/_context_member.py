"""One ring member of the context-parallel benchmark (``context.py``), as its own process: a
``TcpServer`` behind a ``WanProxy``, connections of each link kind to every other member, and one
training step of one arm per "go" (``MemberNode``)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
from _common import BenchError, async_command_loop

from gossamer.protocols.context.core import (
    FORWARD,
    MessageRefused,
    RingMember,
    SubspaceConfig,
    build_context_model,
    decode_message,
    encode_message,
    forward_to,
    message_plan,
    ring_spec,
    split_chunks,
)
from gossamer.protocols.context.core.wire import MessageSpec
from gossamer.protocols.core.models import BatchSampler, ModelConfig, load_text, split_text
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import ConnectionInfo, HandlerError, TcpConnection, TcpServer, tcp_connect
from gossamer_harness.wan import LinkProfile, WanProxy

log = logging.getLogger(__name__)
LINKS = ("wan", "direct")
MODES = {"wan": "wan", "direct": "direct", "link-only": "wan"}
"""Each mode and the link kind its frames take."""


@dataclass(frozen=True)
class Arm:
    """One row: a coding and a mode."""

    label: str
    subspace: SubspaceConfig
    mode: str

    @property
    def link(self) -> str:
        return MODES[self.mode]


def arm_of(params: dict[str, Any], index: int) -> Arm:
    """Repetition ``index`` runs combination ``index % n`` of (coding, mode), codings outermost."""
    combos = [(sub, mode) for sub in params["arms"] for mode in MODES]
    sub, mode = combos[index % len(combos)]
    subspace = SubspaceConfig.from_dict(sub)
    return Arm(subspace.label(), subspace, mode)


def training_batch(params: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The same [batch, context] windows of ``builtin:pydoc`` in every member (seeded)."""
    split = split_text(load_text("builtin:pydoc"))
    sampler = BatchSampler(split.train, batch_size=params["batch_size"], context=params["model"]["context"],
                           generator=torch.Generator().manual_seed(params["seed"]))
    return sampler.sample("cpu")


class MemberNode:
    """The member's server side, links and per-step inboxes. A "go" is one training step (forward
    and backward, no optimizer step) of one arm in one mode: "wan" and "direct" compute it over that
    link kind; "link-only" sends the frames of its last computed step of that arm again over the
    wan link in the ring's dependency order (``message_plan``) without compute. An arriving frame is
    checked for the step it names (``decode_message``), a kv frame passed on to the successor at
    once (``forward_to``) and queued; compute runs in a worker thread, one ``RingMember.step`` at a
    time, so the loop keeps receiving and forwarding. Per step it reports its start and end
    (``time.monotonic``, one clock for the machine), compute and idle seconds, payload bytes sent."""

    def __init__(self, params: dict[str, Any], device: torch.device) -> None:
        self.params = params
        self.index, self.chunks = params["index"], params["chunks"]
        self.timeout_s = params["step_timeout_s"]
        config = ModelConfig.from_dict(params["model"])
        self.models = {SubspaceConfig.from_dict(sub).label(): build_context_model(
            config, SubspaceConfig.from_dict(sub), seed=params["seed"], device=device) for sub in params["arms"]}
        tokens, targets = training_batch(params)
        self.tokens, self.targets = split_chunks(tokens, targets, self.chunks)[self.index]
        self.links: dict[str, dict[int, TcpConnection]] = {link: {} for link in LINKS}
        self.inboxes: dict[int, asyncio.Queue] = {}
        self.step = -1
        self.sends: set[asyncio.Task[None]] = set()
        self.sent_bytes: dict[str, int] = {}
        self.recorded: dict[str, dict[tuple, tuple[dict[str, Any], list[Any]]]] = {}
        self.refused = 0

    def spec(self, step: int) -> MessageSpec:
        model = self.models[arm_of(self.params, step).label]
        return ring_spec(model, step=step, chunks=self.chunks, batch=self.tokens.shape[0],
                         tokens=self.tokens.shape[1])

    def inbox(self, step: int) -> asyncio.Queue:
        if step not in self.inboxes:
            layers = len(next(iter(self.models.values())).blocks)
            self.inboxes[step] = asyncio.Queue(maxsize=2 * layers * self.chunks)
        return self.inboxes[step]

    async def handle(self, frame: Frame, info: ConnectionInfo) -> None:
        step = frame.header.get("step")
        if not isinstance(step, int) or not self.step <= step <= self.step + 1:
            self.refused += 1
            raise HandlerError(f"step {step!r} is neither this member's ({self.step}) nor the next")
        try:
            message = decode_message(frame.header, frame.payload, self.spec(step))
        except MessageRefused as refused:
            self.refused += 1
            raise HandlerError(str(refused)) from refused
        onward = forward_to(self.index, self.chunks) if message.kind == FORWARD else None
        if onward is not None:
            self.send(arm_of(self.params, step).link, onward, frame.header, frame.payload)
        await asyncio.wait_for(self.inbox(step).put(message), self.timeout_s)

    def send(self, link: str, target: int, header: dict[str, Any], payload: Any) -> None:
        kind = header["kind"]
        size = sum(memoryview(part).nbytes for part in (payload if isinstance(payload, list) else [payload]))
        self.sent_bytes[kind] = self.sent_bytes.get(kind, 0) + size
        frame = Frame(FrameType.ONEWAY, header, payload)
        task = asyncio.create_task(self.links[link][target].send(frame, timeout_s=self.timeout_s))
        self.sends.add(task)
        task.add_done_callback(self.sends.discard)

    async def connect(self, readies: list[dict[str, Any]]) -> None:
        for other, ready in enumerate(readies):
            if other != self.index:
                for link in LINKS:
                    self.links[link][other] = await tcp_connect(*ready[link])

    async def run_step(self, step: int) -> dict[str, Any]:
        arm = arm_of(self.params, step)
        self.step, self.sent_bytes = step, {}
        for stale in [s for s in self.inboxes if s < step]:
            del self.inboxes[stale]
        model = self.models[arm.label]
        start = time.monotonic()
        loss = None
        if arm.mode == "link-only":
            compute_s, wait_s = 0.0, await self._replay(step, arm, len(model.blocks))
        else:
            member = RingMember(model, index=self.index, chunks=self.chunks, step=step, tokens=self.tokens,
                                targets=self.targets)
            compute_s, wait_s = await self._drive(member, arm)
            loss = float(member.loss)
        if self.sends:
            await asyncio.wait_for(asyncio.gather(*self.sends), self.timeout_s)
        end = time.monotonic()
        return {"arm": arm.label, "mode": arm.mode, "start": start, "end": end, "compute_s": compute_s,
                "wait_s": wait_s, "loss": loss, "sent_bytes": dict(self.sent_bytes)}

    async def _drive(self, member: RingMember, arm: Arm) -> tuple[float, float]:
        inbox = self.inbox(member.step_number)
        mixtures = member.spec.mixtures
        recorded = self.recorded[arm.label] = {}
        compute_s = wait_s = 0.0
        while not member.done:
            while not inbox.empty():
                member.deliver(inbox.get_nowait())
            began = time.perf_counter()
            sends = await asyncio.to_thread(member.step)
            compute_s += time.perf_counter() - began
            if sends is None:
                began = time.perf_counter()
                try:
                    message = await asyncio.wait_for(inbox.get(), self.timeout_s)
                except TimeoutError:
                    raise BenchError(f"member {self.index} waited {self.timeout_s} s for "
                                     f"{member.waiting_for}") from None
                wait_s += time.perf_counter() - began
                member.deliver(message)
                continue
            for send in sends:
                header, payload = encode_message(send.message, mixtures=mixtures)
                recorded[send.to, send.message.key] = (header, payload)
                self.send(arm.link, send.to, header, payload)
        return compute_s, wait_s

    async def _replay(self, step: int, arm: Arm, layers: int) -> float:
        """Send this member's recorded frames of ``arm`` once what each depends on has arrived;
        return the seconds until every message for this member has arrived too."""
        plan = message_plan(self.chunks, layers)
        expected = {(p.target, *p.key) for p in plan if p.target == self.index}
        own = [p for p in plan if p.source == self.index and p.source in (p.key[2], p.key[3])]
        recorded = self.recorded[arm.label]
        inbox, delivered = self.inbox(step), set()
        began = time.perf_counter()
        while own or delivered != expected:
            for planned in [p for p in own if set(p.after) <= delivered]:
                own.remove(planned)
                header, payload = recorded[planned.target, planned.key]
                self.send(arm.link, planned.target, {**header, "step": step}, payload)
            if delivered != expected:
                message = await asyncio.wait_for(inbox.get(), self.timeout_s)
                delivered.add((self.index, *message.key))
        return time.perf_counter() - began

    async def aclose(self) -> None:
        for task in list(self.sends):
            task.cancel()
        for links in self.links.values():
            for connection in links.values():
                await connection.aclose()


async def _main(conn: Connection, params: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    device = torch.device(params["device"])
    node = MemberNode(params, device)
    profile = LinkProfile.from_mbit(params["mbit_per_s"], params["latency_ms"])
    server = await TcpServer.create(node.handle)
    proxy = await WanProxy.create(*server.address, up=profile)
    try:
        conn.send(("ready", {"direct": server.address, "wan": proxy.address}))
        command, readies = await asyncio.to_thread(conn.recv)
        if command != "peers":
            raise BenchError(f"member {node.index}: expected the peers' addresses, got {command!r}")
        await node.connect(readies)
        conn.send(("connected", None))
        await async_command_loop(conn, node.run_step)
    finally:
        await node.aclose()
        await proxy.aclose()
        await server.aclose()
    conn.send(("done", {"refused": node.refused, "proxy_up_bytes": proxy.stats.up.bytes_forwarded}))


def member_worker(conn: Connection, params: dict[str, Any]) -> None:
    """Process entry point: one ring member until the coordinator says stop."""
    asyncio.run(_main(conn, params))
