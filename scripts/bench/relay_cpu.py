"""CPU seconds the relay path costs per relayed byte, spliced vs copied, on loopback (Linux, no
root); CPU seconds show what the splice saves where a wall-clock ratio is noise::

    nice -n 10 .venv/bin/python scripts/bench/relay_cpu.py [--size_mb 100] [--repeats 5] [--rounds 2]"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

PEER = str(Path(__file__).resolve().parent / "_relay_peer.py")
HOST = "127.0.0.1"


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, PEER, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _read(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"a relay benchmark process exited (code {proc.wait()})")
    return json.loads(line)


def _go(proc: subprocess.Popen[str]) -> float:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    result = _read(proc)
    if not result["ok"]:
        raise SystemExit("the receiver did not get the payload intact")
    return result["seconds"]


def _cpu_s(proc: subprocess.Popen[str]) -> float:
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(mode: str, size_bytes: int, repeats: int) -> dict[str, float]:
    relay = _start("relay", HOST, mode)
    procs = [relay]
    try:
        receiver = _start("receiver", HOST, HOST, str(_read(relay)["port"]), mode)
        procs.append(receiver)
        sender = _start("sender", HOST, str(_read(receiver)["port"]), str(size_bytes))
        procs.append(sender)
        _read(sender)
        _go(sender)
        before = [_cpu_s(p) for p in procs]
        seconds = [_go(sender) for _ in range(repeats)]
        used = [(_cpu_s(p) - b) / repeats for p, b in zip(procs, before, strict=True)]
    finally:
        for proc in reversed(procs):
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=30)
    return {"relay_cpu_s": used[0], "receiver_cpu_s": used[1], "sender_cpu_s": used[2],
            "median_s": statistics.median(seconds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size_mb", type=float, default=100.0, help="request size in MB (10^6 bytes)")
    parser.add_argument("--repeats", type=int, default=5, help="timed requests per round and mode")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of splice then copy")
    args = parser.parse_args()
    print("| round | path | relay CPU s | receiver + relay client CPU s | sender CPU s | median wall s |")
    print("| ---: | :--- | ---: | ---: | ---: | ---: |")
    for round_ in range(1, args.rounds + 1):
        for mode in ("splice", "copy"):
            row = measure(mode, int(args.size_mb * 1e6), args.repeats)
            print(f"| {round_} | {mode} | {row['relay_cpu_s']:.3f} | {row['receiver_cpu_s']:.3f} | "
                  f"{row['sender_cpu_s']:.3f} | {row['median_s']:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
