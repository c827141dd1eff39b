"""Issue 30 item 9 against a live block server, before and after fair slots: 260 slow connections
from 16 addresses on its HTTP port, then its TCP port, while an honest client asks every 0.25 s on a
fresh connection from 127.0.0.1 (``/healthz``, ``blocktrain.embedding``); ``--long``: the issue's pace::

    nice -n 10 .venv/bin/python scripts/chaos/slot_fairness.py [--baseline_ref fc3d6c3] [--long]"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from _harness import (
    Code,
    Daemons,
    Probes,
    RssSampler,
    compare,
    keep_dripping,
    many,
    measure,
    probe_loop,
    write_report,
)
from http_slots import healthz, http_status
from tcp_slots import RUN, embedding, tcp_outcome

from gossamer.transport.frames import FrameType, encode_prefix

ADDRESSES = [f"127.0.1.{i}" for i in range(1, 17)]


async def run_code(code: Code, work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    daemons = Daemons(code, work, RUN)
    try:
        server = daemons.add("server", ["serve", "--blocks", "0", "1", "2"])
        ready = server.wait_ready(timeout_s=120)
        server.wait_event(lambda e: e["event"] == "blocktrain.serving", timeout_s=120)
        http_host, http_port = ready["http"].rsplit(":", 1)[0], int(ready["http"].rsplit(":", 1)[1])
        tcp_host, tcp_port = ready["tcp"].rsplit(":", 1)[0], int(ready["tcp"].rsplit(":", 1)[1])
        rss = RssSampler(server.proc.pid)

        def slow_http() -> Any:
            async def attacker(source: str, done: asyncio.Event) -> dict[str, int]:
                return await keep_dripping(http_host, http_port, source, b"GET /healthz HTTP/1.1\r\nX-Slow: ", b"a",
                                           args.drip_s, done, http_status)
            return many(args.connections, ADDRESSES, attacker, args.attack_s)

        def slow_tcp() -> Any:
            prefix = encode_prefix(FrameType.REQUEST, 64, 1000)

            async def attacker(source: str, done: asyncio.Event) -> dict[str, int]:
                return await keep_dripping(tcp_host, tcp_port, source, b"", prefix, args.drip_s, done, tcp_outcome)
            return many(args.connections, ADDRESSES, attacker, args.attack_s)

        scenarios = [(f"HTTP: {args.connections} slow headers (1 B/{args.drip_s:g} s), 16 addresses", slow_http,
                      lambda: healthz(http_host, http_port)),
                     (f"TCP: {args.connections} slow frames (1 B/{args.drip_s:g} s), 16 addresses", slow_tcp,
                      lambda: embedding(tcp_host, tcp_port))]
        rss.start()
        rows = []
        for name, attack, probe in scenarios:
            probes, stop = Probes(), asyncio.Event()
            prober = asyncio.create_task(probe_loop(probe, probes, stop, 0.25))
            row, _ = await measure(name, attack, code, rss, probes, calm_s=args.calm_s, cool_s=args.cool_s)
            stop.set()
            await asyncio.gather(prober, return_exceptions=True)
            rows.append(row)
        await rss.stop()
        return rows
    finally:
        daemons.stop()


async def main(args: argparse.Namespace) -> None:
    rows = await compare(args.baseline_ref, "chaos-fair-", lambda code, work: run_code(code, work, args))
    columns = [("scenario", "attack"), ("code", "code"), ("honest_served_pct", "honest served %"),
               ("honest_probes", "honest requests"), ("honest_p50_ms", "p50 ms"), ("honest_p95_ms", "p95 ms"),
               ("honest_failures", "honest failures"), ("rss_peak_mb", "RSS peak (MB)"),
               ("attack", "what the attacker saw")]
    write_report("slot_fairness" + ("_long" if args.long else ""), rows, columns,
                 {"args": vars(args), "note": "a block server; honest = GET /healthz or blocktrain.embedding every "
                                              "0.25 s on a fresh connection from 127.0.0.1"})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline_ref", default="", help="git ref of the code before the fix (e.g. fc3d6c3)")
    parser.add_argument("--long", action="store_true", help="the issue's pace and length")
    parser.add_argument("--connections", type=int, default=260)
    parser.add_argument("--attack_s", type=float, default=20.0)
    parser.add_argument("--drip_s", type=float, default=2.0)
    parser.add_argument("--calm_s", type=float, default=3.0)
    parser.add_argument("--cool_s", type=float, default=5.0)
    args = parser.parse_args()
    if args.long:
        args.attack_s, args.drip_s, args.cool_s, args.calm_s = 90.0, 20.0, 15.0, 10.0
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
