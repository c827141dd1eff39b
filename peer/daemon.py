"""The peer daemon: one running peer's identity, DHT membership, servers, signed heartbeat and
roles, and what it says about itself (``state`` for ``/healthz``, ``status``, the metrics snapshot).
``Daemon.create`` checks roles, settings and device before it touches the disk or the network, refuses
a live twin of its identity and undoes what it built when a later step fails; ``aclose`` is idempotent
and, with ``checkpoint=True``, has every role write what a restart resumes from."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import torch
from aiohttp import web

from gossamer import __version__
from gossamer.crypto.errors import IdentityError
from gossamer.crypto.identity import Identity
from gossamer.peer.cancellation import cancel_all
from gossamer.peer.config import PeerConfig
from gossamer.peer.device import describe_device, resolve_device
from gossamer.peer.errors import ConfigError, StartupError
from gossamer.peer.events import EventSink
from gossamer.peer.http_api import daemon_routes
from gossamer.peer.kit.state_donor import StateDonor
from gossamer.peer.metrics import PeerMetrics, Snapshot, Traffic, merge_counts, process_usage
from gossamer.peer.plugin import PluginRegistry, ProtocolPlugin, build_roles
from gossamer.peer.progress import ProgressPrinter
from gossamer.peer.reach.service import Reach, Volunteer
from gossamer.peer.role import FAILED, RUNNING, SERVING, Role, RoleContext
from gossamer.peer.run.addresses import announced_host, dht_mismatch
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.joining import fetch_manifest, lonely_line, start_membership
from gossamer.peer.run.keys import RunKeys, peers_key
from gossamer.peer.run.manifest import Manifest, RunConfig, build_manifest
from gossamer.peer.run.publisher import Publisher, StoreLog
from gossamer.peer.run.records import PeerRecord, peer_row, seal_record
from gossamer.peer.run.tenure import tenured_ids
from gossamer.peer.run.view import PeerView
from gossamer.peer.serving import (
    TcpDispatch,
    donated_state,
    peer_record,
    role_app,
    role_dispatcher,
    role_gate,
    state_donor,
)
from gossamer.transport.dht import DhtMembership
from gossamer.transport.errors import TransportError
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer
from gossamer.transport.relay import RelayConfig
from gossamer.transport.tcp import TcpConfig, TcpServer

log = logging.getLogger(__name__)


class Daemon:
    """One running peer. Build with ``await Daemon.create(config)``; stop with ``await aclose()``."""

    def __init__(self, *, config: PeerConfig, identity: Identity, manifest: Manifest, plugin: ProtocolPlugin,
                 membership: DhtMembership, http_client: HttpClient, view: PeerView, traffic: Traffic,
                 resources: contextlib.AsyncExitStack, device_info: dict[str, Any], host: str) -> None:
        self.config = config
        self.host = host  # what the record announces for HTTP and TCP (``run.addresses``)
        self.plugin = plugin
        self.events = EventSink(enabled=config.events, observer=ProgressPrinter(plugin), buffered=True)
        self.identity = identity
        self.manifest = manifest
        self.membership = membership
        self.http_client = http_client
        self.view = view
        self.traffic = traffic
        self.device_info = device_info
        self.roles: list[Role] = []
        self.state_donor: StateDonor | None = None
        self.http: HttpServer | None = None
        self.tcp: TcpServer | None = None
        self.metrics = PeerMetrics(self._snapshot)
        self._resources = resources
        self._tasks: list[asyncio.Task[None]] = []
        self._started = time.monotonic()
        self._record_expiration = 0.0
        self.store_log = StoreLog()
        self._record_publisher = Publisher(membership, what="record", key=peers_key(manifest.run_id), signer=identity,
                                           heartbeat_s=manifest.config.heartbeat_s, store_log=self.store_log)
        self._announce = asyncio.Event()
        self._view_refreshed = asyncio.Condition()
        self._closed = False
        self.checkpoints: dict[str, str] = {}  # role -> the checkpoint it wrote at shutdown
        volunteer = Volunteer(config.host, config.relay_port, RelayConfig(
            max_peers=config.relay_max_peers, rate_bytes_per_s=config.relay_rate_bytes_per_s)) if config.relay else None
        self.reach = Reach(identity=identity, admission=view.admission, ttl_s=manifest.ttl_s, now=membership.now,
                           http_client=http_client, view=view, view_refreshed=self._view_refreshed,
                           direct_record=lambda: self.record(direct=True), announce=self._announce.set,
                           targets=self._local_targets, volunteer_as=volunteer,
                           notify=lambda fields: self.events.emit("reachability", **fields),
                           tenure_s=manifest.tenure_s, owner_id=manifest.owner_peer_id)

    @classmethod
    async def create(cls, config: PeerConfig, *, plugins: PluginRegistry, run_config: RunConfig | None = None,
                     role_options: Mapping[str, Mapping[str, Any]] | None = None) -> Daemon:
        """Start a daemon that takes ``config.roles`` in the run (``run_config``: host it, as its
        owner; otherwise join ``config.run``). ``plugins`` are the protocols it knows;
        ``role_options`` are extra keyword arguments for named roles' constructors."""
        if run_config is not None:
            plugins.check_roles(run_config.protocol, config.roles, run=run_config.name)
            plugins.plugin(run_config.protocol).read_settings(run_config)  # refuse bad settings before any I/O
        unknown = [role for role in config.roles if role not in plugins.role_names]
        if unknown:
            raise ConfigError(f"unknown role(s) {', '.join(unknown)}; the roles are: {', '.join(plugins.role_names)}")
        device = resolve_device(config.device)
        identity = load_identity(config) if run_config is not None else None
        if config.threads:
            torch.set_num_threads(config.threads)  # once for every role of this process
        async with contextlib.AsyncExitStack() as stack:
            run_keys = RunKeys()
            membership = await start_membership(config, run_keys=run_keys)
            stack.push_async_callback(membership.aclose)
            host = announced_host(config, dht_maddrs=membership.visible_maddrs())
            if mismatch := dht_mismatch(host, membership.visible_maddrs()):
                log.warning("%s", mismatch)
            if identity is not None:
                manifest = build_manifest(identity, run_config, now=membership.now())
            else:
                manifest = await fetch_manifest(membership, config)
            run_keys.learn(manifest)
            plugin = plugins.plugin(manifest.config.protocol)
            plugins.check_roles(plugin.name, config.roles, run=manifest.run_id)
            settings = plugin.read_settings(manifest.config)
            identity = identity or load_identity(config)  # only now: every argument checked out
            admission = Admission(manifest)
            admission.check_own_token(config.join_token, public_key=identity.public_key, now=membership.now())
            http_config = HttpConfig()
            http_client = await HttpClient.create(config=http_config)
            stack.push_async_callback(http_client.aclose)
            view = PeerView(admission, ttl_s=manifest.ttl_s)
            daemon = cls(config=config, identity=identity, manifest=manifest, plugin=plugin, membership=membership,
                         http_client=http_client, view=view, traffic=Traffic(), resources=stack.pop_all(),
                         device_info=describe_device(device), host=host)
        try:
            ctx = RoleContext(identity=identity, config=config, manifest=manifest, plugin=plugin, settings=settings,
                              membership=membership, http_client=http_client, view=view, device=device,
                              traffic=daemon.traffic, now=membership.now, http_config=http_config,
                              events=daemon.events, announce=daemon._announce.set,
                              view_refreshed=daemon._view_refreshed, store_log=daemon.store_log)
            await daemon._start(ctx, plugins, role_options)
        except BaseException:
            await daemon.aclose()
            raise
        return daemon

    async def _start(self, ctx: RoleContext, plugins: PluginRegistry,
                     role_options: Mapping[str, Mapping[str, Any]] | None) -> None:
        self.roles = build_roles(plugins, self.plugin.name, self.config.roles, ctx, role_options)
        await self._refuse_a_twin()
        self.state_donor = state_donor(self.roles)
        self.http = await _bind("HTTP", "--http_port", self.config.http_port,
                                HttpServer.create(self._build_app(), host=self.config.host, port=self.config.http_port,
                                                  config=ctx.http_config))
        self.tcp = await _bind("TCP", "--tcp_port", self.config.tcp_port,
                               TcpServer.create(self._tcp_dispatcher(), host=self.config.host,
                                                port=self.config.tcp_port, config=TcpConfig(),
                                                gate=role_gate(self.roles)))
        await _bind("relay", "--relay_port", self.config.relay_port, self.reach.start())
        await self.publish_record()
        await self.refresh_view()
        # the view keeps refreshing while the roles start: a joiner waits on it for fresher records
        self._tasks.append(asyncio.create_task(self._view_loop(), name="daemon-view"))
        for role in self.roles:
            await role.start()
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name="daemon-heartbeat"))
        self._tasks.append(asyncio.create_task(self._lonely_watch(), name="daemon-lonely"))

    def _build_app(self) -> web.Application:
        extra = daemon_routes(self._status_for, self.metrics, self.state, status_token=self.config.status_token)
        return role_app(self.roles, self.state_donor, extra=[*extra, *self.reach.routes()])

    def _tcp_dispatcher(self) -> TcpDispatch:
        return role_dispatcher(self.roles, extra=self.reach.tcp_methods())

    # -- heartbeat and view -------------------------------------------------------------------

    def record(self, state: dict[str, Any] | None = None, *, direct: bool = False) -> PeerRecord:
        """This peer's record; its addresses are a relay's while it is private and has one
        (``direct``: its own, always, as the reachability self-test and relays need)."""
        host, config, now = self.host, self.config, self.membership.now()
        owner = self.identity.public_key == self.manifest.owner_public_key
        tenured = tenured_ids(self.view.live(now=now), now=now, tenure_s=self.manifest.tenure_s) if owner else ()
        http_addr = f"{host}:{config.announce_http_port or self.http.address[1]}" if self.http else ""
        tcp_addr = f"{host}:{config.announce_tcp_port or self.tcp.address[1]}" if self.tcp else ""
        if not direct:
            http_addr, tcp_addr = self.reach.addresses(http_addr, tcp_addr)
        return peer_record(identity=self.identity, config=config, roles=self.roles, http_addr=http_addr,
                           tcp_addr=tcp_addr, now=now, capacity=self.device_info, state=state, tenured=tenured,
                           reachability=self.reach.reachability, relay=self.reach.relay_addr(host))

    def _local_targets(self) -> list[tuple[str, int]]:
        """Where a relay's connections go on this host: the HTTP and TCP servers."""
        local = "127.0.0.1" if self.config.host in ("0.0.0.0", "::") else self.config.host
        return [(local, server.address[1]) for server in (self.http, self.tcp) if server is not None]

    def listening(self) -> dict[str, str]:
        """Where the HTTP and TCP servers listen ("host:port"; the record may announce other ports)."""
        return {name: f"{server.address[0]}:{server.address[1]}" if server else ""
                for name, server in (("http", self.http), ("tcp", self.tcp))}

    async def publish_record(self) -> bool:
        """Sign and store this peer's record; False (and the alarm raised) when no DHT node took it."""
        record = self.record(await donated_state(self.state_donor))
        expiration = record.timestamp + self.manifest.ttl_s
        stored = await self._record_publisher.publish(seal_record(self.identity, record), expiration_time=expiration)
        if stored:
            self._record_expiration = expiration
        return stored

    async def refresh_view(self) -> None:
        entries, withdrawn = await self.membership.get_entries(peers_key(self.manifest.run_id))
        self.view.update(entries, now=self.membership.now(), withdrawn=withdrawn)
        async with self._view_refreshed:
            self._view_refreshed.notify_all()
        log.debug("peer table refreshed: %d record(s) found, %d live, rejected so far %s", len(entries),
                  len(self.view.live(now=self.membership.now())), dict(self.view.rejected))

    async def _refuse_a_twin(self) -> None:
        """StartupError when another live daemon already uses this identity in the run: its record
        is in the view and is republished while we watch (the DHT keeps one record per peer id, so
        the two would overwrite each other and one would silently vanish from the run). A record
        left by a killed earlier life of this peer is not republished, and we go on."""
        await self.refresh_view()
        me = self.identity.peer_id
        found = self.view.get(me)
        if found is None:
            return
        seen = found.record.timestamp
        watch_s = 1.5 * self.manifest.config.heartbeat_s + 1.0
        log.info("a record with this peer id is already in the run; checking for %.0f s whether its daemon is "
                 "alive", watch_s)
        deadline = time.monotonic() + watch_s
        while time.monotonic() < deadline:
            await asyncio.sleep(min(0.5, self.manifest.config.heartbeat_s / 2))
            await self.refresh_view()
            live = self.view.get(me)
            if live is not None and live.record.timestamp > seen:
                where = f" (http {live.record.http_addr}{', ' + repr(live.record.name) if live.record.name else ''})"
                raise StartupError(
                    f"another live daemon uses this identity in run {self.manifest.run_id}{where}: peer id "
                    f"{me[:16]} from {self.config.identity_path}. Every daemon needs its own identity: pass "
                    f"--identity_path PATH (e.g. --identity_path ~/.gossamer/peer2.pem; it is created if missing)")

    async def _heartbeat_loop(self) -> None:
        """Republish the record every heartbeat, at once when a role announces a change, and after
        a quarter heartbeat when the last store failed."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._record_publisher.retry_delay_s):
                    await self._announce.wait()
            self._announce.clear()
            await self.publish_record()

    async def _view_loop(self) -> None:
        interval = min(1.0, self.manifest.config.heartbeat_s / 2)
        last_count = -1
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh_view()
            except TransportError as exc:
                log.warning("could not refresh the peer table: %s", exc)
                continue
            live = self.view.live(now=self.membership.now())
            if len(live) != last_count:
                self.events.emit("peers", count=len(live), peer_ids=[p.record.peer_id for p in live])
                last_count = len(live)

    async def _lonely_watch(self) -> None:
        """One line when no other peer shows up within ``join_timeout_s``: a network nobody joins,
        or a second network started next to a live run (two DHTs that never meet)."""
        me = self.identity.peer_id
        try:
            async with asyncio.timeout(self.config.join_timeout_s), self._view_refreshed:
                await self._view_refreshed.wait_for(
                    lambda: any(p.record.peer_id != me for p in self.view.live(now=self.membership.now())))
        except TimeoutError:
            log.warning("%s", lonely_line(self.config, self.join_command()))

    # -- what it says about itself ------------------------------------------------------------

    @property
    def round(self) -> int:
        return max((role.round for role in self.roles), default=0)

    def state(self) -> dict[str, Any]:
        """How this peer is doing: ``failed`` (a role failed), ``running`` (a role is working
        towards its end, or the peer only serves), ``idle`` (its roles with an end are finished
        and the others serve on) or ``finished`` (every role is finished); and each role's health."""
        health = {role.name: role.health() for role in self.roles}
        states = {h.state for h in health.values()}
        if FAILED in states:
            overall = "failed"
        elif RUNNING in states or not states or states == {SERVING}:
            overall = "running"
        else:
            overall = "idle" if SERVING in states else "finished"
        return {"state": overall, "roles": {name: h.to_json() for name, h in health.items()}}

    def join_command(self) -> str:
        """The command line that joins this run, with this peer as the bootstrap."""
        roles = ",".join(self.plugin.swarm_roles)
        return (f"gossamer peer --run {self.manifest.run_id} --initial_peers {' '.join(self.membership.visible_maddrs())}"
                + (f" --roles {roles}" if roles else ""))

    def status(self, *, owner: bool = True) -> dict[str, Any]:
        """What ``/status`` shows; for anyone but the ``owner`` (this host, the status token's
        holder) without the fields the roles mark private (``Role.private_status``), whose names
        are listed under ``withheld``."""
        now = self.membership.now()
        record = self.record()
        sent, received = self._bytes()
        live = self.view.live(now=now)
        panel = self.plugin.panel([p.record for p in live])
        return {
            "peer_id": self.identity.peer_id, "name": self.config.public_name, "version": __version__,
            "run_id": self.manifest.run_id, "protocol": self.manifest.config.protocol,
            "roles": list(dict.fromkeys(self.config.roles)), "round": self.round,
            "uptime_s": round(time.monotonic() - self._started, 3), "device": self.device_info,
            "addresses": {"http": record.http_addr, "tcp": record.tcp_addr, "dht": self.membership.visible_maddrs()},
            "listening": self.listening(), "reachability": self.reach.status(),
            "bytes_sent": sum(sent.values()), "bytes_received": sum(received.values()),
            "live_peers": [peer_row(p.record, now) for p in live],
            "records_rejected": dict(self.view.rejected),
            "dht": {"stored": dict(self.store_log.stored), "store_failures": dict(self.store_log.failed),
                    "refused": dict(self.membership.refused), "rejoined": self.membership.rejoined},
            "role_status": {role.name: role.status() if owner else role.public_status() for role in self.roles},
            "withheld": {} if owner else {role.name: sorted(role.private_status) for role in self.roles
                                          if role.private_status},
            "health": self.state(), "join": self.join_command(), "summary": self.plugin.summary,
            "panels": [panel.to_json()] if panel is not None else [], "checkpoints": dict(self.checkpoints),
            "process": process_usage(),
        }

    def _status_for(self, owner: bool) -> dict[str, Any]:
        return self.status(owner=owner)

    def _bytes(self) -> tuple[dict[str, int], dict[str, int]]:
        sent = merge_counts(self.traffic.sent, {"tcp": self.tcp.stats.bytes_out if self.tcp else 0})
        received = merge_counts(self.traffic.received, {"tcp": self.tcp.stats.bytes_in if self.tcp else 0})
        return sent, received

    def _snapshot(self, owner: bool = True) -> Snapshot:
        sent, received = self._bytes()
        return Snapshot(uptime_s=time.monotonic() - self._started, live_peers=len(self.view.live(now=self.membership.now())),
                        round=self.round, bytes_sent=sent, bytes_received=received,
                        records_rejected=dict(self.view.rejected),
                        dht_store_failures=dict(self.store_log.failed), dht_refused=dict(self.membership.refused),
                        dht_rejoined=self.membership.rejoined,
                        extra_gauges={**{f"process_{k}": float(v) for k, v in process_usage().items()},
                                      **{k: v for role in self.roles
                                         for k, v in (role.gauges() if owner else role.public_gauges()).items()}})

    # -- shutdown -----------------------------------------------------------------------------

    async def aclose(self, *, checkpoint: bool = False) -> None:
        """Stop everything; with ``checkpoint`` (a clean shutdown) every role first writes what a
        restart resumes from (``checkpoints`` says where)."""
        if self._closed:
            return
        self._closed = True
        await cancel_all(self._tasks, what="daemon")
        await self.reach.aclose()
        for role in reversed(self.roles):
            await role.aclose()
            if checkpoint:
                await self._checkpoint(role)
        await self._withdraw()
        for server in (self.tcp, self.http):
            if server is not None:
                await server.aclose()
        await self._resources.aclose()

    async def _checkpoint(self, role: Role) -> None:
        try:
            path = await role.checkpoint()
        except OSError as exc:
            log.error("%s: could not write its checkpoint: %s", role.name, exc)
            return
        if path:
            self.checkpoints[role.name] = path
            log.info("%s: checkpoint written to %s", role.name, path)

    async def _withdraw(self) -> None:
        if self._record_expiration:
            await self._record_publisher.withdraw(expiration_time=self._record_expiration + 1.0)


def load_identity(config: PeerConfig) -> Identity:
    try:
        identity, created = Identity.load_or_create(config.identity_path)
    except IdentityError as exc:
        raise StartupError(str(exc)) from exc
    if created:
        log.info("created a new identity at %s (peer id %s)", config.identity_path, identity.peer_id)
    return identity


async def _bind(what: str, flag: str, port: int, creating):
    try:
        return await creating
    except (OSError, TransportError) as exc:
        if port:
            raise StartupError(f"cannot start the {what} server on port {port} ({exc}); pick another {flag} "
                               f"or pass {flag} 0 to let the OS choose") from exc
        raise StartupError(f"cannot start the {what} server: {exc}") from exc
