"""Issue 30 item 10, before and after: a ``SecureLinkServer`` behind a ``TcpServer`` on 127.0.0.1 (one
process per code); an old hello replayed from 8 connections 300 times between an honest hello and
its confirmation, then as fast as it can while the client sets up links again and again::

    nice -n 10 .venv/bin/python scripts/chaos/handshake_replay.py [--baseline_ref fc3d6c3] [--long]"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import Code, baseline_code, write_report

RUN = "replay@00112233aabbccdd"
METHOD = "replay-test"


async def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Both attacks against the gossamer importable here; its figures."""
    from gossamer.crypto.handshake import Initiator
    from gossamer.crypto.identity import Identity
    from gossamer.peer.kit import secure_link
    from gossamer.peer.kit.secure_link import LinkMessage, SecureLink, SecureLinkServer
    from gossamer.transport.frames import Frame, FrameType
    from gossamer.transport.tcp import TcpServer, tcp_connect

    cookies = hasattr(secure_link, "COOKIE")
    client, server_id = Identity.generate(), Identity.generate()

    async def echo(peer_id: str, message: LinkMessage) -> LinkMessage:
        return LinkMessage(message.op, message.step, {})

    link_server = SecureLinkServer(identity=server_id, run_id=RUN, method=METHOD, authorize=lambda _: client.public_key,
                                   handler=echo)
    received: list[Frame] = []

    async def dispatch(frame: Frame, info: Any) -> Frame:
        if frame.header.get("op") == "hello":
            received.append(Frame(frame.type, dict(frame.header), bytes(frame.payload)))
        return await link_server.serve(frame, info)

    tcp = await TcpServer.create(dispatch, gate=lambda kind, header, size: link_server.admit(header, size))
    address = f"127.0.0.1:{tcp.address[1]}"

    async def connect() -> SecureLink:
        return await SecureLink.connect(identity=client, run_id=RUN, peer_id=server_id.peer_id,
                                        public_key=server_id.public_key, address=address, method=METHOD, timeout_s=10.0)

    await (await connect()).aclose()
    captured = received[0]
    attackers = [await tcp_connect(*tcp.address) for _ in range(8)]
    answered = refused = 0

    async def replay(conn: Any, times: int) -> None:
        nonlocal answered, refused
        for _ in range(times):
            try:
                await conn.request(captured, timeout_s=10.0)
                answered += 1
            except Exception:  # every refusal counts, whatever its type
                refused += 1

    # (a) the worst case: the replays land between the honest hello and its confirmation
    completed, cpu_started = 0, time.process_time()
    for _ in range(args.trials):
        conn = await tcp_connect(*tcp.address)
        try:
            nonce = None
            if cookies:
                nonce = bytes((await conn.request(Frame(FrameType.REQUEST, {"method": METHOD, "op": "cookie"}, b""))
                               ).payload)
            handshake = Initiator(client, peer_public_key=server_id.public_key, run_id=RUN, nonce=nonce)
            answer = await conn.request(Frame(FrameType.REQUEST, {"method": METHOD, "op": "hello",
                                                                  "peer": client.peer_id}, handshake.hello()))
            await asyncio.gather(*(replay(a, args.replays // len(attackers) + 1) for a in attackers))
            ack = await conn.request(Frame(FrameType.REQUEST, {"method": METHOD, "op": "confirm",
                                                               "sid": answer.header["sid"]},
                                           handshake.confirm(bytes(answer.payload))))
            handshake.finish(bytes(ack.payload))
            completed += 1
        except Exception:  # the honest handshake failed: what is counted
            pass
        finally:
            await conn.aclose()
    worst = {"trials": args.trials, "completed": completed, "replays_answered": answered,
             "replays_refused": refused, "cpu_ms_per_replay": round(1000 * (time.process_time() - cpu_started)
                                                                     / max(1, answered + refused), 3)}

    # (b) a flood while the client sets up links again and again
    answered = refused = 0
    stop = asyncio.Event()

    async def flood(conn: Any) -> None:
        while not stop.is_set():
            await replay(conn, 1)

    floods = [asyncio.create_task(flood(a)) for a in attackers]
    ok = failed = 0
    deadline = time.monotonic() + args.flood_s
    while time.monotonic() < deadline:
        try:
            await (await connect()).aclose()
            ok += 1
        except Exception:  # the honest link failed: what is counted
            failed += 1
    stop.set()
    await asyncio.gather(*floods, return_exceptions=True)
    for conn in attackers:
        await conn.aclose()
    await tcp.aclose()
    flood_row = {"links": ok + failed, "completed": ok, "replays_answered": answered, "replays_refused": refused}
    return {"worst": worst, "flood": flood_row}


def run_worker(code: Code, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", "--trials", str(args.trials), "--replays", str(args.replays),
               "--flood_s", str(args.flood_s)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=code.env,
                         cwd=Path(__file__).parent).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="chaos-replay-") as scratch:
        codes = [Code(label="fixed (this checkout)")]
        if args.baseline_ref:
            codes.insert(0, baseline_code(args.baseline_ref, Path(scratch)))
        for code in codes:
            result = run_worker(code, args)
            worst, flood = result["worst"], result["flood"]
            rows.append({"code": code.label, "scenario": f"{args.replays} replays between hello and confirm",
                         "honest_completed_pct": round(100 * worst["completed"] / worst["trials"], 1),
                         "replays_answered": worst["replays_answered"], "replays_refused": worst["replays_refused"],
                         "cpu_ms_per_replay": worst["cpu_ms_per_replay"]})
            rows.append({"code": code.label, "scenario": f"replay flood from 8 connections, {args.flood_s:g} s",
                         "honest_completed_pct": round(100 * flood["completed"] / max(1, flood["links"]), 1),
                         "replays_answered": flood["replays_answered"], "replays_refused": flood["replays_refused"],
                         "honest_links": flood["links"]})
    columns = [("scenario", "attack"), ("code", "code"), ("honest_completed_pct", "honest handshakes completed %"),
               ("honest_links", "honest links tried"), ("replays_answered", "replays answered (signature checked)"),
               ("replays_refused", "replays refused"), ("cpu_ms_per_replay", "CPU ms per replay (both ends)")]
    write_report("handshake_replay" + ("_long" if args.long else ""), rows, columns,
                 {"args": vars(args), "note": "SecureLinkServer behind TcpServer on 127.0.0.1, one process per code"})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline_ref", default="", help="git ref of the code before the fix (e.g. fc3d6c3)")
    parser.add_argument("--long", action="store_true", help="more trials, a longer flood")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--replays", type=int, default=300)
    parser.add_argument("--flood_s", type=float, default=10.0)
    args = parser.parse_args()
    if args.long:
        args.trials, args.flood_s = 20, 60.0
    return args


if __name__ == "__main__":
    parsed = parse()
    if parsed.worker:
        print(json.dumps(asyncio.run(worker(parsed))))
    else:
        main(parsed)
