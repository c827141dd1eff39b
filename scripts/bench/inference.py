"""Bytes per second of BlockTrain passes vs the matched autoregressive pipeline, three hosts behind
emulated WAN links; target: the ratio is at least L / N (docs/BENCHMARKS.md, "Inference")::

    .venv/bin/python scripts/bench/inference.py [--sizes 64 256 1024] [--latency_ms 50] [--mbit 100] [--passes 4]"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from gossamer.peer.route.client import HostEntry, RemoteRoute
from gossamer.peer.route.pool import HopPool
from gossamer.peer.route.wire import Hop
from gossamer.protocols.blocktrain.ar_stage import METHOD as AR_METHOD
from gossamer.protocols.blocktrain.ar_stage import ArStageHost, build_stages, matched_model_config
from gossamer.protocols.blocktrain.client import ArClient, BlockTrainClient
from gossamer.protocols.blocktrain.core import BlockTrainConfig, build_stack, generate
from gossamer.protocols.blocktrain.host import METHOD as BLOCK_METHOD
from gossamer.protocols.blocktrain.host import BlockHost
from gossamer.protocols.blocktrain.stack import partial_stack
from gossamer.protocols.core.models import build_model
from gossamer.protocols.core.models import generate as ar_generate
from gossamer.transport.frames import Frame
from gossamer.transport.tcp import HandlerError, TcpServer
from gossamer_harness.report import machine, markdown_table, write_result
from gossamer_harness.wan import LinkProfile, WanProxy

_HERE = Path(__file__).resolve().parent

RUN_ID = "bench@0000000000000000"
SEED = 0
PROMPT = b"The "


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024],
                        help="bytes generated per row")
    parser.add_argument("--latency_ms", type=float, default=50.0, help="one-way latency of each hop")
    parser.add_argument("--mbit", type=float, default=100.0, help="bandwidth of each hop, each direction")
    parser.add_argument("--passes", type=int, default=4,
                        help="BlockTrain refinement passes per segment")
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--json", type=Path, default=_HERE / "results" / "inference.json")
    return parser.parse_args(argv)


def model_config(args: argparse.Namespace) -> BlockTrainConfig:
    return BlockTrainConfig(d_model=args.d_model, n_heads=4, context=args.context, num_blocks=3,
                            layers_per_block=1)


# -- a host process ---------------------------------------------------------------------------------


def host_main(conn: Connection, params: dict[str, Any]) -> None:
    """One host: block ``block`` and AR stage ``stage`` behind a TcpServer behind a WAN proxy."""
    torch.set_num_threads(1)
    try:
        asyncio.run(_host(conn, params))
    except BaseException as exc:
        conn.send(("error", repr(exc)))
        raise


async def _host(conn: Connection, params: dict[str, Any]) -> None:
    config = BlockTrainConfig(**params["model"])
    block, stage = params["block"], params["stage"]
    full = build_stack(config, seed=SEED, device="cpu")
    stack = partial_stack(config, [block], device=torch.device("cpu"))
    stack.load_block_state(block, full.block_state(block))
    stack.load_embedding_state(full.embedding_state())
    del full
    allowed: set[str] = set()

    async def next_hop_ok(hop: Hop) -> str | None:
        return None if hop.addr in allowed else f"{hop.addr} is not one of the benchmark's hosts"

    pool = HopPool()
    block_host = BlockHost(stack, (block,), run_id=RUN_ID, pool=pool, next_hop_ok=next_hop_ok)
    stages = build_stages(matched_model_config(config), (stage,), config.num_blocks, seed=SEED,
                          device=torch.device("cpu"))
    stage_host = ArStageHost(stages, config=matched_model_config(config), num_stages=config.num_blocks,
                             run_id=RUN_ID, pool=pool, next_hop_ok=next_hop_ok)
    methods = {BLOCK_METHOD: block_host.handle, AR_METHOD: stage_host.handle}

    async def dispatch(frame: Frame, info: object) -> Frame:
        method = methods.get(frame.header.get("method"))
        if method is None:
            raise HandlerError(f"unknown method {frame.header.get('method')!r}")
        return await method(frame)

    server = await TcpServer.create(dispatch)
    link = LinkProfile.from_mbit(params["mbit"], params["latency_ms"])
    proxy = await WanProxy.create("127.0.0.1", server.address[1], up=link)
    try:
        conn.send(("ready", {"addr": f"127.0.0.1:{proxy.address[1]}"}))
        allowed.update(await asyncio.to_thread(conn.recv))
        await asyncio.to_thread(conn.recv)  # "stop"
        stats = proxy.stats
        conn.send(("done", {"block_passes": block_host.served,
                            "stage_passes": stage_host.served,
                            "bytes_into_host": stats.up.bytes_forwarded,
                            "bytes_out_of_host": stats.down.bytes_forwarded}))
    finally:
        await proxy.aclose()
        await server.aclose()
        await pool.aclose()


# -- the client ---------------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, addrs: list[str]) -> list[dict[str, Any]]:
    """Every size's BlockTrain and AR generation through the hosts (``addrs[k]`` holds block k)."""
    config = model_config(args)
    pool = HopPool()

    async def blocks(refresh: bool) -> list[HostEntry]:
        return [HostEntry(f"h{k}", addrs[k], (k,)) for k in range(3)]

    async def stages(refresh: bool) -> list[HostEntry]:
        return [HostEntry(f"h{k}", addrs[k], (2 - k,)) for k in range(3)]  # block k's host holds stage 2 - k

    budget = 120.0
    reference = build_stack(config, seed=SEED, device="cpu")
    ar_model = build_model(matched_model_config(config), seed=SEED).eval()
    rows = []
    try:
        bt_route = RemoteRoute(method=BLOCK_METHOD, run_id=RUN_ID, order=[2, 1, 0], hosts=blocks, pool=pool,
                               budget_s=budget)
        bt = BlockTrainClient(bt_route, config, reference.embedding_state(), device=torch.device("cpu"))
        ar = ArClient(RemoteRoute(method=AR_METHOD, run_id=RUN_ID, order=[0, 1, 2], hosts=stages, pool=pool,
                                  budget_s=budget), context=config.context, vocab=config.vocab)
        # warm-up: connections, first kernel calls
        await bt.generate(PROMPT, new_bytes=1, passes=1, generator=torch.Generator().manual_seed(99))
        await ar.generate(PROMPT, new_bytes=1, generator=torch.Generator().manual_seed(99))
        for size in args.sizes:
            rows.append(await one_size(args, size, bt, ar, reference, ar_model))
    finally:
        await pool.aclose()
    return rows


