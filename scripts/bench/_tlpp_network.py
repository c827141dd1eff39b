"""The whole TL++ step over two in-process networks (``gossamer_harness.localnet``: the real roles,
each behind its own TcpServer, every request over an encrypted link), and where its time goes:
request phases, the ping round trip, a cProfile of the event-loop thread."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import BenchError
from torch import Tensor

from gossamer.crypto.identity import Identity
from gossamer.peer.kit.secure_link import LinkMessage, SecureLinks
from gossamer.protocols.registry import PLUGINS
from gossamer.protocols.tlpp.core import VirtualBatch, VirtualBatchScheduler
from gossamer.protocols.tlpp.data import NodeData
from gossamer.protocols.tlpp.orchestrator import TlppOrchestratorRole
from gossamer.protocols.tlpp.settings import TlppSettings
from gossamer.protocols.tlpp.wire import HELPER_METHOD, PING
from gossamer_harness.localnet import LocalNet

_ROOT = Path(__file__).resolve().parents[2]

MODES = ("base", "secure")
NUM_NODES = 3
PROFILE_ROWS = 12


class RequestLog:
    """Start and end of every request a set of ``SecureLinks`` sends, by label ("forward", "logits",
    "share:act", ...), relative to ``start``; installed by wrapping each instance's ``request``."""

    def __init__(self, links: dict[str, SecureLinks]) -> None:
        self.spans: list[tuple[str, float, float]] = []
        self.start = time.perf_counter()
        for links_of in links.values():
            links_of.request = self._wrap(links_of.request)  # type: ignore[method-assign]

    def _wrap(self, request: Callable[..., Any]) -> Callable[..., Any]:
        async def timed(peer_id: str, method: str, message: LinkMessage, **kwargs: Any) -> LinkMessage:
            label = message.op + (f":{message.fields['kind']}" if "kind" in message.fields else "")
            began = time.perf_counter()
            try:
                return await request(peer_id, method, message, **kwargs)
            finally:
                self.spans.append((label, began - self.start, time.perf_counter() - self.start))
        return timed

    def restart(self) -> None:
        self.spans, self.start = [], time.perf_counter()

    def phases(self, whole_s: float) -> dict[str, float]:
        """Wall time of each label (first start to last end); "orchestrator_local" is the step time
        outside the orchestrator's own requests (server side, reconstruction, optimizer)."""
        walls = {}
        for label in {lb for lb, _, _ in self.spans}:
            mine = [(began, ended) for lb, began, ended in self.spans if lb == label]
            walls[label] = max(ended for _, ended in mine) - min(began for began, _ in mine)
        own = sum(v for k, v in walls.items() if not k.startswith("share"))
        return {**walls, "orchestrator_local": whole_s - own}


def node_data(net: LocalNet) -> dict[str, NodeData]:
    """Each node's samples by peer id, as its role loaded them."""
    return {net[f"node{i}"].peer_id: net.peers[f"node{i}"].role.data  # type: ignore[attr-defined]
            for i in range(NUM_NODES)}


def batch_inputs(net: LocalNet, batch: VirtualBatch, device: torch.device) -> tuple[dict[str, Tensor], ...]:
    """Each node's images and labels of ``batch``, read from the node roles' own data."""
    data, plan = node_data(net), batch.by_node()
    return ({n: data[n].x[idx].to(device) for n, idx in plan.items()},
            {n: data[n].y[idx].to(device) for n, idx in plan.items()})


def schedule(net: LocalNet, settings: TlppSettings) -> list[VirtualBatch]:
    """Epoch 0's full virtual batches over the network's nodes (the short tail dropped)."""
    counts = {peer_id: len(data) for peer_id, data in node_data(net).items()}
    return VirtualBatchScheduler(counts, batch_size=settings.batch_size, seed=settings.seed,
                                 drop_last=True).epoch(0)


def sent_bytes(net: LocalNet) -> dict[str, int]:
    """TL++ bytes every peer sent so far, by op."""
    by_op: dict[str, int] = defaultdict(int)
    for peer in net.peers.values():
        for kind, size in peer.traffic.sent.items():
            if kind.startswith("tlpp_"):
                by_op[kind.removeprefix("tlpp_")] += size
    return dict(by_op)


def take_requests(net: LocalNet) -> int:
    """Request frames the servers got since the last call (the harness keeps copies: drop them)."""
    count = sum(len(frames) for frames in net.received.values())
    net.received.clear()
    return count


def request_log(net: LocalNet) -> RequestLog:
    """Time the requests of the orchestrator and of every node (the nodes' pushes to the helper)."""
    nodes = {name: peer.role._links  # type: ignore[attr-defined]
             for name, peer in net.peers.items() if name.startswith("node")}
    return RequestLog({"orchestrator": orchestrator(net).links, **nodes})


async def ping_rtt(net: LocalNet, count: int) -> float:
    """Median round trip of a ``ping`` (one node the helper sees) over the orchestrator's encrypted link to the helper."""
    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        await orchestrator(net).links.request(net["helper"].peer_id, HELPER_METHOD,
                                             LinkMessage(PING, orchestrator(net).step, {"nodes": [net["node0"].peer_id]}),
                                             timeout_s=30.0)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


