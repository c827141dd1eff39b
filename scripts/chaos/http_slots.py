"""A learner's HTTP data plane under the attacks of issue 10 (big bodies, slow bodies, slow headers
from 16 addresses), before and after the fix, while an honest prober asks for ``/healthz``
(SECURITY.md); ``--long``: the issue's figures::

    nice -n 10 .venv/bin/python scripts/chaos/http_slots.py [--baseline_ref e9bd123] [--long]"""

from __future__ import annotations

import argparse
import asyncio
import base64
import secrets
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

from gossamer.crypto.envelope import seal
from gossamer.crypto.identity import Identity

RUN = """
[run]
name = "chaos-http"
protocol = "diloco"
heartbeat_s = 1.0
[model]
d_model = 32
n_layers = 1
n_heads = 2
context = 32
[hyper]
rounds = 0
batch_size = 8
min_learners = 2
w1_grace_s = 2.0
w2_deadline_s = 3.0
eval_batches = 1
[hyper.diloco]
inner_steps = 5
[hyper.mixing]
w1 = "global"
w2 = "global"
"""
PATH = "/diloco/params/0"


def stranger_envelope(recipient: str, run_id: str) -> str:
    """A well-formed envelope from a key that is not in the run."""
    blob = seal(Identity.generate(), recipient=recipient, run_id=run_id, round=0, method="PUT", target=PATH,
                payload_digest=bytes(32), now=time.time(), nonce=secrets.token_bytes(16))
    return base64.b64encode(blob).decode()


def headers(size: int, envelope: str) -> bytes:
    return (f"PUT {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\nX-Gossamer-Envelope: {envelope}\r\n"
            "\r\n").encode()


async def big_body(host: str, port: int, size: int, envelope: str) -> dict[str, Any]:
    """Send a body of ``size`` bytes as fast as the server reads it; what got through and the answer."""
    reader, writer = await open_from(host, port, ATTACKER)
    sent, chunk = 0, bytes(1 << 20)
    answer = asyncio.create_task(reader.read(200))
    try:
        writer.write(headers(size, envelope))
        while sent < size and not answer.done():
            writer.write(chunk[:min(len(chunk), size - sent)])
            await writer.drain()
            sent += min(len(chunk), size - sent)
        head = await asyncio.wait_for(answer, timeout=120.0)
    except (OSError, TimeoutError) as exc:
        head = f"{type(exc).__name__}".encode()
    finally:
        answer.cancel()
        writer.close()
    return {"sent_mb": round(sent / 1e6, 1), "answer": head.split(b"\r\n", 1)[0].decode(errors="replace")}


def http_status(data: bytes | None) -> str:
    """How a dripping connection ended, as the attacker saw it."""
    if data is None:
        return "held to the end"
    if data.startswith(b"HTTP/"):
        return data.split(b" ", 2)[1].decode(errors="replace")
    return "closed" if not data else data.decode(errors="replace")[:30]


async def healthz(host: str, port: int) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head = await reader.read(100)
    finally:
        writer.close()
    if head.startswith(b"HTTP/1.1 200"):
        return "served"
    return head.split(b"\r\n", 1)[0].decode(errors="replace") or "closed"


def rounds_between(events: list[tuple[float, dict]], start: float, end: float) -> dict[str, int]:
    rounds = [e for t, e in events if start <= t <= end and e.get("event") == "diloco.round"]
    return {"rounds": len(rounds), "pgrads_used": sum(e["pgrads_used"] for e in rounds),
            "pgrads_timed_out": sum(len(e["timed_out"]) for e in rounds)}