async def one_size(args: argparse.Namespace, size: int, bt: BlockTrainClient, ar: ArClient, reference: Any,
                   ar_model: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"bytes": size}
    for name, client in (("blocktrain", bt), ("ar", ar)):
        print(f"{name}: generating {size} bytes", file=sys.stderr, flush=True)
        before = client.passes
        started = time.perf_counter()
        if name == "blocktrain":
            text = await bt.generate(PROMPT, new_bytes=size, passes=args.passes,
                                     generator=torch.Generator().manual_seed(size), temperature=0.8)
            seconds = time.perf_counter() - started
            local = generate(reference, PROMPT, new_bytes=size, passes=args.passes,
                             generator=torch.Generator().manual_seed(size), temperature=0.8)
        else:
            text = await ar.generate(PROMPT, new_bytes=size, generator=torch.Generator().manual_seed(size),
                                     temperature=0.8)
            seconds = time.perf_counter() - started
            local = ar_generate(ar_model, PROMPT, max_new_bytes=size, temperature=0.8,
                                generator=torch.Generator().manual_seed(size))
        passes = client.passes - before
        row[name] = {"seconds": seconds, "passes": passes, "bytes_per_s": size / seconds,
                     "s_per_pass": seconds / passes, "retries": client.route.retries,
                     "matches_in_process": text == local}
    row["speedup"] = row["blocktrain"]["bytes_per_s"] / row["ar"]["bytes_per_s"]
    row["target_speedup"] = size / row["blocktrain"]["passes"]
    row["pass"] = row["speedup"] >= row["target_speedup"]
    return row


def start_hosts(args: argparse.Namespace) -> tuple[list[Any], list[Connection], list[str]]:
    ctx = multiprocessing.get_context("spawn")
    procs, conns, addrs = [], [], []
    model = {f: getattr(model_config(args), f) for f in ("d_model", "n_heads", "context", "num_blocks",
                                                        "layers_per_block")}
    for k in range(3):
        ours, theirs = ctx.Pipe()
        params = {"model": model, "block": k, "stage": 2 - k, "mbit": args.mbit,
                  "latency_ms": args.latency_ms}
        proc = ctx.Process(target=host_main, args=(theirs, params), name=f"host{k}")
        proc.start()
        theirs.close()
        procs.append(proc)
        conns.append(ours)
    for k, conn in enumerate(conns):
        kind, info = conn.recv()
        if kind != "ready":
            raise RuntimeError(f"host {k} failed to start: {info}")
        addrs.append(info["addr"])
    for conn in conns:
        conn.send(list(addrs))
    return procs, conns, addrs


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    header = ["bytes", "BlockTrain passes", "BlockTrain bytes/s", "AR passes", "AR bytes/s",
              "s per pass (BT / AR)", "speedup", "target L / N", "met",
              "same text as one process (BT / AR)"]
    lines = []
    for row in rows:
        bt, ar = row["blocktrain"], row["ar"]
        lines.append([str(row["bytes"]), str(bt["passes"]), f"{bt['bytes_per_s']:.1f}",
                      str(ar["passes"]), f"{ar['bytes_per_s']:.2f}",
                      f"{bt['s_per_pass']:.3f} / {ar['s_per_pass']:.3f}", f"{row['speedup']:.2f}x",
                      f"{row['target_speedup']:.2f}x", "yes" if row["pass"] else "**no**",
                      f"{bt['matches_in_process']} / {ar['matches_in_process']}"])
    caption = (f"3 hosts, each behind a WAN proxy ({args.latency_ms:g} ms one way, {args.mbit:g} Mbit/s per "
               f"direction); d_model {args.d_model}, context {args.context}, 3 blocks / stages of 1 layer; "
               f"BlockTrain {args.passes} refinement passes per segment of {args.context // 2} bytes")
    return caption + "\n\n" + markdown_table(header, lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    before = machine()
    procs, conns, addrs = start_hosts(args)
    started = time.perf_counter()
    try:
        rows = asyncio.run(measure(args, addrs))
        for conn in conns:
            conn.send("stop")
        hosts = [conn.recv()[1] for conn in conns]
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.terminate()
                proc.join(10)
    table = render(rows, args)
    print(table)
    write_result(args.json, {"wall_s": time.perf_counter() - started, "rows": rows, "hosts": hosts,
                             "table_markdown": table}, before=before, args=args)
    print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
