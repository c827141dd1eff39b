"""Joining a network and a run: start the DHT node with actionable errors, then find and verify
the run's manifest (from ``--manifest FILE`` or the DHT)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from gossamer.peer.config import PeerConfig
from gossamer.peer.errors import ConfigError, ManifestError, StartupError
from gossamer.peer.run.keys import RunKeys, manifest_key
from gossamer.peer.run.manifest import Manifest, parse_run_id, verify_manifest
from gossamer.transport.dht import BootstrapFailed, DhtConfig, DhtMembership, DhtStartFailed
from gossamer.transport.errors import TransportError

log = logging.getLogger(__name__)
LOOKING_LINE_S = 5.0  # how often a join that waits for the manifest says so


async def start_membership(config: PeerConfig, *, run_keys: RunKeys | None = None) -> DhtMembership:
    """Start this peer's DHT node, which applies the run key rule (``run_keys``, a fresh ``RunKeys``
    if None) to every entry it stores or reads; StartupError with the fix when it cannot."""
    new_swarm = config.new_swarm or not config.initial_peers
    try:
        dht_config = DhtConfig(initial_peers=config.initial_peers, host_maddrs=config.host_maddrs,
                               announce_maddrs=config.announce_maddrs, new_swarm=new_swarm)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        return await DhtMembership.create(dht_config, rules=(run_keys or RunKeys(),))
    except (BootstrapFailed, DhtStartFailed) as exc:
        raise StartupError(str(exc)) from exc


async def fetch_manifest(membership: DhtMembership, config: PeerConfig) -> Manifest:
    """The run's manifest, verified against the run id; waits up to ``join_timeout_s`` for it."""
    if not config.run:
        raise ConfigError("--run is required to join a run (the run id looks like NAME@0123456789abcdef; "
                          "the orchestrator prints it)")
    parse_run_id(config.run)
    if config.manifest:
        return _manifest_from_file(config.manifest, config.run)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.join_timeout_s
    delay_s, last_error = 0.2, None
    started, said = loop.time(), loop.time()
    while True:
        if loop.time() - said >= LOOKING_LINE_S:
            said = loop.time()
            log.info("looking for run %s in the DHT (%.0f s of %.0f s)", config.run, said - started,
                     config.join_timeout_s)
        try:
            entries = await membership.get_all(manifest_key(config.run))
        except TransportError as exc:
            entries, last_error = {}, exc
        for blob, _expiration in entries.values():
            try:
                return verify_manifest(blob, expected_run_id=config.run)
            except ManifestError as exc:
                last_error = exc
        if loop.time() + delay_s > deadline:
            break
        await asyncio.sleep(delay_s)
        delay_s = min(2 * delay_s, 2.0)
    if isinstance(last_error, ManifestError):
        raise last_error
    if config.new_swarm or not config.initial_peers:
        raise StartupError(f"run {config.run} was not found within {config.join_timeout_s:.0f}s because this peer "
                           "started a new, empty network (--new_swarm, or no --initial_peers): pass --initial_peers "
                           "with the address a peer of the run prints (its `join` line) instead")
    raise StartupError(f"run {config.run} was not found in the DHT within {config.join_timeout_s:.0f}s: is its "
                       "orchestrator running, and do --initial_peers point at a peer of the same network?")


def lonely_line(config: PeerConfig, join_command: str) -> str:
    """What to do when no other peer has appeared within ``join_timeout_s``."""
    waited = f"no other peer has appeared in {config.join_timeout_s:.0f} s"
    if config.new_swarm or not config.initial_peers:
        return (f"{waited}. This peer started a new network; others join it with: {join_command}. If this run is "
                "already live elsewhere, this is a second network that will never meet it: stop this peer and "
                "start it with --initial_peers set to a peer of the live run")
    return (f"{waited} although --initial_peers answered: are they peers of this run (the same run id), and is "
            "this peer's record accepted (see records_rejected in /status)?")


def _manifest_from_file(path: str, run_id: str) -> Manifest:
    try:
        blob = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read --manifest {path}: {exc.strerror}") from exc
    return verify_manifest(blob, expected_run_id=run_id)