async def run_code(code: Code, work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    daemons = Daemons(code, work, RUN)
    try:
        l0 = daemons.add("l0", ["peer", "--roles", "learner"])
        daemons.add("l1", ["peer", "--roles", "learner"])
        ready = l0.wait_ready(timeout_s=120)
        l0.wait_event(lambda e: e["event"] == "diloco.round", timeout_s=180)  # training, and both in the view
        host, port = ready["http"].rsplit(":", 1)[0], int(ready["http"].rsplit(":", 1)[1])
        envelope = stranger_envelope(ready["peer_id"], ready["run_id"])
        rss, probes, stop = RssSampler(l0.proc.pid), Probes(), asyncio.Event()
        events: list[tuple[float, dict]] = []

        async def collect() -> None:
            while True:
                events.extend((time.monotonic(), e) for e in l0.poll_events())
                await asyncio.sleep(0.2)

        async def big() -> dict[str, Any]:
            results = await asyncio.gather(*(big_body(host, port, args.big_mib << 20, envelope) for _ in range(2)))
            return {"sent_mb": [r["sent_mb"] for r in results], "answers": sorted({r["answer"] for r in results})}

        def slow(first: bytes, drip: bytes, sources: list[str]):
            async def attacker(source: str, done: asyncio.Event) -> dict[str, int]:
                return await keep_dripping(host, port, source, first, drip, args.drip_s, done, http_status)
            return lambda: many(args.slow_connections, sources, attacker, args.slow_s)

        rss.start()
        tasks = [asyncio.create_task(collect()),
                 asyncio.create_task(probe_loop(lambda: healthz(host, port), probes, stop, 0.25))]
        n, addresses = args.slow_connections, [f"127.0.1.{i}" for i in range(1, 17)]
        scenarios = [(f"{args.big_mib} MiB bodies x2, fake envelope", big),
                     (f"{n} slow bodies (1 B/{args.drip_s:g} s), one address",
                      slow(headers(1_000_000, envelope), b"x", [ATTACKER])),
                     (f"{n} slow headers, 16 addresses", slow(b"GET /healthz HTTP/1.1\r\nX-Slow: ", b"a", addresses))]
        rows = []
        for name, attack in scenarios:
            row, (calm, start, end) = await measure(name, attack, code, rss, probes, calm_s=args.calm_s,
                                                    cool_s=args.cool_s)
            quiet, attacked = rounds_between(events, calm, start), rounds_between(events, start, end)
            rows.append({**row, "rounds_per_min_calm": round(60 * quiet["rounds"] / (start - calm), 1),
                         "rounds_per_min_attack": round(60 * attacked["rounds"] / (end - start), 1),
                         "pgrads_timed_out": attacked["pgrads_timed_out"]})
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await rss.stop()
        return rows
    finally:
        daemons.stop()


async def main(args: argparse.Namespace) -> None:
    rows = await compare(args.baseline_ref, "chaos-http-", lambda code, work: run_code(code, work, args))
    columns = [("scenario", "attack"), ("code", "code"), ("rss_before_mb", "RSS before (MB)"),
               ("rss_peak_mb", "RSS peak (MB)"), ("rss_after_mb", f"RSS {args.cool_s:g} s after (MB)"),
               ("honest_served_pct", "honest served %"), ("honest_p50_ms", "p50 ms"), ("honest_p95_ms", "p95 ms"),
               ("honest_failures", "honest failures"), ("rounds_per_min_calm", "rounds/min calm"),
               ("rounds_per_min_attack", "rounds/min attacked"), ("pgrads_timed_out", "pgrads timed out"),
               ("attack", "what the attacker saw")]
    write_report("http_slots" + ("_long" if args.long else ""), rows, columns,
                 {"args": vars(args), "note": "l0's RSS; honest = GET /healthz every 0.25 s from 127.0.0.1"})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline_ref", default="", help="git ref of the code before the fix (e.g. e9bd123)")
    parser.add_argument("--long", action="store_true", help="the issue's sizes and pace")
    parser.add_argument("--big_mib", type=int, default=256)
    parser.add_argument("--slow_connections", type=int, default=260)
    parser.add_argument("--slow_s", type=float, default=25.0)
    parser.add_argument("--drip_s", type=float, default=2.0)
    parser.add_argument("--calm_s", type=float, default=8.0)
    parser.add_argument("--cool_s", type=float, default=8.0)
    args = parser.parse_args()
    if args.long:
        args.big_mib, args.slow_s, args.drip_s, args.cool_s, args.calm_s = 1024, 90.0, 20.0, 30.0, 20.0
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
