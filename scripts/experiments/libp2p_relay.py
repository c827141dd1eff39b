"""Does hivemind's own libp2p circuit relay make a NATed peer reachable? Three hosts in network
namespaces (relay, nat, pub), each a real p2pd under a ``DHTNode``, per option combination (root;
docs/BENCHMARKS.md, "libp2p circuit relay")::

    sudo nice -n 10 .venv/bin/python scripts/experiments/libp2p_relay.py [--wait 30]"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gossamer_harness.report import load_average_text, machine, write_result

RESULTS = Path(__file__).parent / "results"
ECHO = "gossamer-relay-echo"

# name -> (relay options, nat options); pub always uses the defaults (use_relay=True)
COMBOS: dict[str, tuple[dict, dict]] = {
    "A issue's try: relay default, nat auto-relay+private+trusted": (
        {}, {"use_auto_relay": True, "force_reachability": "private", "trusted": True}),
    "B relay forced public, nat auto-relay+private+trusted": (
        {"force_reachability": "public"}, {"use_auto_relay": True, "force_reachability": "private", "trusted": True}),
    "C relay forced public, nat auto-relay+private (relays from bootstrap)": (
        {"force_reachability": "public"}, {"use_auto_relay": True, "force_reachability": "private"}),
    "D relay forced public, nat auto-relay, autonat decides": (
        {"force_reachability": "public"}, {"use_auto_relay": True, "trusted": True}),
    "F relay forced public, nat auto-relay with static relay only (-relayDiscovery=0)+private": (
        {"force_reachability": "public"},
        {"use_auto_relay": True, "force_reachability": "private", "trusted": True, "static": True}),
    "G relay default, nat auto-relay with static relay only+private": (
        {}, {"use_auto_relay": True, "force_reachability": "private", "trusted": True, "static": True}),
    "H relay forced public, nat auto-relay with static relay only, autonat decides": (
        {"force_reachability": "public"}, {"use_auto_relay": True, "trusted": True, "static": True}),
    "E control: relay forced public, nat without auto-relay": (
        {"force_reachability": "public"}, {"force_reachability": "private"}),
}
REASON = re.compile(r"reservation|reachab|autorelay|relay|circuit|autonat|limited|NO_RESERVATION|hop", re.I)


# ---------------------------------------------------------------- driver (one host, one process)

def _wait_path(path: Path, deadline: float) -> bool:
    """Whether ``path`` (written by another host's process) appeared before ``deadline``."""
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


async def _wait_file(path: Path, deadline: float) -> dict:
    if not await asyncio.to_thread(_wait_path, path, deadline):
        raise TimeoutError(f"{path.name} never appeared")
    return json.loads(await asyncio.to_thread(path.read_text))


async def _start(ip: str, log: Path, initial: list[str], opts: dict):
    from hivemind.dht.node import DHTNode
    from hivemind.p2p import P2P

    sink = log.open("w", buffering=1)
    P2P._log_p2pd_message = staticmethod(lambda line: sink.write(line + "\n"))
    kwargs = {k: v for k, v in opts.items() if k not in ("trusted", "static")}
    if opts.get("static"):  # hivemind has no option for it: p2pd's -relayDiscovery (default 1)
        make = P2P._make_process_args
        P2P._make_process_args = staticmethod(lambda *a, **kw: make(*a, **kw, relayDiscovery=False))
    if opts.get("trusted"):
        kwargs["trusted_relays"] = initial
    p2p = await P2P.create(host_maddrs=[f"/ip4/{ip}/tcp/0"], initial_peers=initial, **kwargs)
    node = await DHTNode.create(p2p=p2p, initial_peers=initial)
    return p2p, node


async def _echo(_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    data = await asyncio.wait_for(reader.readexactly(4), 10)
    writer.write(data)
    await writer.drain()
    writer.close()


class _GoMaddr:
    """A multiaddr as go-multiaddr reads it: hivemind's ``Multiaddr.to_bytes`` writes a ``/p2p/``
    component as a CIDv1 (``0x01 0x72`` + multihash), which p2pd rejects ("length greater than
    remaining number of bytes in buffer"); Go expects the bare multihash."""

    def __init__(self, text: str) -> None:
        from hivemind.utils.multiaddr import Multiaddr

        raw, out, i = Multiaddr(text).to_bytes(), bytearray(), 0
        while (at := raw.find(b"\xa5\x03", i)) >= 0 and raw[at + 3:at + 5] == b"\x01\x72":
            out += raw[i:at] + b"\xa5\x03" + bytes([raw[at + 2] - 2])
            i = at + 5
        self.raw = bytes(out + raw[i:])

    def to_bytes(self) -> bytes:
        return self.raw


async def _stream(p2p, peer) -> dict:
    start = time.monotonic()
    try:
        _, reader, writer = await asyncio.wait_for(p2p.call_binary_stream_handler(peer, ECHO), 15)
        writer.write(b"ping")
        await writer.drain()
        ok = await asyncio.wait_for(reader.readexactly(4), 15) == b"ping"
        writer.close()
        return {"ok": ok, "s": round(time.monotonic() - start, 2), "error": ""}
    except Exception as exc:  # the error text is the measurement
        return {"ok": False, "s": round(time.monotonic() - start, 2), "error": f"{type(exc).__name__}: {exc}"[:300]}


async def drive(role: str, ip: str, workdir: Path, spec: dict, wait: float) -> None:
    from hivemind.p2p import PeerID
    deadline = time.monotonic() + wait + 120
    log, stop = workdir / f"{role}.p2pd.log", workdir / "stop"
    if role == "relay":
        p2p, node = await _start(ip, log, [], spec["relay"])
        maddrs = [str(m) for m in await p2p.get_visible_maddrs()]
        (workdir / "relay.json").write_text(json.dumps({"maddrs": maddrs}))
    elif role == "nat":
        relay = await _wait_file(workdir / "relay.json", deadline)
        p2p, node = await _start(ip, log, relay["maddrs"], spec["nat"])
        await p2p.add_binary_stream_handler(ECHO, _echo)
        start, circuit_at, maddrs = time.monotonic(), None, []
        while time.monotonic() - start < wait:
            maddrs = [str(m) for m in await p2p.get_visible_maddrs(latest=True)]
            if any("p2p-circuit" in m for m in maddrs):
                circuit_at = round(time.monotonic() - start, 2)
                break
            await asyncio.sleep(0.25)
        (workdir / "nat.json").write_text(json.dumps(
            {"peer_id": p2p.peer_id.to_base58(), "maddrs": maddrs, "circuit_at": circuit_at}))
    else:
        relay = await _wait_file(workdir / "relay.json", deadline)
        nat = await _wait_file(workdir / "nat.json", deadline)
        p2p, node = await _start(ip, log, relay["maddrs"], {})
        peer = PeerID.from_base58(nat["peer_id"])
        t0 = time.monotonic()
        pinged = await asyncio.wait_for(node.protocol.call_ping(peer), 20)
        result = {"dht_ping": {"ok": pinged is not None, "s": round(time.monotonic() - t0, 2)},
                  "stream_by_id": await _stream(p2p, peer)}
        relay_tcp = next(m for m in relay["maddrs"] if "/tcp/" in m)
        circuit = f"{relay_tcp}/p2p-circuit/p2p/{nat['peer_id']}"
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(p2p._client.connect(peer, [_GoMaddr(circuit)]), 20)
            result["circuit_dial"] = {"ok": True, "s": round(time.monotonic() - t0, 2), "error": ""}
        except Exception as exc:
            result["circuit_dial"] = {"ok": False, "s": round(time.monotonic() - t0, 2),
                                      "error": f"{type(exc).__name__}: {exc}"[:300]}
        result["stream_after_dial"] = await _stream(p2p, peer)
        (workdir / "pub.json").write_text(json.dumps(result))
        stop.write_text("done")
    await asyncio.to_thread(_wait_path, stop, deadline)
    await node.shutdown()
    await p2p.shutdown()


# ---------------------------------------------------------------- orchestrator

def _reasons(log: Path, limit: int = 12) -> list[str]:
    """Distinct relay/autonat-related p2pd log messages, first seen first."""
    seen: dict[str, None] = {}
    if not log.exists():
        return []
    for line in log.read_text(errors="ignore").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        text = f"{rec.get('logger', '')}: {rec.get('msg', '')} {rec.get('error', '')}".strip()
        text = re.sub(r"12D3Koo\w+|Qm\w{40,}", "<peer>", text)
        text = re.sub(r"/ip4/[\d.]+/(tcp|udp)/\d+\S*", "<addr>", text)
        if REASON.search(text) and text not in seen:
            seen[text] = None
    return list(seen)[:limit]


def run_combo(index: int, name: str, relay_opts: dict, nat_opts: dict, wait: float) -> dict:
    from gossamer_harness.netns import NetLab

    lab = NetLab.create(f"p2r{os.getpid() % 1000}x{index}", {"relay": False, "nat": True, "pub": False})
    workdir = Path(tempfile.mkdtemp(prefix="p2prelay-"))
    spec = json.dumps({"relay": relay_opts, "nat": nat_opts})
    env = {**os.environ, "GOLOG_LOG_LEVEL": "debug"}
    procs = []
    try:
        for role in ("relay", "nat", "pub"):
            cmd = [*lab.wrapper(role), sys.executable, __file__, "--role", role, "--ip", lab.addresses[role],
                   "--dir", str(workdir), "--spec", spec, "--wait", str(wait)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=(workdir / f"{role}.out").open("w"),
                                          stderr=subprocess.STDOUT))
        end = time.monotonic() + wait + 150
        while not (workdir / "stop").exists() and time.monotonic() < end and procs[2].poll() is None:
            time.sleep(0.5)
        (workdir / "stop").write_text("stop")
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        lab.aclose()
    nat = json.loads((workdir / "nat.json").read_text()) if (workdir / "nat.json").exists() else {}
    pub = json.loads((workdir / "pub.json").read_text()) if (workdir / "pub.json").exists() else {}
    out_tail = {r: (workdir / f"{r}.out").read_text(errors="ignore")[-600:] for r in ("relay", "nat", "pub")}
    return {"combo": name, "relay_opts": relay_opts, "nat_opts": nat_opts, "nat": nat, "pub": pub,
            "reasons": {r: _reasons(workdir / f"{r}.p2pd.log") for r in ("relay", "nat", "pub")},
            "workdir": str(workdir), "stdout_tail": out_tail if not pub else {}}


def _cell(step: dict | None) -> str:
    if not step:
        return "-"
    return f"yes ({step['s']} s)" if step["ok"] else f"no ({step['s']} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wait", type=float, default=30.0, help="seconds nat waits for a circuit address")
    parser.add_argument("--only", default="", help="run only combos whose name starts with these letters")
    parser.add_argument("--out", default="libp2p_relay.json", help="file name under results/")
    parser.add_argument("--role", choices=("relay", "nat", "pub"))
    parser.add_argument("--ip")
    parser.add_argument("--dir")
    parser.add_argument("--spec")
    args = parser.parse_args()
    if args.role:
        asyncio.run(drive(args.role, args.ip, Path(args.dir), json.loads(args.spec), args.wait))
        return
    before = machine()
    from gossamer_harness.netns import NetLab

    if why := NetLab.unavailable():
        raise SystemExit(f"cannot run: {why}")
    rows = []
    for index, (name, (relay_opts, nat_opts)) in enumerate(COMBOS.items()):
        if args.only and name[0] not in args.only:
            continue
        rows.append(run_combo(index, name, relay_opts, nat_opts, args.wait))
        print(f"done: {name}", file=sys.stderr, flush=True)
    print(f"load average at the end: {load_average_text()}; circuit wait {args.wait:.0f} s\n")
    print("| combination | nat circuit addr | pub DHT ping by id | pub stream by id | pub dials relay circuit "
          "| pub stream after dial |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        nat, pub = row["nat"], row["pub"]
        circ = f"yes ({nat['circuit_at']} s)" if nat.get("circuit_at") is not None else "no"
        print(f"| {row['combo']} | {circ} | {_cell(pub.get('dht_ping'))} | {_cell(pub.get('stream_by_id'))} "
              f"| {_cell(pub.get('circuit_dial'))} | {_cell(pub.get('stream_after_dial'))} |")
    for row in rows:
        print(f"\n{row['combo']}:")
        for step in ("stream_by_id", "circuit_dial", "stream_after_dial"):
            if row["pub"].get(step, {}).get("error"):
                print(f"  {step}: {row['pub'][step]['error']}")
    write_result(RESULTS / args.out, {"wait_s": args.wait, "rows": rows}, before=before, indent=1)


if __name__ == "__main__":
    main()
