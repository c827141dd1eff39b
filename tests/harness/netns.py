"""Network namespaces for NAT tests and benchmarks (``NetLab``): hosts on one private bridge, some
of them "behind NAT" (they open connections out, nobody opens one in), optionally on a shaped link.
Needs root and iproute2; ``NetLab.unavailable()`` says why not when it cannot work here."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

from gossamer.peer.errors import PeerError

SUBNET = "10.77.0"
SYN_WITHOUT_ACK = ["match", "ip", "protocol", "6", "0xff", "match", "u8", "0x02", "0x12", "at", "33"]


class NetLabError(PeerError):
    """A namespace command failed; the message has the command and its stderr."""


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetLabError(f"{' '.join(args)}: {done.stderr.strip()}")


@dataclass
class NetLab:
    """Namespaces of one test. ``create(prefix, hosts)`` builds a switch namespace holding a bridge
    and one namespace per host, joined to it by a veth pair and numbered ``10.77.0.<i+1>/24``. A
    host marked private gets a stateless filter on the bridge port towards it (``tc``: a u32 match
    sends every TCP SYN without ACK, i.e. every connection someone else opens to it, to a queue of
    length 0) while its own outbound connections work (their SYN+ACK answers pass): what a NAT or
    a default-deny firewall does to inbound connections. ``tc`` rather than nftables: it ships with
    iproute2, which namespaces need anyway, and needs no netfilter or tc action modules (this
    kernel has neither). ``shape(host, rate_mbit)`` puts a token-bucket filter on a host's egress;
    ``wrapper(host)`` runs a command there; ``aclose`` removes everything."""

    prefix: str
    hosts: dict[str, str] = field(default_factory=dict)  # host name -> namespace
    addresses: dict[str, str] = field(default_factory=dict)  # host name -> IPv4 address

    @staticmethod
    def unavailable() -> str:
        """Why namespaces cannot be built here ("" when they can)."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                return f"the {tool} command (iproute2) is not installed"
        probe = f"gsprobe{os.getpid()}"
        try:
            _run("ip", "netns", "add", probe)
        except (NetLabError, OSError) as exc:
            return f"cannot create a network namespace: {exc}"
        _run("ip", "netns", "del", probe)
        return ""

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    @classmethod
    def create(cls, prefix: str, hosts: dict[str, bool]) -> NetLab:
        """Hosts by name, each True when it is private (behind NAT)."""
        lab = cls(prefix)
        try:
            _run("ip", "netns", "add", lab.switch)
            _run("ip", "-n", lab.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", lab.switch, "link", "set", "br0", "up")
            for index, (name, private) in enumerate(hosts.items()):
                lab._add_host(index, name, private)
        except BaseException:
            lab.aclose()
            raise
        return lab

    def _add_host(self, index: int, name: str, private: bool) -> None:
        ns, address = f"{self.prefix}-{name}", f"{SUBNET}.{index + 1}"
        _run("ip", "netns", "add", ns)
        self.hosts[name], self.addresses[name] = ns, address
        _run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"v{index}", "netns", self.switch)
        _run("ip", "-n", self.switch, "link", "set", f"v{index}", "master", "br0", "up")
        _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        if private:
            self._drop_inbound(f"v{index}")

    def _drop_inbound(self, port: str) -> None:
        """On the bridge port towards a private host: SYNs without ACK go to a class whose queue
        holds nothing (dropped), everything else to a class as fast as the link."""
        tc = ("tc", "-n", self.switch)
        _run(*tc, "qdisc", "add", "dev", port, "root", "handle", "1:", "htb", "default", "1")
        _run(*tc, "class", "add", "dev", port, "parent", "1:", "classid", "1:1", "htb", "rate", "100gbit")
        _run(*tc, "class", "add", "dev", port, "parent", "1:", "classid", "1:2", "htb", "rate", "8bit", "ceil", "8bit")
        _run(*tc, "qdisc", "add", "dev", port, "parent", "1:2", "handle", "20:", "pfifo", "limit", "0")
        _run(*tc, "filter", "add", "dev", port, "parent", "1:", "protocol", "ip", "u32", *SYN_WITHOUT_ACK,
             "flowid", "1:2")

    def shape(self, name: str, rate_mbit: float) -> None:
        """Cap ``name``'s egress at ``rate_mbit`` (a token-bucket filter)."""
        _run("tc", "-n", self.hosts[name], "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate",
             f"{rate_mbit}mbit", "burst", "256kb", "latency", "100ms")

    def wrapper(self, name: str) -> tuple[str, ...]:
        """The command prefix that runs a process on host ``name``."""
        return ("ip", "netns", "exec", self.hosts[name])

    def aclose(self) -> None:
        for ns in [*self.hosts.values(), self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.hosts.clear()
