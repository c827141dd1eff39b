"""Issue 30 item 4 on a live relay volunteer (a DiLoCo learner run with ``--relay``): Sybils filling
its allocations, raw sockets flooding its attach and control ports and leaving; its fds, log and
life, and an honest private peer relayed meanwhile, on a ref from before the fix and this checkout::

    nice -n 10 .venv/bin/python scripts/chaos/relay_attacks.py [--baseline_ref HEAD] [--connections N]"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import resource
import select
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _harness import ATTACKER, Code, baseline_code

from gossamer.crypto.challenge import answer_challenge
from gossamer.crypto.identity import Identity
from gossamer.peer.run.records import PRIVATE, PeerRecord, seal_record
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.relay import RelayClient
from gossamer.transport.tcp import TcpConfig, TcpServer, tcp_connect
from gossamer_harness.localproc import LOOPBACK, GossamerProcess
from gossamer_harness.report import load_average_text, machine, markdown_table, write_json

RESULTS = Path(__file__).parent / "results"
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux
SYBILS = 16

RUN = """
[run]
name = "chaos-relay"
protocol = "diloco"
heartbeat_s = 2.0
[model]
d_model = 32
n_layers = 1
n_heads = 2
context = 32
[hyper]
rounds = 0
batch_size = 8
w1_grace_s = 1.0
w2_deadline_s = 5.0
eval_batches = 1
min_learners = 1
[hyper.diloco]
inner_steps = 2
inner_lr = 0.005
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fds_of(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


class FdSampler(threading.Thread):
    """The relay's open descriptors, every 0.1 s, as (monotonic time, count)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.samples, self.stop = pid, [], threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.samples.append((time.monotonic(), fds_of(self.pid)))

    def peak(self, start: float, end: float) -> int:
        return max((n for t, n in self.samples if start <= t <= end), default=-1)


async def echo(frame: Frame, info: object) -> Frame:
    return Frame(FrameType.RESPONSE, {"n": len(b"".join(bytes(v) for v in frame.payload_views()))})


def auth_of(who: Identity, now: float) -> bytes:
    """``who``'s signed record, claiming what a private peer's self-test says (as every Sybil will)."""
    return seal_record(who, PeerRecord(peer_id=who.peer_id, public_key=who.public_key, name="", roles=("learner",),
                                       http_addr="127.0.0.1:9", tcp_addr="127.0.0.1:9", version="x", round=0,
                                       timestamp=now, reachability=PRIVATE))


async def raw_allocate(relay: tuple[str, int], name: str, source: str) -> tuple[dict, asyncio.StreamWriter]:
    """A Sybil's allocation by hand from ``source``: the relay's answer and the control connection."""
    reader, writer = await asyncio.open_connection(*relay, local_addr=(source, 0))
    challenge = json.loads(await asyncio.wait_for(reader.readline(), 10.0))
    who = Identity.generate()
    proof = answer_challenge(who, nonce=base64.b64decode(challenge["nonce"]), audience=name, now=time.time())
    writer.write(json.dumps({"op": "allocate", "services": 1, "auth": base64.b64encode(auth_of(who, time.time())).decode(),
                             "proof": base64.b64encode(proof).decode()}).encode() + b"\n")
    line = await asyncio.wait_for(reader.readline(), 10.0)
    return (json.loads(line) if line else {"ok": False, "error": "closed"}), writer


async def relayed(port: int) -> str:
    """One honest request through the relay to the private peer's echo server."""
    try:
        connection = await tcp_connect("127.0.0.1", port, config=TcpConfig(connect_timeout_s=5.0, request_timeout_s=5.0))
    except Exception as exc:  # every failure is an outcome to count, whatever its type
        return type(exc).__name__
    try:
        answer = await connection.request(Frame(FrameType.REQUEST, {}, b"x" * 1000))
        return "served" if answer.header.get("n") == 1000 else "wrong answer"
    except Exception as exc:  # as above
        return type(exc).__name__
    finally:
        await connection.aclose()


def flood(target: tuple[str, int], count: int, wait_s: float) -> tuple[list[socket.socket], dict[str, int]]:
    """``count`` raw TCP connections to ``target`` from ``ATTACKER``, not one byte sent; the sockets
    (held by the caller) and how their connects went."""
    socks: list[socket.socket] = []
    outcome = {"connected": 0, "failed": 0}
    for _ in range(count):
        sock = socket.socket()
        try:
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)  # the port at connect: binds stay O(1)
            sock.bind((ATTACKER, 0))
            sock.setblocking(False)
            sock.connect_ex(target)
        except OSError:
            sock.close()
            outcome["failed"] += 1
            continue
        socks.append(sock)
    poller, pending = select.poll(), {s.fileno(): s for s in socks}
    for fd in pending:
        poller.register(fd, select.POLLOUT)
    deadline = time.monotonic() + wait_s
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(200):
            poller.unregister(fd)
            sock = pending.pop(fd)
            outcome["connected" if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 else "failed"] += 1
    outcome["still connecting"] = len(pending)
    return socks, outcome


