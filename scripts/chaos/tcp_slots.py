"""A block server's TCP data plane under the attacks of issue 10 (idle sockets, slow frames, from
16 addresses, big unauthenticated claims), before and after the fix, while an honest client asks
for ``blocktrain.embedding`` (SECURITY.md); ``--long``: the issue's pace::

    nice -n 10 .venv/bin/python scripts/chaos/tcp_slots.py [--baseline_ref e9bd123] [--long]"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from _harness import (
    ATTACKER,
    Code,
    Daemons,
    Probes,
    RssSampler,
    compare,
    keep_dripping,
    many,
    measure,
    open_from,
    probe_loop,
    write_report,
)

from gossamer.transport.frames import Frame, FrameType, encode_prefix
from gossamer.transport.header import pack_header
from gossamer.transport.tcp import TcpConfig, tcp_connect

RUN = """
[run]
name = "chaos-tcp"
protocol = "blocktrain"
heartbeat_s = 1.0
[model]
d_model = 32
n_heads = 2
context = 32
num_blocks = 3
[hyper]
versions = 0
eval_batches = 0
"""


async def embedding(host: str, port: int) -> str:
    """One honest request on a fresh connection (so a full server refuses it)."""
    connection = await tcp_connect(host, port, config=TcpConfig(connect_timeout_s=5.0, request_timeout_s=5.0))
    try:
        reply = await connection.request(Frame(FrameType.REQUEST, {"method": "blocktrain.embedding"}))
    except Exception as exc:  # every refusal is an outcome to count, whatever its type
        return f"{type(exc).__name__}: {str(exc)[:40]}"
    finally:
        await connection.aclose()
    return "served" if reply.header.get("tensors") else "empty answer"


def tcp_outcome(data: bytes | None) -> str:
    """How a held connection ended, as the attacker saw it."""
    if data is None:
        return "held to the end"
    return "refused: overloaded" if b"overloaded" in data else "cut by the server"


async def big_claim(host: str, port: int, claim: int, limit_s: float) -> dict[str, Any]:
    """Announce a ``claim``-byte traverse payload and send zeros as fast as the server reads them."""
    reader, writer = await open_from(host, port, ATTACKER)
    header = pack_header({"method": "blocktrain.traverse", "rid": 1})
    sent, chunk, started = 0, bytes(1 << 20), time.monotonic()
    answer = asyncio.create_task(reader.read(4096))
    try:
        writer.write(encode_prefix(FrameType.REQUEST, len(header), claim) + header)
        while sent < claim and not answer.done() and time.monotonic() - started < limit_s:
            writer.write(chunk[:min(len(chunk), claim - sent)])
            await writer.drain()
            sent += min(len(chunk), claim - sent)
    except OSError:
        pass
    finally:
        answer.cancel()
        writer.close()
    return {"sent_mb": round(sent / 1e6, 1)}


async def run_code(code: Code, work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    daemons = Daemons(code, work, RUN)
    try:
        server = daemons.add("server", ["serve", "--blocks", "0", "1", "2"])
        ready = server.wait_ready(timeout_s=120)
        server.wait_event(lambda e: e["event"] == "blocktrain.serving", timeout_s=120)
        host, port = ready["tcp"].rsplit(":", 1)[0], int(ready["tcp"].rsplit(":", 1)[1])
        rss, probes, stop = RssSampler(server.proc.pid), Probes(), asyncio.Event()

        def holding(sources: list[str], drip_s: float | None):
            prefix = encode_prefix(FrameType.REQUEST, 64, 1000)

            async def attacker(source: str, done: asyncio.Event) -> dict[str, int]:
                return await keep_dripping(host, port, source, b"", prefix, drip_s, done, tcp_outcome)
            return lambda: many(args.connections, sources, attacker, args.attack_s)

        async def claims() -> dict[str, Any]:
            results = await asyncio.gather(*(big_claim(host, port, args.claim_mib << 20, args.attack_s)
                                             for _ in range(args.claims)))
            return {"sent_mb": [r["sent_mb"] for r in results]}

        rss.start()
        prober = asyncio.create_task(probe_loop(lambda: embedding(host, port), probes, stop, 0.25))
        n = args.connections
        scenarios = [(f"{n} idle sockets, one address", holding([ATTACKER], None)),
                     (f"{n} slow frames (1 B/{args.drip_s:g} s), one address", holding([ATTACKER], args.drip_s)),
                     (f"{n} slow frames, 16 addresses", holding([f"127.0.1.{i}" for i in range(1, 17)], args.drip_s)),
                     (f"{args.claims} unauthenticated {args.claim_mib} MiB payload claims", claims)]
        rows = [(await measure(name, attack, code, rss, probes, calm_s=args.calm_s, cool_s=args.cool_s))[0]
                for name, attack in scenarios]
        stop.set()
        await asyncio.gather(prober, return_exceptions=True)
        await rss.stop()
        return rows
    finally:
        daemons.stop()


async def main(args: argparse.Namespace) -> None:
    rows = await compare(args.baseline_ref, "chaos-tcp-", lambda code, work: run_code(code, work, args))
    columns = [("scenario", "attack"), ("code", "code"), ("rss_before_mb", "RSS before (MB)"),
               ("rss_peak_mb", "RSS peak (MB)"), ("rss_after_mb", f"RSS {args.cool_s:g} s after (MB)"),
               ("honest_served_pct", "honest served %"), ("honest_p50_ms", "p50 ms"), ("honest_p95_ms", "p95 ms"),
               ("honest_failures", "honest failures"), ("attack", "what the attacker saw")]
    write_report("tcp_slots" + ("_long" if args.long else ""), rows, columns,
                 {"args": vars(args), "note": "the block server's RSS; honest = blocktrain.embedding every 0.25 s "
                                              "on a fresh connection from 127.0.0.1"})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline_ref", default="", help="git ref of the code before the fix (e.g. e9bd123)")
    parser.add_argument("--long", action="store_true", help="the issue's pace and sizes")
    parser.add_argument("--connections", type=int, default=260)
    parser.add_argument("--attack_s", type=float, default=20.0)
    parser.add_argument("--drip_s", type=float, default=2.0)
    parser.add_argument("--claim_mib", type=int, default=512)
    parser.add_argument("--claims", type=int, default=2)
    parser.add_argument("--calm_s", type=float, default=5.0)
    parser.add_argument("--cool_s", type=float, default=8.0)
    args = parser.parse_args()
    if args.long:
        args.attack_s, args.drip_s, args.cool_s, args.calm_s = 90.0, 20.0, 30.0, 10.0
        args.claim_mib, args.claims = 4096, 1  # one 4 GiB claim: the old code takes 4 GB per connection
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
