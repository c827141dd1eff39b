"""Relay rows of the transport benchmark (``transport.py --relay``, root): one gossamer TCP request
between network namespaces, direct vs relayed (spliced and copied), unshaped and shaped, each
side a ``_relay_peer.py`` process in its namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import BenchError, summarize

from gossamer_harness.netns import NetLab
from gossamer_harness.report import markdown_table

PEER = str(Path(__file__).resolve().parent / "_relay_peer.py")
HOSTS = {"a": False, "b": False, "relay": False, "n0": True, "n1": True}


class _Proc:
    def __init__(self, lab: NetLab, host: str, *args: str) -> None:
        self.proc = subprocess.Popen([*lab.wrapper(host), sys.executable, PEER, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise BenchError(f"a relay benchmark process exited (code {self.proc.wait()})")
        return json.loads(line)

    def go(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


MODES = {"relayed": "splice", "relayed_copy": "copy"}


def _pairs(lab: NetLab, size: int, relay_ports: dict[str, int]) -> tuple[dict[str, _Proc], list[_Proc]]:
    ip = lab.addresses
    receivers = {"direct": _Proc(lab, "b", "receiver", ip["b"])}
    for name, mode in MODES.items():
        receivers[name] = _Proc(lab, "n1", "receiver", ip["n1"], ip["relay"], str(relay_ports[mode]), mode)
    senders = {name: _Proc(lab, "a" if name == "direct" else "n0", "sender", ip["b"] if name == "direct" else ip["relay"],
                           str(rx.read()["port"]), str(size)) for name, rx in receivers.items()}
    for sender in senders.values():
        sender.read()
    return senders, list(receivers.values())


def _measure(senders: dict[str, _Proc], repeats: int, log) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {name: [] for name in senders}
    for rep in range(repeats + 1):
        for name, sender in senders.items():
            result = sender.go()
            if not result["ok"]:
                raise BenchError(f"{name}: the receiver did not get the payload intact")
            if rep:
                seconds[name].append(result["seconds"])
                log(f"{name}: {result['seconds']:.3f} s")
    return seconds


def relay_rows(*, size_bytes: int, shaped_size_bytes: int, repeats: int, shaped_repeats: int, rate_mbit: float,
               log) -> dict[str, Any]:
    """Rows ``tcp_ns_direct``, ``tcp_ns_relayed`` and, with every egress at ``rate_mbit``, the
    ``_shaped`` pair; each a ``summarize`` dict."""
    why = NetLab.unavailable()
    if why:
        raise BenchError(f"relay rows need network namespaces: {why}")
    lab = NetLab.create(f"gsb{os.getpid() % 100000}", HOSTS)
    procs: list[_Proc] = []
    rows: dict[str, Any] = {}
    try:
        relay_ports = {}
        for mode in MODES.values():
            relay = _Proc(lab, "relay", "relay", lab.addresses["relay"], mode)
            procs.append(relay)
            relay_ports[mode] = relay.read()["port"]
        for suffix, size, reps in (("", size_bytes, repeats), ("_shaped", shaped_size_bytes, shaped_repeats)):
            if suffix:
                for host in HOSTS:
                    lab.shape(host, rate_mbit)
            senders, receivers = _pairs(lab, size, relay_ports)
            procs.extend([*senders.values(), *receivers])
            for name, seconds in _measure(senders, reps, log).items():
                rows[f"tcp_ns_{name}{suffix}"] = {**summarize(seconds, size), "repeats": reps, "warmup_reps": 1}
    finally:
        for proc in reversed(procs):
            proc.stop()
        lab.aclose()
    return rows


def relay_table(rows: dict[str, Any], rate_mbit: float) -> str:
    """The markdown table of the relay rows: each relayed path's MB/s and its ratio to direct."""
    lines = []
    for suffix, link in (("", "veth (no cap)"), ("_shaped", f"{rate_mbit:g} Mbit/s tbf")):
        direct = rows[f"tcp_ns_direct{suffix}"]
        line = [link, f"{direct['payload_bytes'] / 1e6:.0f}", f"{direct['median_mb_per_s']:.1f}"]
        for name in MODES:
            relayed = rows[f"tcp_ns_{name}{suffix}"]
            line += [f"{relayed['median_mb_per_s']:.1f}", f"{relayed['median_mb_per_s'] / direct['median_mb_per_s']:.2f}"]
        lines.append(line)
    return markdown_table(["link", "MB", "direct MB/s", "relayed (splice) MB/s", "splice / direct",
                           "relayed (copy) MB/s", "copy / direct"], lines)