def closed_by_peer(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the relay has closed (EOF or reset waiting to be read)."""
    closed = 0
    for sock in socks:
        try:
            closed += sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    return closed


class Relay:
    """An orchestrator and one learner volunteering a relay, on ``code``, the learner's fds capped at ``nofile``."""

    def __init__(self, code: Code, work: Path, nofile: int) -> None:
        work.mkdir(parents=True, exist_ok=True)
        (work / "run.toml").write_text(RUN)
        common = ["--events", *LOOPBACK, "--threads", "1", "--checkpoint_dir", str(work / "ckpt")]
        self.orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", *common,
                                     "--identity_path", str(work / "owner.pem")], log_path=work / "orch.log", env=code.env)
        ready = self.orch.wait_ready(timeout_s=180)
        self.port = free_port()
        self.identity = Identity.create(work / "relay.pem")
        self.proc = GossamerProcess(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--roles",
                                     "learner", "--relay", "--relay_port", str(self.port), *common, "--identity_path",
                                     str(work / "relay.pem")], log_path=work / "relay.log", env=code.env,
                                    wrapper=("prlimit", f"--nofile={nofile}:{nofile}"))
        self.proc.wait_ready(timeout_s=180)
        self.address = ("127.0.0.1", self.port)

    def stop(self) -> int:
        code = self.proc.stop()
        self.orch.stop()
        return code


async def probe_while(port: int, stop: asyncio.Event, outcomes: dict[str, int]) -> None:
    while not stop.is_set():
        outcome = await relayed(port)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass


async def attack_port(relay: Relay, target: tuple[str, int], honest_port: int, args: argparse.Namespace,
                      connections: int) -> dict[str, Any]:
    """Flood ``target``, hold, leave; the relay's fds, log and honest traffic through it meanwhile."""
    sampler = FdSampler(relay.proc.proc.pid)
    sampler.start()
    log_before, tracebacks_before = relay.proc.log_bytes(), relay.proc.log().count("Traceback")
    fds_before, probes, stop = fds_of(relay.proc.proc.pid), {}, asyncio.Event()
    prober = asyncio.create_task(probe_while(honest_port, stop, probes))
    start = time.monotonic()
    socks, outcome = await asyncio.to_thread(flood, target, connections, args.connect_wait_s)
    await asyncio.sleep(args.hold_s)
    outcome["closed by the relay while held"] = closed_by_peer(socks)
    for sock in socks:
        sock.close()
    left = time.monotonic()
    await asyncio.sleep(args.settle_s)
    stop.set()
    await prober
    sampler.stop.set()
    sampler.join()
    log = relay.proc.log()
    return {"connections_tried": connections, "attacker": outcome, "fds_before": fds_before,
            "fds_peak": sampler.peak(start, left), "fds_after": fds_of(relay.proc.proc.pid),
            "log_bytes": relay.proc.log_bytes() - log_before, "tracebacks": log.count("Traceback") - tracebacks_before,
            "emfile_lines": log.count("Too many open files"), "alive": relay.proc.proc.poll() is None,
            "honest_relayed": probes}


async def run_code(code: Code, work: Path, args: argparse.Namespace, nofile: int, connections: int) -> dict[str, Any]:
    relay = Relay(code, work, nofile)
    server = await TcpServer.create(echo)
    row: dict[str, Any] = {"code": code.label, "relay_nofile": nofile}
    honest = None
    try:
        name = relay.identity.peer_id
        sybils = [await raw_allocate(relay.address, name, ATTACKER) for _ in range(SYBILS)]
        row["sybil_allocations"] = sum(answer.get("ok") is True for answer, _ in sybils)
        me = Identity.generate()
        try:
            honest = await RelayClient.connect(relay.address, relay_name=name, identity=me,
                                               auth=auth_of(me, time.time()), targets=[server.address])
            row["honest_allocation_beside_sybils"] = "allocated"
        except Exception as exc:  # the refusal is the outcome
            row["honest_allocation_beside_sybils"] = f"{type(exc).__name__}: {str(exc)[-60:]}"
        attach_port = next((a["attach_port"] for a, _ in sybils if a.get("ok")), None)
        for _, writer in sybils[1:]:  # one Sybil stays: where the attach port is, the attacker knows
            writer.close()
        if honest is None:
            honest = await RelayClient.connect(relay.address, relay_name=name, identity=me,
                                               auth=auth_of(me, time.time()), targets=[server.address])
        port = honest.ports[0]
        row["honest_before"] = await relayed(port)
        if attach_port is not None:
            row["attach_flood"] = await attack_port(relay, ("127.0.0.1", attach_port), port, args, connections)
        if relay.proc.proc.poll() is None:
            row["control_flood"] = await attack_port(relay, relay.address, port, args, connections)
        row["honest_after"] = await relayed(port)
        sybils[0][1].close()
    finally:
        if honest is not None:
            await honest.aclose()
        await server.aclose()
        row["relay_alive_at_the_end"] = relay.proc.proc.poll() is None
        row["relay_exit_code"] = relay.stop()
        log = relay.proc.log()
        row["checkpoint_failed"] = "could not write its checkpoint" in log
        row["log_bytes_total"] = len(log.encode())
        row["log_kinds"] = log_kinds(log)
        row["log_tail"] = log[-1200:]
    return row


