"""An in-process network of peers for tests and benchmarks (``LocalNet``): any protocol's real roles,
each peer behind its own real HTTP and TCP servers on 127.0.0.1, found through real signed records
in one shared, verified ``PeerView``; faults declared by (peer, step, operation)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gossamer.crypto.identity import Identity
from gossamer.peer.config import PeerConfig
from gossamer.peer.events import EventSink
from gossamer.peer.kit.state_donor import StateDonor
from gossamer.peer.metrics import Traffic
from gossamer.peer.plugin import PluginRegistry, build_roles
from gossamer.peer.role import Role, RoleContext
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.keys import RunKeys, peers_key
from gossamer.peer.run.manifest import Manifest, RunConfig, build_manifest, run_config_from_dict
from gossamer.peer.run.records import UNKNOWN, PeerRecord, seal_record
from gossamer.peer.run.tenure import tenured_ids
from gossamer.peer.run.view import PeerView
from gossamer.peer.serving import (
    donated_state,
    peer_record,
    role_app,
    role_dispatcher,
    role_gate,
    state_donor,
)
from gossamer.transport.dht import DhtConfig, DhtMembership
from gossamer.transport.frames import Frame
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer
from gossamer.transport.tcp import ConnectionInfo, TcpServer
from gossamer_harness.faults import Faults
from gossamer_harness.taps import SentBodies, TappedClient
from gossamer_harness.wan import LinkProfile, WanProxy

RECORD_LIFETIME_S = 3600.0  # how far ahead records are dated to expire when the run's TTL is longer


@dataclass
class LocalPeer:
    """One peer of a ``LocalNet``: its identity, roles, servers and traffic counters."""

    name: str
    identity: Identity
    ctx: RoleContext
    roles: list[Role]
    traffic: Traffic
    donor: StateDonor | None = None
    http: HttpServer | None = None
    tcp: TcpServer | None = None
    alive: bool = True
    started: bool = False
    link: WanProxy | None = None  # ``LocalNet.shape``: what the peer's record points others to
    reachability: str = UNKNOWN  # what its record says (as a daemon's self-test would set it)

    @property
    def http_addr(self) -> str:
        if self.link is not None:
            return f"127.0.0.1:{self.link.address[1]}"
        return f"127.0.0.1:{self.http.address[1]}" if self.http else ""

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @property
    def role(self) -> Role:
        """The peer's role (the first, when it has several)."""
        return self.roles[0]

    def role_named(self, name: str) -> Role:
        return next(role for role in self.roles if role.name == name)


