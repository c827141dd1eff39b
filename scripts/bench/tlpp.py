"""TL++ step time, secure vs base mode on the same model and virtual batches, split into compute,
share generation and transfer.

Four measurements in one run, all on one torch thread:

1. **Whole step over the network.** Two in-process TL++ networks (``tests/peer/roles/tlpp/harness.py``):
   the real orchestrator, data node and (secure) helper roles, each node and the helper behind its
   own TcpServer on 127.0.0.1, every request over an encrypted link. Both networks have the same
   identities and data shards, hence the same virtual batches, and the same digits_cnn (cut 3,
   seed 0). A repetition runs the same virtual batch through the orchestrator's own step
   (``TlppServerRole._one_step``: forward, server side, backward, optimizer step; weights go to the
   nodes every step) in each mode, the mode that goes first alternating. Bytes per step are the
   sum of every peer's ``tlpp_*`` sent counters; requests per step are the frames the servers got.
2. **Its split.** The same parties' pure functions on the same batch, run one after the other in
   this thread: *compute* is the model math (forward and backward below and above the cut, the
   affine share ops ``server_logit_share`` / ``server_sum``, the optimizer step); *share
   generation* is every ``share_float`` (masks from ``MaskStream`` plus encoding) and every
   ``reconstruct_float``, timed by wrapping the two names in ``peer.roles.tlpp.secure`` while the party
   functions run. *Transfer* = whole step - compute - share generation: tensor encoding,
   ChaCha20-Poly1305, framing, loopback sockets, the event loop and thread hops. The nodes of the
   network step compute concurrently (``asyncio.gather`` + ``to_thread``), so on a machine with
   idle cores the serial sums overstate their share of the wall time and the residual understates
   transfer.
3. **Share generation vs raw keystream**: ``scripts/bench/sharing.py``'s rows (bulk, one large
   tensor), and the same comparison on exactly the tensors one secure step shares.
4. **Where the network step's time goes**: each request phase's wall time (the orchestrator's and
   the nodes' ``SecureLinks.request`` wrapped), the empty-request round trip (a ping to the
   helper), the CPU of the event-loop thread and of the worker threads per step, and a cProfile of
   the event-loop thread after the timed steps. All five parties share this process: their
   request handling (codec, AEAD, framing) runs on ONE event-loop thread and their model math in
   worker threads on the same cores, which a deployment on separate hosts would run in parallel.

Targets: secure step <= 1.5x base at cut 3; share generation >= 0.5x the raw keystream rate::

    .venv/bin/python scripts/bench/tlpp.py [--repeats 30] [--warmup 3] [--batch_size 96]
        [--share_numel 4194304] [--share_repeats 7] [--profile_steps 10]
        [--json scripts/bench/results/tlpp.json]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sharing as sharing_bench
import torch
from _common import MB, BenchError, markdown_table, write_json
from torch import Tensor, nn

import gossamer.peer.roles.tlpp.secure as tlpp_secure
from gossamer.crypto.identity import Identity
from gossamer.crypto.sharing import MaskStream
from gossamer.peer.kit.secure_link import LinkMessage, SecureLinks
from gossamer.peer.roles.tlpp.data import NodeData
from gossamer.peer.roles.tlpp.settings import TlppSettings
from gossamer.peer.roles.tlpp.wire import HELPER_METHOD, PING
from gossamer.protocols.tlpp import (
    VirtualBatch,
    VirtualBatchScheduler,
    node_backward,
    node_forward,
    server_step,
    sum_grads,
)
from tests.peer.roles.tlpp.harness import Tlpp

_HERE = Path(__file__).resolve().parent

MODES = ("base", "secure")
NUM_NODES = 3
MAX_STEP_RATIO = 1.5
MIN_SHARE_RATIO = sharing_bench.MIN_RATIO
PARTS = ("compute", "share_gen", "transfer")
PARTIES = ("node", "helper", "orchestrator")
PROFILE_ROWS = 12
PHASES = ("forward", "share:act", "logits", "backward", "share:grad", "sum", "orchestrator_local")
"""Request labels of the phase table, in step order; the node-to-helper pushes ("share:...") lie
inside the forward / backward requests that trigger them."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per mode first")
    parser.add_argument("--batch_size", type=int, default=96, help=f"virtual batch over {NUM_NODES} nodes")
    parser.add_argument("--share_numel", type=int, default=4 * 1024 * 1024,
                        help="elements of the bulk sharing rows")
    parser.add_argument("--share_repeats", type=int, default=7)
    parser.add_argument("--profile_steps", type=int, default=10,
                        help="profiled steps per mode after the timed ones (0: no profile)")
    parser.add_argument("--json", type=Path, default=_HERE / "results" / "tlpp.json")
    args = parser.parse_args(argv)
    for name, low in (("repeats", 1), ("warmup", 0), ("batch_size", NUM_NODES), ("share_numel", 1),
                      ("share_repeats", 1), ("profile_steps", 0)):
        if getattr(args, name) < low:
            parser.error(f"--{name} must be >= {low}, got {getattr(args, name)}")
    return args