def log_kinds(log: str, top: int = 10) -> dict[str, int]:
    """The most frequent kinds of log line (digits and hex ids blurred), tracebacks' bodies left out."""
    counts: dict[str, int] = {}
    for line in log.splitlines():
        if not line or line[0].isspace() or line.startswith(("Traceback", "During handling", "The above")):
            continue
        kind = re.sub(r"[0-9a-f]{8,}|\d+", "#", line)[:120]
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:top])


def summary(rows: list[dict[str, Any]]) -> str:
    header = ["code", "relay fds cap", "attack", "attacker connected", "relay fds before / peak / after",
              "log bytes", "tracebacks", "honest relayed", "alive after", "exit code"]
    lines = []
    for row in rows:
        for attack in ("attach_flood", "control_flood"):
            a = row.get(attack)
            if a is None:
                continue
            lines.append([row["code"], row["relay_nofile"], f"{a['connections_tried']:,} to the {attack.split('_')[0]} port",
                          a["attacker"]["connected"], f"{a['fds_before']} / {a['fds_peak']} / {a['fds_after']}",
                          f"{a['log_bytes']:,}", a["tracebacks"], ", ".join(f"{k}: {v}" for k, v in a["honest_relayed"].items()),
                          a["alive"], row["relay_exit_code"]])
        lines.append([row["code"], row["relay_nofile"], f"{SYBILS} Sybils allocate", row.get("sybil_allocations"), "", "",
                      "", f"then an honest peer: {row.get('honest_allocation_beside_sybils')}", "", ""])
    return markdown_table(header, lines)


def after_code(source: Path | None, scratch: Path) -> Code:
    """This checkout, or the one at ``source`` first on PYTHONPATH (as ``_harness.baseline_code`` does a ref)."""
    if source is None:
        return Code(label="fixed (this checkout)")
    shim = scratch / "after" / "gossamer"
    shim.mkdir(parents=True)
    shutil.copy(source / "peer" / "_gossamer" / "__init__.py", shim / "__init__.py")
    for layer in ("peer", "protocols", "transport", "crypto"):
        (shim / layer).symlink_to(source.resolve() / layer)
    return Code(label=f"fixed ({source})", env={**os.environ, "PYTHONPATH": str(shim.parent)})


async def main_async(args: argparse.Namespace, save: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="chaos-relay-") as scratch:
        codes = [] if args.only_baseline else [after_code(args.after_source, Path(scratch))]
        if args.baseline_ref:
            codes.insert(0, baseline_code(args.baseline_ref, Path(scratch)))
        for i, code in enumerate(codes):
            for j, (nofile, connections) in enumerate(args.variants):
                rows.append(await run_code(code, Path(scratch) / f"run{i}-{j}", args, nofile, connections))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "log_tail"}, default=str), flush=True)
                save(rows, complete=False)  # what is measured so far survives an interrupted run
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline_ref", default="", help="git ref of the code before the fix (none: only this checkout)")
    parser.add_argument("--after_source", type=Path, help="run the fixed daemons from this checkout (default: this one)")
    parser.add_argument("--only_baseline", action="store_true", help="run only the baseline")
    parser.add_argument("--connections", type=int, default=19_500,
                        help="connections per flood, at most what this process's fd limit allows (less 500)")
    parser.add_argument("--past_limit", type=int, nargs=2, default=[4096, 6000], metavar=("NOFILE", "CONNECTIONS"),
                        help="also run the relay at this fd limit under this many connections (0 0: not)")
    parser.add_argument("--hold_s", type=float, default=10.0, help="how long the attacker holds its connections")
    parser.add_argument("--connect_wait_s", type=float, default=60.0, help="how long its connects may take")
    parser.add_argument("--settle_s", type=float, default=10.0, help="how long after it left the fds are read")
    parser.add_argument("--name", default="relay_attacks", help="result file: results/<name>.json")
    args = parser.parse_args()
    own_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    connections = min(args.connections, own_limit - 500)
    args.variants = [(own_limit, connections)] + ([tuple(args.past_limit)] if args.past_limit[0] else [])
    started = machine()

    def save(rows: list[dict[str, Any]], *, complete: bool = True) -> Path:
        return write_json(RESULTS / f"{args.name}.json",
                          {"meta": {"command": " ".join(sys.argv), "attacker_nofile": own_limit, "connections": connections,
                                    "variants": args.variants, "hold_s": args.hold_s, "settle_s": args.settle_s,
                                    "load_average_end": load_average_text(), "complete": complete},
                           "machine": started, "rows": rows})

    rows = asyncio.run(main_async(args, save))
    print(f"\nload average (1/5/15 min) at the end {load_average_text()}; attacker's fd limit {own_limit}\n")
    print(summary(rows))
    print(f"wrote {save(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