async def network_step(net: LocalNet, batch: VirtualBatch, log: RequestLog) -> dict[str, Any]:
    """One virtual batch through the orchestrator's real step; BenchError unless every node completed."""
    await net.publish()  # fresh records: a long run must not outlive the harness' record expiry
    helper = net["helper"].peer_id if "helper" in net.peers else None
    bytes_before, _ = sent_bytes(net), take_requests(net)
    log.restart()
    start, cpu_start, loop_start = time.perf_counter(), time.process_time(), time.thread_time()
    ledger = await orchestrator(net)._one_step(batch, helper)
    seconds = time.perf_counter() - start
    loop_cpu, cpu = time.thread_time() - loop_start, time.process_time() - cpu_start
    if not ledger.applied or ledger.rejected or len(ledger.used) != NUM_NODES:
        raise BenchError(f"{ledger.mode} step {ledger.step} did not complete: {ledger.to_json()}")
    bytes_after = sent_bytes(net)
    by_op = {op: size - bytes_before.get(op, 0) for op, size in sorted(bytes_after.items())
             if size != bytes_before.get(op, 0)}
    return {"seconds": seconds, "bytes": sum(by_op.values()), "bytes_by_op": by_op,
            "requests": take_requests(net), "loss": ledger.loss, "phases": log.phases(seconds),
            "loop_cpu_s": loop_cpu, "worker_cpu_s": cpu - loop_cpu}


async def profile_loop(net: LocalNet, batches: list[VirtualBatch], log: RequestLog, steps: int) -> dict[str, Any]:
    """cProfile of the event-loop thread over ``steps`` steps (every party's request handling, codec
    and AEAD run there; the nodes' and the base server's model math run in worker threads, unseen):
    self CPU per step grouped by gossamer module, "asyncio", or builtin. The profiler inflates small
    Python calls; compare the shares, not the milliseconds, with the unprofiled run."""
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    for index in range(steps):
        await network_step(net, batches[index % len(batches)], log)
    profiler.disable()
    groups: dict[str, float] = defaultdict(float)
    for (file, _, name), entry in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        groups[_profile_group(file, name)] += entry[2] / steps
    total = sum(groups.values())
    top = sorted(groups.items(), key=lambda item: -item[1])[:PROFILE_ROWS]
    return {"profiled_loop_cpu_s_per_step": total,
            "top_self": [{"group": group, "cpu_s_per_step": cpu, "share": cpu / total}
                         for group, cpu in top]}


def _profile_group(file: str, name: str) -> str:
    root = _ROOT
    if file == "~":
        return name
    if Path(file).is_relative_to(root):
        return str(Path(file).relative_to(root))
    return "asyncio" if "/asyncio/" in file else "torch (Python)" if "/torch/" in file else "other Python"


async def build_networks(args: argparse.Namespace, tmp: Path) -> dict[str, LocalNet]:
    """The base and the secure network: same identities (so the same schedule), same shards."""
    hyper = {"batch_size": args.batch_size, "optimizer": "adam", "steps": 10_000, "eval_every": 0,
             "min_nodes": NUM_NODES, "node_timeout_s": 30.0, "helper_timeout_s": 30.0, "helper_wait_s": 10.0}
    names = [*(f"node{i}" for i in range(NUM_NODES)), "helper", "orchestrator"]
    ids = {name: Identity.generate() for name in names}
    sources = [f"builtin:digits:shard={i}/{NUM_NODES}" for i in range(NUM_NODES)]
    return {mode: await tlpp_network(tmp / mode, hyper={**hyper, "mode": mode}, sources=sources,
                                     helper=mode == "secure", identities=ids) for mode in MODES}


async def tlpp_network(workdir: Path, *, hyper: dict[str, Any], sources: list[str], helper: bool,
                       identities: dict[str, Identity]) -> LocalNet:
    """A TL++ run in one process: nodes ``node0..`` reading ``sources``, a helper if asked, and the
    orchestrator's server role (not started: the benchmark drives its steps)."""
    doc: dict[str, Any] = {"run": {"name": "bench", "protocol": "tlpp", "heartbeat_s": 30.0}, "hyper": hyper}
    pin: dict[str, Any] = {}
    if helper:  # secure mode: the helper pinned in the manifest and by every node; only these peers admitted
        pin = {"node": {"helper": identities["helper"].peer_id}}
        doc["hyper"] = {**hyper, "helper": identities["helper"].peer_id}
        doc["admission"] = {"policy": "allowlist", "allow": [identities[f"node{i}"].public_key.hex()
                                                             for i in range(len(sources))]
                            + [identities["helper"].public_key.hex()]}
    net = await LocalNet.create(doc, plugins=PLUGINS, workdir=workdir, owner=identities["orchestrator"])
    for i, source in enumerate(sources):
        await net.add(f"node{i}", ("node",), identity=identities[f"node{i}"], data=source, role_options=pin)
    if helper:
        await net.add("helper", ("helper",), identity=identities["helper"])
    await net.add("orchestrator", ("orchestrator", "tlpp-orchestrator"), identity=identities["orchestrator"])
    return net


def orchestrator(net: LocalNet) -> TlppOrchestratorRole:
    return net["orchestrator"].role_named("tlpp-orchestrator")  # type: ignore[return-value]