class LocalNet:
    """The peers of one test; build with ``await LocalNet.create(...)``, end with ``await aclose()``.

    What a daemon adds around its roles is left out on purpose: no process per peer, no heartbeat
    loop (``publish`` writes every live peer's record into the view, and a role's ``announce``
    does it at once), and no DHT unless asked for (``dht=True`` starts one real hivemind node,
    shared by every peer, which the roles that read the DHT themselves need). Everything the roles
    use is the real thing: settings read from a signed manifest by the protocol's plugin, the
    transports, the HTTP client, signatures, admission.

    Outsiders: ``outsider(identity, record)`` puts a record signed by an identity that is not one
    of the net's peers into the view, as anyone can write one into the DHT of an open run (a
    hostile peer's, a free identity's). ``skip(seconds)`` moves the network's clock forward, as if
    its peers had been up that much longer (tenure, ``peer.run.tenure``, is measured on this clock).

    Faults are declared by (peer, step, operation), never by subclassing internals (they are kept
    and applied by ``gossamer_harness.faults``): ``fail(name, step, op)`` makes that peer refuse the
    requests of ``op`` for ``step`` as a crashed host would leave them unanswered. For a TCP frame,
    step and op are its header's ``step`` and ``op``; for an HTTP request, the route's ``{round}``
    (or ``{step}``) and ``{kind}`` (or, without a kind, the request path). Faults of a sender, seen
    by every receiver of its signed HTTP messages: ``slow(name, seconds, op=..., step=...)`` holds
    them that long before they are handled (a slow sender or link; every step when ``step`` is
    None), and ``crash(name, step, op, after=k)`` lets ``k`` of them for (step, op) through and
    kills the peer at the next (a crash before a round's exchange with ``after=0``, mid-send with
    ``after >= 1``); ``crash(name, step, phase)`` with a phase a role marks
    (``RoleContext.fault_point``) kills it there (a learner's ``aggregate``: after it received the
    round's contributions, before it applied them).

    Links: ``shape(name, up, down)`` puts a WAN proxy (latency, jitter, rate, stalls, resets,
    refusals) in front of the peer's HTTP server and points its record there; shaping it again on
    the same port resets what was in flight (a partition is a link that refuses every connection;
    it heals when shaped back). ``kill(name)`` closes a peer's servers and roles; its record stays
    in the view until the run's TTL, as a killed process's would; ``stop(name)`` is a clean
    shutdown (the roles write their checkpoints too). ``received`` keeps every TCP request each peer
    got, as sent, so a test can replay or tamper with a real one; with ``keep_sent``, ``sent``
    keeps every HTTP body a peer sent and its recipient took (``gossamer_harness.taps``), and
    ``watchers`` see every event a role emits, as it is emitted (a test can read the role's state
    at that instant)."""

    def __init__(self, *, manifest: Manifest, owner: Identity, plugins: PluginRegistry, workdir: Path,
                 http_client: HttpClient, membership: DhtMembership | None, device: torch.device) -> None:
        self.manifest = manifest
        self.owner = owner
        self.plugins = plugins
        self.plugin = plugins.plugin(manifest.config.protocol)
        self.settings = self.plugin.read_settings(manifest.config)
        self.workdir = workdir
        self.http_client = http_client
        self.membership = membership
        self.device = device
        self.view = PeerView(Admission(manifest), ttl_s=manifest.ttl_s)
        self.view_refreshed = asyncio.Condition()
        self.peers: dict[str, LocalPeer] = {}
        self.faults = Faults(self)  # ``gossamer_harness.faults``: what fail, slow and crash declared
        self.received: dict[str, list[Frame]] = {}
        self.sent: SentBodies | None = None  # ``create(keep_sent=True)``: see ``gossamer_harness.taps``
        self.watchers: list[Callable[[str, str, Mapping[str, Any]], None]] = []  # (peer, event, fields)
        self._publishing: set[asyncio.Task[None]] = set()
        self._records: dict[str, tuple[bytes, float]] = {}
        self._skipped_s = 0.0

    @classmethod
    async def create(cls, run: RunConfig | Mapping[str, Any], *, plugins: PluginRegistry, workdir: Path,
                     owner: Identity | None = None, dht: bool = False, device: str = "cpu",
                     keep_sent: bool = False) -> LocalNet:
        """A network for the run ``run`` (a RunConfig, or a run config document as TOML would give),
        its manifest signed by ``owner`` (a fresh identity by default); ``keep_sent`` keeps every
        body a peer PUT and its recipient took in ``sent``."""
        run_config = run if isinstance(run, RunConfig) else run_config_from_dict(dict(run))
        owner = owner or Identity.generate()
        membership, run_keys = None, RunKeys()
        if dht:
            membership = await DhtMembership.create(DhtConfig(new_swarm=True, host_maddrs=("/ip4/127.0.0.1/tcp/0",)),
                                                    rules=(run_keys,))
        now = membership.now() if membership is not None else time.time()
        http_client = await HttpClient.create(config=HttpConfig())
        manifest = build_manifest(owner, run_config, now=now)
        run_keys.learn(manifest)
        net = cls(manifest=manifest, owner=owner, plugins=plugins, workdir=Path(workdir), http_client=http_client,
                  membership=membership, device=torch.device(device))
        net.sent = SentBodies() if keep_sent else None
        return net

    def now(self) -> float:
        return (self.membership.now() if self.membership is not None else time.time()) + self._skipped_s

    def skip(self, seconds: float) -> None:
        """Move the network's clock forward by ``seconds`` (``publish`` to refresh the records)."""
        if self.membership is not None:
            raise RuntimeError("a LocalNet with a DHT runs on DHT time; its clock cannot be moved")
        self._skipped_s += seconds

    # -- peers ------------------------------------------------------------------------------------

    async def add(self, name: str, roles: Sequence[str], *, identity: Identity | None = None, data: str = "",
                  role_options: Mapping[str, Mapping[str, Any]] | None = None, **config: Any) -> LocalPeer:
        """Build a peer with ``roles`` (not started: see ``start``), serve it and publish its record.
        The run owner's identity is used for a peer with a run-owner role unless ``identity`` is given."""
        owner_roles = {"orchestrator", *self.plugin.owner_roles}
        identity = identity or (self.owner if owner_roles & set(roles) else Identity.generate())
        traffic = Traffic()
        options = {"identity_path": self.workdir / f"{name}.pem", "public_name": name,
                   "checkpoint_dir": self.workdir / "checkpoints" / name, **config}
        peer_config = PeerConfig(roles=tuple(roles), data=data, **options)
        ctx = RoleContext(identity=identity, config=peer_config, manifest=self.manifest, plugin=self.plugin,
                          settings=self.settings, membership=self.membership,  # type: ignore[arg-type]
                          http_client=self._client_of(name), view=self.view, device=self.device, traffic=traffic,
                          now=self.now, http_config=HttpConfig(),
                          events=EventSink(enabled=False, observer=lambda event, fields: self._observe(name, event, fields)),
                          announce=self.announce, view_refreshed=self.view_refreshed,
                          fault_point=lambda phase, step: self.faults.fault_point(name, phase, step))
        built = build_roles(self.plugins, self.plugin.name, roles, ctx, role_options)
        peer = LocalPeer(name=name, identity=identity, ctx=ctx, roles=built, traffic=traffic, donor=state_donor(built))
        peer.http = await HttpServer.create(role_app(built, peer.donor, middlewares=[self.faults.middleware(name)]),
                                            host="127.0.0.1", port=0, config=ctx.http_config)
        peer.tcp = await TcpServer.create(self._tcp_dispatcher(peer), host="127.0.0.1", port=0,
                                          gate=role_gate(built))
        self.peers[name] = peer
        await self.publish()
        return peer

    def _client_of(self, name: str) -> HttpClient:
        if self.sent is None:
            return self.http_client
        return TappedClient(self.http_client, sender=name, sent=self.sent,  # type: ignore[return-value]
                            recipient_of=lambda addr: next((n for n, p in self.peers.items()
                                                      if p.alive and p.http_addr == addr), None))

    def _observe(self, name: str, event: str, fields: Mapping[str, Any]) -> None:
        for watcher in self.watchers:
            watcher(name, event, fields)

    async def start(self, *names: str) -> None:
        """Start the named peers' roles (every peer's, in the order added, when none is named)."""
        for name in names or tuple(self.peers):
            peer = self.peers[name]
            if not peer.started:
                peer.started = True
                for role in peer.roles:
                    await role.start()

    def __getitem__(self, name: str) -> LocalPeer:
        return self.peers[name]

    # -- records ----------------------------------------------------------------------------------

    async def publish(self) -> None:
        """Every live peer's signed record into the shared view (and the DHT, if there is one)."""
        now = self.now()
        expiration = now + min(self.manifest.ttl_s, RECORD_LIFETIME_S)
        vouched = tenured_ids(self.view.live(now=now), now=now, tenure_s=self.manifest.tenure_s)
        for peer in self.peers.values():
            if not peer.alive:
                continue
            record = peer_record(identity=peer.identity, config=peer.ctx.config, roles=peer.roles,
                                 http_addr=peer.http_addr,
                                 tcp_addr=f"127.0.0.1:{peer.tcp.address[1]}" if peer.tcp else "",
                                 now=now, capacity={"device": str(self.device)}, state=await donated_state(peer.donor),
                                 tenured=vouched if peer.identity.public_key == self.owner.public_key else (),
                                 reachability=peer.reachability)
            blob = seal_record(peer.identity, record)
            self._records[peer.peer_id] = (blob, expiration)
            if self.membership is not None:
                await self.membership.store(peers_key(self.manifest.run_id), blob, signer=peer.identity,
                                            expiration_time=expiration)
        self.view.update(dict(self._records), now=now)
        async with self.view_refreshed:
            self.view_refreshed.notify_all()

    def outsider(self, identity: Identity, record: PeerRecord) -> None:
        """Put ``record``, signed by ``identity`` (not one of the net's peers), into the view until
        its TTL runs out."""
        blob = seal_record(identity, record)
        self._records[identity.peer_id] = (blob, record.timestamp + self.manifest.ttl_s)
        self.view.update(dict(self._records), now=self.now())

    def announce(self) -> None:
        """A role's ``ctx.announce``: publish again at once (as the daemon's heartbeat would)."""
        self.background(self.publish(), name="localnet-publish")

    # -- faults -----------------------------------------------------------------------------------

    def fail(self, name: str, step: int, op: str) -> None:
        """Peer ``name`` refuses the requests of ``op`` for ``step`` (see the ``LocalNet`` docstring)."""
        self.faults.fail(name, step, op)

    def slow(self, name: str, seconds: float, *, op: str, step: int | None = None) -> None:
        """Peer ``name``'s messages of ``op`` (for ``step``; every step when None) are held
        ``seconds`` at their receivers before they are handled; when ``op`` is a phase a role marks
        (``RoleContext.fault_point``), the role stalls there that long."""
        self.faults.slow(name, seconds, op=op, step=step)

    def crash(self, name: str, step: int, op: str, *, after: int = 0, expire: bool = False) -> None:
        """Peer ``name`` is killed at its message of ``op`` for ``step`` that comes after ``after``
        of them were let through (that message and every later one are refused), or, when ``op`` is
        a phase a role marks (``RoleContext.fault_point``, e.g. ``aggregate``), when its role
        reaches that phase of ``step`` (nothing of the role runs past it); with ``expire`` its
        record is dropped from the view once it is dead (``forget``: a run with a short TTL)."""
        self.faults.crash(name, step, op, after=after, expire=expire)

    async def shape(self, name: str, up: LinkProfile | None, down: LinkProfile | None = None) -> None:
        """Put a WAN link (``gossamer_harness.wan.WanProxy``) in front of the peer's HTTP server, on the
        same port as its link before if it had one (connections through the old link are reset):
        others reach it through the link from now on. ``up`` shapes what others send it, ``down``
        its answers; ``up`` None takes the link away."""
        peer = self.peers[name]
        old_port = peer.link.address[1] if peer.link is not None else 0
        if peer.link is not None:
            await peer.link.aclose()
            peer.link = None
        if up is not None and peer.http is not None:
            peer.link = await WanProxy.create("127.0.0.1", peer.http.address[1], up=up, down=down,
                                              listen_port=old_port)
        await self.publish()

    def forget(self, name: str) -> None:
        """Drop the peer's record from the view, as when a crashed peer's record has expired (or a
        peer that never was live): the next ``publish`` leaves it out too."""
        peer = self.peers[name]
        peer.alive = False
        self._records.pop(peer.peer_id, None)
        self.view.update(dict(self._records), now=self.now())

    async def kill(self, name: str) -> None:
        """The peer's process is gone: servers and roles closed, its record left to expire."""
        peer = self.peers[name]
        peer.alive = False
        if peer.link is not None:
            await peer.link.aclose()
        for server in (peer.tcp, peer.http):
            if server is not None:
                await server.aclose()
        for role in peer.roles:
            await role.aclose()

    async def stop(self, name: str) -> dict[str, str]:
        """A clean shutdown of the peer (Ctrl+C): as ``kill``, then each role writes what a restart
        resumes from; the paths, by role."""
        await self.kill(name)
        written = {}
        for role in self.peers[name].roles:
            path = await role.checkpoint()
            if path:
                written[role.name] = path
        return written

    def _tcp_dispatcher(self, peer: LocalPeer):
        dispatch = role_dispatcher(peer.roles)

        async def faulty(frame: Frame, info: ConnectionInfo) -> Frame | None:
            self.received.setdefault(peer.name, []).append(Frame(frame.type, dict(frame.header), bytes(frame.payload)))
            self.faults.check_frame(peer.name, frame)
            return await dispatch(frame, info)

        return faulty

    def background(self, coro, *, name: str) -> None:
        """Run ``coro`` as a task of the net (a publish, a crash): ``aclose`` cancels what is left."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    # -- the end ----------------------------------------------------------------------------------

    async def aclose(self) -> None:
        for task in list(self._publishing):
            task.cancel()
        await asyncio.gather(*self._publishing, return_exceptions=True)
        for name, peer in self.peers.items():
            if peer.alive:
                await self.kill(name)
        await self.http_client.aclose()
        if self.membership is not None:
            await self.membership.aclose()