# --- timing helpers -----------------------------------------------------------------------------


@dataclass
class Stopwatch:
    """Seconds per label, accumulated over calls, and the elements shared while it watched."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    shared_numels: list[int] = field(default_factory=list)

    @contextmanager
    def span(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[label] += time.perf_counter() - start


@contextmanager
def timed_sharing(watch: Stopwatch) -> Iterator[None]:
    """While inside, every ``share_float`` / ``reconstruct_float`` the party functions of
    ``peer.roles.tlpp.secure`` call is timed into ``watch`` ("share", "reconstruct")."""
    share_float, reconstruct_float = tlpp_secure.share_float, tlpp_secure.reconstruct_float

    def timed_share(x: Tensor, masks: MaskStream) -> tuple[Tensor, Tensor]:
        watch.shared_numels.append(x.numel())
        with watch.span("share"):
            return share_float(x, masks)

    def timed_reconstruct(s0: Tensor, s1: Tensor, **kwargs: Any) -> Tensor:
        with watch.span("reconstruct"):
            return reconstruct_float(s0, s1, **kwargs)

    tlpp_secure.share_float, tlpp_secure.reconstruct_float = timed_share, timed_reconstruct
    try:
        yield
    finally:
        tlpp_secure.share_float, tlpp_secure.reconstruct_float = share_float, reconstruct_float


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


# --- the split: each party's pure functions, serially ------------------------------------------------


@dataclass
class Parties:
    """One mode's model (the orchestrator's master copy, its halves, its optimizer) and the nodes' streams."""

    model: nn.Sequential
    node_side: nn.Module
    server_side: nn.Module
    optimizer: torch.optim.Optimizer
    masks: dict[str, MaskStream]


