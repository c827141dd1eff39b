"""Chaos: a learner's HTTP data plane under the attacks of issue 10, before and after the fix.

Two real learner daemons (and an orchestrator) train a tiny DiLoCo run; the attacker, on its own
loopback address, goes for learner l0's HTTP port while an honest prober asks l0 for
``/healthz`` every 0.25 s from 127.0.0.1 and the learners keep exchanging parameters and
pseudo-gradients. Scenarios, one after the other on the same daemons:

- ``big bodies``: two connections PUT ``/diloco/params/0`` under a stranger's envelope with a
  body of ``--big_mib`` MiB each, sent as fast as the learner takes it;
- ``slow bodies``: ``--slow_connections`` connections send the same headers with a 1 MB body and
  then one byte every ``--drip_s`` for ``--slow_s``;
- ``slow headers, 16 addresses``: ``--slow_connections`` connections spread over 16 attacker
  addresses send a request line and then one header byte every ``--drip_s``, reconnecting when
  cut: the limit of a per-address cap (an attacker with enough addresses still fills every slot
  for up to ``header_timeout_s`` at a time).

Per scenario: l0's RSS before, at its peak during and ``--cool_s`` after the attack; the honest
probes served (%), their latency; the rounds l0 finished during the attack and the peers'
pseudo-gradients it had to time out. Quick: the defaults (~6 min in all). Long (the issue's
figures): ``--big_mib 1024 --slow_s 90 --drip_s 20 --cool_s 30``.

    nice -n 10 .venv/bin/python scripts/chaos/http_slots.py [--baseline_ref e9bd123] [--long]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import (
    ATTACKER,
    Code,
    Daemons,
    Probes,
    RssSampler,
    baseline_code,
    mb,
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


async def slow_body(host: str, port: int, source: str, envelope: str, drip_s: float, stop: asyncio.Event
                    ) -> dict[str, Any]:
    """Headers for a 1 MB body, then one byte per ``drip_s`` until ``stop`` or the server gives up."""
    opened = time.monotonic()
    try:
        reader, writer = await open_from(host, port, source)
    except OSError as exc:
        return {"outcome": f"connect failed: {type(exc).__name__}", "held_s": 0.0}
    answer, stopped = asyncio.create_task(reader.read(200)), asyncio.create_task(stop.wait())
    try:
        writer.write(headers(1_000_000, envelope))
        while not stop.is_set() and not answer.done():
            await asyncio.wait([answer, stopped], timeout=drip_s, return_when=asyncio.FIRST_COMPLETED)
            if not answer.done() and not stop.is_set():
                writer.write(b"x")
        head = answer.result() if answer.done() else b""
    except OSError as exc:
        head = type(exc).__name__.encode()
    finally:
        answer.cancel()
        stopped.cancel()
        writer.close()
    status = head.split(b" ", 2)[1].decode(errors="replace") if head.startswith(b"HTTP/") else (
        "closed" if answer.done() else "held to the end")
    return {"outcome": status, "held_s": time.monotonic() - opened}


async def slow_headers(host: str, port: int, source: str, drip_s: float, stop: asyncio.Event) -> dict[str, Any]:
    """A request line, then one header byte per ``drip_s``; a new connection whenever one is cut."""
    outcomes: dict[str, int] = {}
    while not stop.is_set():
        try:
            reader, writer = await open_from(host, port, source)
        except OSError as exc:
            outcomes[f"connect failed: {type(exc).__name__}"] = outcomes.get(f"connect failed: {type(exc).__name__}", 0) + 1
            await asyncio.sleep(drip_s)
            continue
        answer, stopped = asyncio.create_task(reader.read(200)), asyncio.create_task(stop.wait())
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
            while not stop.is_set() and not answer.done():
                await asyncio.wait([answer, stopped], timeout=drip_s, return_when=asyncio.FIRST_COMPLETED)
                if not answer.done() and not stop.is_set():
                    writer.write(b"a")
            head = answer.result() if answer.done() else b"held"
        except OSError as exc:
            head = type(exc).__name__.encode()
        finally:
            answer.cancel()
            stopped.cancel()
            writer.close()
        kind = "503" if b" 503 " in head[:20] else "held to the end" if head == b"held" else "cut"
        outcomes[kind] = outcomes.get(kind, 0) + 1
    return {"outcomes": outcomes}


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


async def scenario(name: str, attack, daemons: Daemons, ctx: dict[str, Any], args: argparse.Namespace
                   ) -> dict[str, Any]:
    rss, probes, events = ctx["rss"], ctx["probes"], ctx["events"]
    before = time.monotonic()
    await asyncio.sleep(args.calm_s)  # a calm window: RSS and rounds before the attack
    start = time.monotonic()
    detail = await attack()
    end = time.monotonic()
    window_end = max(end, start + MIN_WINDOW_S)  # honest traffic and rounds are counted over at least this
    await asyncio.sleep(max(args.cool_s, window_end - time.monotonic()))
    during = rounds_between(events, start, window_end)
    calm = rounds_between(events, before, start)
    return {"code": daemons.code.label, "scenario": name,
            "rss_before_mb": mb(rss.between(before, start), statistics.median),
            "rss_peak_mb": mb(rss.between(start, end + 1.0), max),
            "rss_after_mb": mb(rss.between(time.monotonic() - 1.0, time.monotonic()), statistics.median),
            "attack_s": round(end - start, 1), **{f"honest_{k}": v for k, v in probes.summary(start, window_end).items()},
            "rounds_per_min_calm": round(60 * calm["rounds"] / (start - before), 1),
            "rounds_per_min_attack": round(60 * during["rounds"] / (window_end - start), 1),
            "pgrads_timed_out": during["pgrads_timed_out"], "attack": detail}


async def run_code(code: Code, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    daemons = Daemons(code, work, RUN)
    try:
        l0 = daemons.add("l0", ["peer", "--roles", "learner"])
        daemons.add("l1", ["peer", "--roles", "learner"])
        ready = l0.wait_ready(timeout_s=120)
        l0.wait_event(lambda e: e["event"] == "diloco.round", timeout_s=180)  # training, and both in the view
        host, port = ready["http"].rsplit(":", 1)
        envelope = stranger_envelope(ready["peer_id"], ready["run_id"])
        rss, probes, stop = RssSampler(l0.proc.pid), Probes(), asyncio.Event()
        events: list[tuple[float, dict]] = []

        async def collect() -> None:
            while True:
                events.extend((time.monotonic(), e) for e in l0.poll_events())
                await asyncio.sleep(0.2)

        rss.start()
        tasks = [asyncio.create_task(collect()),
                 asyncio.create_task(probe_loop(lambda: healthz(host, int(port)), probes, stop, 0.25))]
        ctx = {"rss": rss, "probes": probes, "events": events}

        async def big() -> dict[str, Any]:
            results = await asyncio.gather(*(big_body(host, int(port), args.big_mib << 20, envelope)
                                             for _ in range(2)))
            return {"sent_mb": [r["sent_mb"] for r in results], "answers": sorted({r["answer"] for r in results})}

        def slow(sources: list[str]):
            async def attack() -> dict[str, Any]:
                done = asyncio.Event()
                attackers = [asyncio.create_task(slow_body(host, int(port), sources[i % len(sources)], envelope,
                                                           args.drip_s, done))
                             for i in range(args.slow_connections)]
                await asyncio.sleep(args.slow_s)
                done.set()
                results = await asyncio.gather(*attackers)
                outcomes: dict[str, int] = {}
                for result in results:
                    outcomes[result["outcome"]] = outcomes.get(result["outcome"], 0) + 1
                return {"connections": outcomes,
                        "median_held_s": round(statistics.median(r["held_s"] for r in results), 1)}
            return attack

        async def headers_attack() -> dict[str, Any]:
            done = asyncio.Event()
            sources = [f"127.0.1.{i}" for i in range(1, 17)]
            attackers = [asyncio.create_task(slow_headers(host, int(port), sources[i % 16], args.drip_s, done))
                         for i in range(args.slow_connections)]
            await asyncio.sleep(args.slow_s)
            done.set()
            totals: dict[str, int] = {}
            for result in await asyncio.gather(*attackers):
                for kind, count in result["outcomes"].items():
                    totals[kind] = totals.get(kind, 0) + count
            return {"connections": totals}

        rows = [await scenario(f"{args.big_mib} MiB bodies x2, fake envelope", big, daemons, ctx, args),
                await scenario(f"{args.slow_connections} slow bodies (1 B/{args.drip_s:g} s), one address",
                               slow([ATTACKER]), daemons, ctx, args),
                await scenario(f"{args.slow_connections} slow headers (reconnecting), 16 addresses",
                               headers_attack, daemons, ctx, args)]
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await rss.stop()
        return rows
    finally:
        daemons.stop()


async def main(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="chaos-http-") as scratch:
        codes = [Code(label="fixed (this checkout)")]
        if args.baseline_ref:
            codes.insert(0, baseline_code(args.baseline_ref, Path(scratch)))
        for index, code in enumerate(codes):
            rows += await run_code(code, args, Path(scratch) / f"run{index}")
    columns = [("scenario", "attack"), ("code", "code"), ("rss_before_mb", "RSS before (MB)"),
               ("rss_peak_mb", "RSS peak (MB)"), ("rss_after_mb", f"RSS {args.cool_s:g} s after (MB)"),
               ("honest_served_pct", "honest served %"), ("honest_p50_ms", "p50 ms"), ("honest_p95_ms", "p95 ms"),
               ("honest_failures", "honest failures"), ("rounds_per_min_calm", "rounds/min calm"),
               ("rounds_per_min_attack", "rounds/min attacked"), ("pgrads_timed_out", "pgrads timed out"),
               ("attack", "what the attacker saw")]
    write_report("http_slots" + ("_long" if args.long else ""), rows, columns,
                 {"args": vars(args), "note": "l0's RSS; honest = GET /healthz every 0.25 s from 127.0.0.1"})


MIN_WINDOW_S = 5.0


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
