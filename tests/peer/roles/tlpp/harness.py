"""An in-process TL++ network for tests: the real orchestrator, helper and node roles, each behind
its own TcpServer on 127.0.0.1 (port 0), found through real signed records in a PeerView.

The roles use neither the DHT nor HTTP, so ``membership`` and ``http_client`` are not built
(None); everything they do use is the real thing. Faults are declared by (peer, step, phase):
``Tlpp.fail(name, step, op)`` makes that peer's server refuse the frame of ``op`` for ``step``
(read from the frame's clear header, before decryption), as a crashed host would leave it
unanswered, and ``Tlpp.kill(name)`` closes a peer's server and sockets. ``Tlpp.received`` keeps
every frame each server got, so a test can replay or tamper with a real one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gossamer.crypto.identity import Identity
from gossamer.peer.config import PeerConfig
from gossamer.peer.metrics import Traffic
from gossamer.peer.role import Role, RoleContext
from gossamer.peer.roles.tlpp.helper import TlppHelperRole
from gossamer.peer.roles.tlpp.node import TlppNodeRole
from gossamer.peer.roles.tlpp.server import TlppServerRole
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.manifest import build_manifest, run_config_from_dict
from gossamer.peer.run.records import PeerRecord, seal_record
from gossamer.peer.run.view import PeerView
from gossamer.transport.frames import Frame
from gossamer.transport.http import HttpConfig
from gossamer.transport.tcp import HandlerError, TcpServer


@dataclass
class Peer:
    name: str
    identity: Identity
    role: Role
    server: TcpServer | None = None
    traffic: Traffic = field(default_factory=Traffic)


class Tlpp:
    """The network of one test; ``await Tlpp.create(...)``, then ``await net.aclose()``."""

    def __init__(self, tmp_path: Path, hyper: dict[str, Any], identities: dict[str, Identity]) -> None:
        self.tmp_path = tmp_path
        self.identities = identities
        self.owner = identities["orchestrator"]
        doc = {"run": {"name": "t", "protocol": "tlpp", "heartbeat_s": 30.0}, "hyper": hyper}
        self.manifest = build_manifest(self.owner, run_config_from_dict(doc), now=time.time())
        self.view = PeerView(Admission(self.manifest), ttl_s=self.manifest.ttl_s)
        self.peers: dict[str, Peer] = {}
        self.faults: set[tuple[str, int, str]] = set()
        self.received: dict[str, list[Frame]] = {}  # every request frame each peer's server got, as sent

    @classmethod
    async def create(cls, tmp_path: Path, *, hyper: dict[str, Any], sources: list[str], helper: bool,
                     identities: dict[str, Identity] | None = None) -> Tlpp:
        """Nodes ``node0..`` reading ``sources``, a helper if asked, and the orchestrator (not started).
        Pass the same ``identities`` to two networks to give them the same schedule."""
        names = [f"node{i}" for i in range(len(sources))] + (["helper"] if helper else [])
        identities = identities or {name: Identity.generate() for name in [*names, "orchestrator"]}
        net = cls(tmp_path, hyper, identities)
        specs = [(f"node{i}", ("node",), TlppNodeRole, source) for i, source in enumerate(sources)]
        if helper:
            specs.append(("helper", ("helper",), TlppHelperRole, ""))
        for name, roles, factory, source in specs:
            traffic = Traffic()
            role = factory(net.context(identities[name], roles, source, traffic))
            peer = Peer(name, identities[name], role, traffic=traffic)
            peer.server = await TcpServer.create(net._dispatcher(peer))
            net.peers[name] = peer
        net.publish()
        traffic = Traffic()
        role = TlppServerRole(net.context(net.owner, ("orchestrator", "tlpp-server"), "", traffic))
        net.peers["orchestrator"] = Peer("orchestrator", net.owner, role, traffic=traffic)
        return net

    def context(self, identity: Identity, roles: tuple[str, ...], data: str, traffic: Traffic) -> RoleContext:
        config = PeerConfig(identity_path=self.tmp_path / "unused.pem", roles=roles, data=data,
                            checkpoint_dir=self.tmp_path / "checkpoints")
        return RoleContext(identity=identity, config=config, manifest=self.manifest, membership=None,  # type: ignore[arg-type]
                           http_client=None, view=self.view, device=torch.device("cpu"),  # type: ignore[arg-type]
                           traffic=traffic, now=time.time, http_config=HttpConfig())

    def _dispatcher(self, peer: Peer):
        methods = peer.role.tcp_methods()

        async def dispatch(frame: Frame, info: object) -> Frame | None:
            self.received.setdefault(peer.name, []).append(Frame(frame.type, dict(frame.header), bytes(frame.payload)))
            key = (peer.name, frame.header.get("step"), frame.header.get("op"))
            if key in self.faults:
                raise HandlerError(f"injected fault: {key}")
            return await methods[frame.header["method"]](frame)

        return dispatch

    def publish(self) -> None:
        """Signed records of every served peer into the shared view."""
        now, entries = time.time(), {}
        for peer in self.peers.values():
            if peer.server is None:
                continue
            status = peer.role.status()
            record = PeerRecord(peer_id=peer.identity.peer_id, public_key=peer.identity.public_key, name=peer.name,
                                http_addr="", tcp_addr=f"127.0.0.1:{peer.server.address[1]}",
                                roles=(peer.role.name,), version="test", round=0, timestamp=now,
                                assignment=status.get("assignment", {}))
            entries[record.peer_id] = (seal_record(peer.identity, record), now + 60.0)
        self.view.update(entries, now=now)

    @property
    def orchestrator(self) -> TlppServerRole:
        return self.peers["orchestrator"].role  # type: ignore[return-value]

    def id_of(self, name: str) -> str:
        return self.peers[name].identity.peer_id

    def fail(self, name: str, step: int, op: str) -> None:
        self.faults.add((name, step, op))

    async def kill(self, name: str) -> None:
        peer = self.peers[name]
        if peer.server is not None:
            await peer.server.aclose()

    async def aclose(self) -> None:
        for peer in self.peers.values():
            await peer.role.aclose()
            if peer.server is not None:
                await peer.server.aclose()