def build_parties(settings: TlppSettings, nodes: list[str], device: torch.device) -> Parties:
    model = settings.build_model(device)
    node_side, server_side = settings.split(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    return Parties(model, node_side, server_side, optimizer, {n: MaskStream() for n in nodes})


def apply(parties: Parties, grads: Mapping[str, Tensor]) -> None:
    """The orchestrator's optimizer step with the summed gradients (as ``TlppServerRole._apply``)."""
    parties.optimizer.zero_grad(set_to_none=True)
    for name, param in parties.model.named_parameters():
        param.grad = grads[name].to(device=param.device, dtype=param.dtype)
    parties.optimizer.step()
    parties.optimizer.zero_grad(set_to_none=True)


def base_split(p: Parties, xs: dict[str, Tensor], ys: dict[str, Tensor], watch: Stopwatch) -> None:
    """One base-mode virtual batch through each party's functions, timed by party."""
    with watch.span("node"):
        acts = {n: node_forward(p.node_side, xs[n]) for n in xs}
    with watch.span("orchestrator"):
        server = server_step(p.server_side, acts, ys)
    with watch.span("node"):
        grads = [node_backward(p.node_side, xs[n], server.cut_grads[n]) for n in sorted(xs)]
    with watch.span("orchestrator"):
        apply(p, {**sum_grads(grads), **server.server_grads})


def secure_split(p: Parties, xs: dict[str, Tensor], ys: dict[str, Tensor], watch: Stopwatch, *,
                 settings: TlppSettings) -> None:
    """One secure-mode virtual batch through each party's functions (``peer.roles.tlpp.secure``), timed by
    party, with share generation and reconstruction timed inside."""
    guard = {"max_abs": settings.max_abs, "max_failure": settings.max_failure}
    with timed_sharing(watch):
        with watch.span("node"):
            pairs = {n: tlpp_secure.node_share_activations(p.node_side, xs[n], max_abs=settings.max_abs,
                                                           masks=p.masks[n]) for n in xs}
        with watch.span("helper"):
            theirs = tlpp_secure.server_logit_share({n: s[1] for n, s in pairs.items()}, p.server_side,
                                                    **guard)
        with watch.span("orchestrator"):
            own = tlpp_secure.server_logit_share({n: s[0] for n, s in pairs.items()}, p.server_side, **guard)
            bound = tlpp_secure.logit_bound(p.server_side, max_abs=settings.max_abs)
            step = tlpp_secure.orchestrator_logit_gradients(own, theirs, ys, bound=bound)
        scale = float(step.count)
        with watch.span("node"):
            shares = [tlpp_secure.node_gradient_shares(p.node_side, p.server_side, xs[n], step.logit_grads[n],
                                                       masks=p.masks[n], grad_scale=scale)
                      for n in sorted(xs)]
        with watch.span("helper"):
            helper_sum = tlpp_secure.server_sum([pair[1] for pair in shares])
        with watch.span("orchestrator"):
            grads = tlpp_secure.orchestrator_gradients(tlpp_secure.server_sum([pair[0] for pair in shares]),
                                                       helper_sum, grad_scale=scale,
                                                       layout=tlpp_secure.gradient_layout(p.node_side,
                                                                                          p.server_side))
            apply(p, grads)


def raw_keystream(numels: list[int], stream: MaskStream) -> float:
    """Seconds to draw the keystream of ``numels`` int64 shares, one call per tensor."""
    start = time.perf_counter()
    for numel in numels:
        stream.raw_bytes(8 * numel)
    return time.perf_counter() - start


# --- the whole step over the network ---------------------------------------------------------------------


def node_data(net: Tlpp) -> dict[str, NodeData]:
    """Each node's samples by peer id, as its role loaded them."""
    return {net.id_of(f"node{i}"): net.peers[f"node{i}"].role.data  # type: ignore[attr-defined]
            for i in range(NUM_NODES)}


def batch_inputs(net: Tlpp, batch: VirtualBatch, device: torch.device) -> tuple[dict[str, Tensor], ...]:
    """Each node's images and labels of ``batch``, read from the node roles' own data."""
    data, plan = node_data(net), batch.by_node()
    return ({n: data[n].x[idx].to(device) for n, idx in plan.items()},
            {n: data[n].y[idx].to(device) for n, idx in plan.items()})


def schedule(net: Tlpp, settings: TlppSettings) -> list[VirtualBatch]:
    """Epoch 0's full virtual batches over the network's nodes (the short tail dropped)."""
    counts = {peer_id: len(data) for peer_id, data in node_data(net).items()}
    return VirtualBatchScheduler(counts, batch_size=settings.batch_size, seed=settings.seed,
                                 drop_last=True).epoch(0)


def sent_bytes(net: Tlpp) -> dict[str, int]:
    """TL++ bytes every peer sent so far, by op."""
    by_op: dict[str, int] = defaultdict(int)
    for peer in net.peers.values():
        for kind, size in peer.traffic.sent.items():
            if kind.startswith("tlpp_"):
                by_op[kind.removeprefix("tlpp_")] += size
    return dict(by_op)


def take_requests(net: Tlpp) -> int:
    """Request frames the servers got since the last call (the harness keeps copies: drop them)."""
    count = sum(len(frames) for frames in net.received.values())
    net.received.clear()
    return count


def request_log(net: Tlpp) -> RequestLog:
    """Time the requests of the orchestrator and of every node (the nodes' pushes to the helper)."""
    nodes = {name: peer.role._links  # type: ignore[attr-defined]
             for name, peer in net.peers.items() if name.startswith("node")}
    return RequestLog({"orchestrator": net.orchestrator.links, **nodes})


async def ping_rtt(net: Tlpp, count: int) -> float:
    """Median round trip of an empty request over the orchestrator's encrypted link to the helper."""
    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        await net.orchestrator.links.request(net.id_of("helper"), HELPER_METHOD,
                                             LinkMessage(PING, net.orchestrator.step), timeout_s=30.0)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


async def network_step(net: Tlpp, batch: VirtualBatch, log: RequestLog) -> dict[str, Any]:
    """One virtual batch through the orchestrator's real step; BenchError unless every node completed."""
    net.publish()  # fresh records: a long run must not outlive the harness' record expiry
    helper = net.id_of("helper") if "helper" in net.peers else None
    bytes_before, _ = sent_bytes(net), take_requests(net)
    log.restart()
    start, cpu_start, loop_start = time.perf_counter(), time.process_time(), time.thread_time()
    ledger = await net.orchestrator._one_step(batch, helper)
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


async def profile_loop(net: Tlpp, batches: list[VirtualBatch], log: RequestLog, steps: int) -> dict[str, Any]:
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
    root = _HERE.parents[1]
    if file == "~":
        return name
    if Path(file).is_relative_to(root):
        return str(Path(file).relative_to(root))
    return "asyncio" if "/asyncio/" in file else "torch (Python)" if "/torch/" in file else "other Python"


# --- the run ---------------------------------------------------------------------------------------------


async def build_networks(args: argparse.Namespace, tmp: Path) -> dict[str, Tlpp]:
    """The base and the secure network: same identities (so the same schedule), same shards."""
    hyper = {"batch_size": args.batch_size, "optimizer": "adam", "steps": 10_000, "eval_every": 0,
             "min_nodes": NUM_NODES, "node_timeout_s": 30.0, "helper_timeout_s": 30.0, "helper_wait_s": 10.0}
    names = [*(f"node{i}" for i in range(NUM_NODES)), "helper", "orchestrator"]
    ids = {name: Identity.generate() for name in names}
    sources = [f"builtin:digits:shard={i}/{NUM_NODES}" for i in range(NUM_NODES)]
    return {mode: await Tlpp.create(tmp / mode, hyper={**hyper, "mode": mode}, sources=sources,
                                    helper=mode == "secure", identities=ids) for mode in MODES}


@dataclass
class Setup:
    """What every repetition uses: both networks and their request logs, the split's parties, the batches."""

    nets: dict[str, Tlpp]
    logs: dict[str, RequestLog]
    parties: dict[str, Parties]
    settings: TlppSettings
    batches: list[VirtualBatch]
    device: torch.device


def build_setup(nets: dict[str, Tlpp]) -> Setup:
    settings, device = nets["secure"].orchestrator.settings, nets["secure"].orchestrator.ctx.device
    batches = schedule(nets["base"], settings)
    if batches != schedule(nets["secure"], settings):
        raise BenchError("the two networks draw different virtual batches")
    parties = {mode: build_parties(settings, sorted(batches[0].by_node()), device) for mode in MODES}
    logs = {mode: request_log(net) for mode, net in nets.items()}
    return Setup(nets, logs, parties, settings, batches, device)


async def mode_step(setup: Setup, mode: str, batch: VirtualBatch) -> dict[str, Any]:
    """One mode's network step on ``batch``, then its split on the same samples."""
    result = await network_step(setup.nets[mode], batch, setup.logs[mode])
    xs, ys = batch_inputs(setup.nets[mode], batch, setup.device)
    watch = Stopwatch()
    if mode == "secure":
        secure_split(setup.parties[mode], xs, ys, watch, settings=setup.settings)
    else:
        base_split(setup.parties[mode], xs, ys, watch)
    return {**result, "split": dict(watch.seconds), "shared_numels": watch.shared_numels}


async def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Every repetition: both modes' steps (the order alternates), the raw keystream of the secure
    step's shared tensors, and the empty-request round trip; then the event-loop profiles."""
    nets = await build_networks(args, tmp)
    try:
        setup = build_setup(nets)
        reps: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        extra: dict[str, list[float]] = {"raw_step_keystream_s": [], "ping_rtt_s": []}
        raw_stream = MaskStream()
        for rep in range(args.warmup + args.repeats):
            print(f"step {rep}" + (" (warm-up)" if rep < args.warmup else ""), file=sys.stderr, flush=True)
            for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
                reps[mode].append(await mode_step(setup, mode, setup.batches[rep % len(setup.batches)]))
            numels = reps["secure"][-1]["shared_numels"]
            extra["raw_step_keystream_s"].append(raw_keystream(numels, raw_stream))
            extra["ping_rtt_s"].append(await ping_rtt(nets["secure"], 5))
        profiles = {mode: await profile_loop(nets[mode], setup.batches, setup.logs[mode], args.profile_steps)
                    for mode in MODES} if args.profile_steps > 0 else {}
        timed = slice(args.warmup, None)
        return {"reps": {mode: runs[timed] for mode, runs in reps.items()}, "profiles": profiles,
                **{key: values[timed] for key, values in extra.items()}}
    finally:
        for net in nets.values():
            await net.aclose()


def summarize_mode(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per part; transfer is computed per repetition (whole - compute - share generation)."""
    whole = [r["seconds"] for r in reps]
    share_gen = [r["split"].get("share", 0.0) + r["split"].get("reconstruct", 0.0) for r in reps]
    compute = [sum(r["split"].get(p, 0.0) for p in PARTIES) - s
               for r, s in zip(reps, share_gen, strict=True)]
    transfer = [w - c - s for w, c, s in zip(whole, compute, share_gen, strict=True)]
    parties = {p: statistics.median(r["split"].get(p, 0.0) for r in reps) for p in PARTIES}
    return {
        "whole_s": statistics.median(whole), "whole_min_s": min(whole), "whole_max_s": max(whole),
        "compute_s": statistics.median(compute), "share_gen_s": statistics.median(share_gen),
        "share_s": statistics.median(r["split"].get("share", 0.0) for r in reps),
        "reconstruct_s": statistics.median(r["split"].get("reconstruct", 0.0) for r in reps),
        "transfer_s": statistics.median(transfer), "party_split_s": parties,
        "bytes_per_step": statistics.median(r["bytes"] for r in reps),
        "bytes_by_op": reps[-1]["bytes_by_op"],
        "requests_per_step": statistics.median(r["requests"] for r in reps),
        "shared_elements_per_step": sum(reps[-1]["shared_numels"]),
        "shared_tensors_per_step": len(reps[-1]["shared_numels"]), "seconds": whole,
        "loop_cpu_s": statistics.median(r["loop_cpu_s"] for r in reps),
        "worker_cpu_s": statistics.median(r["worker_cpu_s"] for r in reps),
        "phases_s": {label: statistics.median(r["phases"].get(label, 0.0) for r in reps)
                     for label in PHASES},
    }


def summarize(measured: dict[str, Any], bulk: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows = {mode: summarize_mode(measured["reps"][mode]) for mode in MODES}
    base, secure = measured["reps"]["base"], measured["reps"]["secure"]
    ratio = rows["secure"]["whole_s"] / rows["base"]["whole_s"]
    paired = statistics.median(s["seconds"] / b["seconds"] for s, b in zip(secure, base, strict=True))
    loss_gap = max(abs(s["loss"] - b["loss"]) for s, b in zip(secure, base, strict=True))
    step_share = [r["split"]["share"] for r in secure]
    share_mb, raw_s = 8 * rows["secure"]["shared_elements_per_step"] / MB, measured["raw_step_keystream_s"]
    return {
        "rows": rows,
        "step_ratio": {"ratio": ratio, "paired_median_ratio": paired, "max_ratio": MAX_STEP_RATIO,
                       "pass": ratio <= MAX_STEP_RATIO, "loss_max_abs_diff": loss_gap},
        "share_gen": {"bulk_ratio": bulk[sharing_bench.SHARE]["ratio_to_raw"], "min_ratio": MIN_SHARE_RATIO,
                      "pass": bulk[sharing_bench.SHARE]["pass"],
                      "bulk_share_mb_per_s": bulk[sharing_bench.SHARE]["median_mb_per_s"],
                      "bulk_raw_mb_per_s": bulk[sharing_bench.RAW]["median_mb_per_s"],
                      "in_step_ratio": statistics.median(raw_s) / statistics.median(step_share),
                      "in_step_share_mb_per_s": share_mb / statistics.median(step_share),
                      "in_step_raw_mb_per_s": share_mb / statistics.median(raw_s)},
        "bulk_rows": bulk,
        "ping_rtt_s": statistics.median(measured["ping_rtt_s"]),
        "loop_profiles": measured["profiles"],
    }


def _verdict(passed: bool) -> str:
    return "pass" if passed else "**FAIL**"


def render(summary: dict[str, Any], args: argparse.Namespace) -> str:
    rows, step, share = summary["rows"], summary["step_ratio"], summary["share_gen"]
    header = ["mode", "whole step ms (min - max)", "compute ms", "share gen ms", "transfer ms",
              "bytes / step", "requests / step"]
    lines = []
    for mode, row in rows.items():
        lines.append([mode, f"{1e3 * row['whole_s']:.1f} ({1e3 * row['whole_min_s']:.1f} - "
                      f"{1e3 * row['whole_max_s']:.1f})", f"{1e3 * row['compute_s']:.1f}",
                      f"{1e3 * row['share_gen_s']:.2f}", f"{1e3 * row['transfer_s']:.1f}",
                      f"{row['bytes_per_step'] / MB:.3f} MB", f"{row['requests_per_step']:g}"])
    delta = {part: rows["secure"][f"{part}_s"] - rows["base"][f"{part}_s"] for part in ("whole", *PARTS)}
    lines.append(["secure - base", *(f"{1e3 * delta[p]:+.1f}" for p in ("whole", *PARTS)),
                  f"{(rows['secure']['bytes_per_step'] - rows['base']['bytes_per_step']) / MB:+.3f} MB",
                  f"{rows['secure']['requests_per_step'] - rows['base']['requests_per_step']:+g}"])
    caption = (f"digits_cnn, cut 3, virtual batch {args.batch_size} over {NUM_NODES} nodes, Adam; median of "
               f"{args.repeats} interleaved steps per mode after {args.warmup} warm-up; torch threads = "
               f"{torch.get_num_threads()}; transfer = whole - compute - share gen (per step, then median)")
    verdicts = (
        f"secure / base step time: {step['ratio']:.2f}x (paired {step['paired_median_ratio']:.2f}x) "
        f"(<= {MAX_STEP_RATIO:g}x: {_verdict(step['pass'])}); |loss secure - loss base| of paired steps <= "
        f"{step['loss_max_abs_diff']:.1e} (the two trained models drift apart under Adam)\n"
        f"share generation vs raw keystream, bulk ({args.share_numel:,} elements): {share['bulk_ratio']:.2f} "
        f"({share['bulk_share_mb_per_s']:.0f} vs {share['bulk_raw_mb_per_s']:.0f} MB/s) "
        f"(>= {MIN_SHARE_RATIO:g}: {_verdict(share['pass'])})\n"
        f"share generation vs raw keystream, the {rows['secure']['shared_tensors_per_step']} tensors of one "
        f"secure step ({rows['secure']['shared_elements_per_step']:,} elements): "
        f"{share['in_step_ratio']:.2f} "
        f"({share['in_step_share_mb_per_s']:.0f} vs {share['in_step_raw_mb_per_s']:.0f} MB/s, no target)")
    return "\n\n".join([caption, markdown_table(header, lines), verdicts, render_phases(summary)])


def render_phases(summary: dict[str, Any]) -> str:
    """Where the network step's wall time goes: each request phase (first start to last end) and the
    CPU of the event-loop thread (all parties' request handling) and of the worker threads (model math)."""
    header = ["mode", *(f"{label} ms" for label in PHASES), "event-loop CPU ms", "worker-thread CPU ms"]
    lines = [[mode, *(f"{1e3 * row['phases_s'][label]:.2f}" if row["phases_s"][label] else ""
                      for label in PHASES),
              f"{1e3 * row['loop_cpu_s']:.1f}", f"{1e3 * row['worker_cpu_s']:.1f}"]
             for mode, row in summary["rows"].items()]
    return ("Phases of the network step (median ms; share:act / share:grad are the nodes' pushes to the "
            "helper, inside forward / backward; orchestrator_local = step time outside the orchestrator's "
            f"requests). Empty request round trip over an encrypted link (ping to the helper): "
            f"{1e3 * summary['ping_rtt_s']:.2f} ms.\n\n"
            + markdown_table(header, lines) + render_profile(summary))


def render_profile(summary: dict[str, Any]) -> str:
    """The largest self-CPU groups of the event-loop thread per step, per mode (cProfile)."""
    if not summary["loop_profiles"]:
        return ""
    lines = [[mode, row["group"], f"{1e3 * row['cpu_s_per_step']:.2f}", f"{100 * row['share']:.0f}%"]
             for mode, profile in summary["loop_profiles"].items() for row in profile["top_self"][:6]]
    totals = ", ".join(f"{mode} {1e3 * p['profiled_loop_cpu_s_per_step']:.1f} ms"
                       for mode, p in summary["loop_profiles"].items())
    return (f"\n\nEvent-loop thread under cProfile, self CPU (inflated by the profiler; per step: "
            f"{totals})\n\n"
            + markdown_table(["mode", "module / builtin", "self ms / step", "of loop CPU"], lines))


def machine() -> dict[str, Any]:
    return {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "load_average": os.getloadavg(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    before = machine()
    with tempfile.TemporaryDirectory(prefix="gossamer-tlpp-bench-") as tmp:
        measured = asyncio.run(measure(args, Path(tmp)))
    sharing_bench.check_correct(1 << 14)
    bulk_rows = sharing_bench.build_rows(args.share_numel)
    bulk_seconds = sharing_bench.run_interleaved(bulk_rows, args.share_repeats)
    summary = summarize(measured, sharing_bench.summarize(bulk_seconds, args.share_numel))
    table = render(summary, args)
    print(table)
    write_json(args.json, {"machine": before, "load_average_after": os.getloadavg(),
                           "args": {k: str(v) for k, v in vars(args).items()}, **summary,
                           "table_markdown": table})
    print(f"\nwrote {args.json}", file=sys.stderr)
    return 0 if summary["step_ratio"]["pass"] and summary["share_gen"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
