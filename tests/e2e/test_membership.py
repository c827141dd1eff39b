"""Real daemons through the CLI on 127.0.0.1: discovery, status, TTL after SIGKILL, forged and
non-admitted records (a join token lifted from another peer's record, one bound to no key), clean
SIGTERM (no p2pd left behind)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
from pathlib import Path

import pytest

from gossamer.crypto.identity import Identity
from gossamer.crypto.signed import sign_object
from gossamer.crypto.tokens import issue_join_token
from gossamer.peer.run.keys import peers_key
from gossamer.peer.run.records import PeerRecord, seal_record
from gossamer.transport.dht.config import DhtConfig
from gossamer.transport.dht.membership import DhtMembership
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient
from gossamer_harness.localproc import IDLE_TIMEOUT_S, LOOPBACK, Processes, gossamer
from gossamer_harness.wan import LinkProfile, WanProxy, listen_socket

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # the waits follow progress: this is the last resort
TTL_S = 3 * 1.0  # a record lives 3 heartbeats


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    """An allowlist run: the orchestrator plus two admitted peers, all started through the CLI, two
    spare admitted identities for the test that stops peers (so the others see three in any order)
    and one for the peer behind a port forward."""
    work = tmp_path_factory.mktemp("swarm")
    admitted = [Identity.create(work / f"peer-{i}.pem") for i in range(5)]
    allow = ", ".join(f'"{p.public_key.hex()}"' for p in admitted)
    (work / "run.toml").write_text(f'[run]\nname = "e2e"\nheartbeat_s = 1.0\n[admission]\npolicy = "allowlist"\nallow = [{allow}]\n')
    with Processes() as processes:
        orch = processes.start(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                                "--identity_path", str(work / "owner.pem"), "--public_name", "owner"],
                               log_path=work / "orchestrator.log")
        ready = orch.wait_ready()
        for i in range(2):
            processes.start(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--events",
                             *LOOPBACK, "--identity_path", str(work / f"peer-{i}.pem"), "--public_name", f"peer-{i}"],
                            log_path=work / f"peer-{i}.log")
        yield {"work": work, "ready": ready, "procs": list(processes.started),
               "spares": (work / "peer-2.pem", work / "peer-3.pem"), "spare_forwarded": work / "peer-4.pem"}


def test_three_peers_discover_each_other(swarm) -> None:
    for proc in swarm["procs"]:
        event = proc.wait_peer_count(3, also=swarm["procs"])
        assert len(event["peer_ids"]) == 3


def test_status_command_lists_live_peers(swarm) -> None:
    swarm["procs"][0].wait_peer_count(3, also=swarm["procs"])
    ready = swarm["ready"]
    result = gossamer(["status", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--json"])
    assert result.returncode == 0, result.stderr
    names = sorted(p["name"] for p in json.loads(result.stdout)["peers"])
    assert names == ["owner", "peer-0", "peer-1"]


async def test_forged_and_unadmitted_records_never_appear(swarm) -> None:
    ready, orch = swarm["ready"], swarm["procs"][0]
    orch.wait_peer_count(3, also=swarm["procs"])
    victim, mallory, forger = Identity.load(swarm["work"] / "peer-0.pem"), Identity.generate(), Identity.generate()
    owner, lifter, holder = Identity.load(swarm["work"] / "owner.pem"), Identity.generate(), Identity.generate()
    membership = await DhtMembership.create(DhtConfig(initial_peers=tuple(ready["maddrs"])))
    try:
        now = membership.now()
        record = PeerRecord(peer_id=mallory.peer_id, public_key=mallory.public_key, name="mallory", http_addr="",
                            tcp_addr="", roles=(), version="x", round=0, timestamp=now)
        forged = sign_object(forger, {**record.body(), "peer_id": victim.peer_id, "public_key": victim.public_key})
        key = peers_key(ready["run_id"])
        # a token bound to the victim, as if read from its record, and one bound to no key (issue 10)
        lifted = issue_join_token(owner, run_id=ready["run_id"], expires_at=now + 600,
                                  peer_public_key=victim.public_key, nonce=b"l" * 16)
        unbound = issue_join_token(owner, run_id=ready["run_id"], expires_at=now + 600, nonce=b"u" * 16)
        with_tokens = {who: dataclasses.replace(record, peer_id=who.peer_id, public_key=who.public_key,
                                                name=who_name, join_token=token)
                       for who, who_name, token in ((lifter, "lifter", lifted), (holder, "holder", unbound))}
        for who, token_record in with_tokens.items():
            assert await membership.store(key, seal_record(who, token_record), signer=who, expiration_time=now + 30)
        assert await membership.store(key, seal_record(mallory, record), signer=mallory, expiration_time=now + 30)
        assert await membership.store(key, forged, signer=forger, expiration_time=now + 30)  # the last one
        entries = await membership.get_all(key)
        assert {mallory.peer_id, forger.peer_id, lifter.peer_id, holder.peer_id} <= set(entries)  # in the DHT...
    finally:
        await membership.aclose()
    # ...but once a refresh saw the last one, nobody lists any of them, and the orchestrator counted the refusals
    status = await _status_after_refresh(swarm["ready"]["http"])
    assert sorted(p["name"] for p in status["live_peers"]) == ["owner", "peer-0", "peer-1"]


def _refusals(status: dict) -> int:
    """Bad records refused, where they were stored (the DHT's `record` and `admission` reasons) or
    where they were read (the view's `records_rejected`): honest nodes refuse them at store time,
    and a reader refuses what another node (here the attacker's own) still serves."""
    stored = status["dht"]["refused"]
    return stored.get("record", 0) + stored.get("admission", 0) + sum(status["records_rejected"].values())


async def _status_after_refresh(http_addr: str) -> dict:
    client = await HttpClient.create(config=HttpConfig())
    try:
        for _ in range(int(IDLE_TIMEOUT_S / 0.2)):  # the view refreshes every 0.5 s; wait for one that saw them
            status = await client.get_json(f"http://{http_addr}/status")
            if _refusals(status) >= 4:  # the four records stored
                return status
            await asyncio.sleep(0.2)
        raise AssertionError(f"bad records were never refused: {status['records_rejected']}, {status['dht']}")
    finally:
        await client.aclose()


def test_sigkilled_peer_disappears_within_ttl_and_sigterm_leaves_no_p2pd(swarm, processes: Processes) -> None:
    ready, orch = swarm["ready"], swarm["procs"][0]
    orch.wait_peer_count(3, also=swarm["procs"])
    killed, leaver = (processes.start(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"],
                                       "--events", *LOOPBACK, "--identity_path", str(spare), "--public_name", name],
                                      log_path=swarm["work"] / f"{name}.log")
                      for name, spare in zip(("killed", "leaver"), swarm["spares"], strict=True))
    killed.wait_ready()
    leaver.wait_ready()
    orch.wait_peer_count(5, also=[*swarm["procs"], killed, leaver])
    killed.stop(signal.SIGKILL)
    # the verdict is a deadline: gone once its record's TTL is out, plus the view's refreshes and
    # DHT slack (generous for a loaded machine, far short of a record renewed by anyone)
    orch.wait_peer_count(4, timeout_s=TTL_S + 60)

    p2pd = leaver.children()
    assert p2pd, "a running daemon has its p2pd child"
    assert leaver.stop(signal.SIGTERM) == 0
    assert not set(p2pd) & set(leaver.left_behind), "p2pd outlived its daemon"
    orch.wait_peer_count(3, also=swarm["procs"])  # a clean exit withdraws the record at once


async def test_a_peer_behind_a_port_forward_announces_the_forward_and_is_reached_through_it(
        swarm, processes: Processes) -> None:
    """--announce_http_port/--announce_tcp_port: the record carries the forward's ports, the ready
    event says where the servers listen; a request to the announced port reaches the peer."""
    ready = swarm["ready"]
    http_forward, tcp_forward = listen_socket("127.0.0.1", 0), listen_socket("127.0.0.1", 0)
    ports = [sock.getsockname()[1] for sock in (http_forward, tcp_forward)]
    peer = processes.start(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--events",
                            *LOOPBACK, "--identity_path", str(swarm["spare_forwarded"]), "--announce_http_port",
                            str(ports[0]), "--announce-tcp-port", str(ports[1])], log_path=swarm["work"] / "fwd.log")
    try:
        up = await asyncio.to_thread(peer.wait_ready, also=swarm["procs"])
        assert (up["http"], up["tcp"]) == (f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}")
        listening = int(up["listening"]["http"].rsplit(":", 1)[1])
        assert listening not in ports
        async with await WanProxy.create("127.0.0.1", listening, up=LinkProfile(), listener=http_forward):
            client = await HttpClient.create(config=HttpConfig())
            try:
                status = await client.get_json(f"http://{up['http']}/status")  # through the forward
            finally:
                await client.aclose()
            assert status["peer_id"] == up["peer_id"] and status["listening"]["http"] == up["listening"]["http"]
            orch = swarm["procs"][0]
            await asyncio.to_thread(orch.wait_event, lambda e: e["event"] == "peers" and up["peer_id"] in e["peer_ids"],
                                    also=[*swarm["procs"], peer])
            table = await asyncio.to_thread(gossamer, ["status", "--run", ready["run_id"], "--initial_peers",
                                                       *ready["maddrs"], "--json"])
            rows = [row for row in json.loads(table.stdout)["peers"] if row["peer_id"] == up["peer_id"]]
            assert rows and rows[0]["http_addr"] == up["http"], table.stdout
    finally:
        tcp_forward.close()


def test_wrong_manifest_signature_refuses_to_join(swarm, tmp_path: Path) -> None:
    import urllib.request
    blob = bytearray(urllib.request.urlopen(f"http://{swarm['ready']['http']}/manifest?format=signed",
                                                 timeout=10).read())
    blob[len(blob) // 2] ^= 1
    (tmp_path / "bad.manifest").write_bytes(bytes(blob))
    result = gossamer(["peer", "--run", swarm["ready"]["run_id"], "--manifest", str(tmp_path / "bad.manifest"),
                       "--initial_peers", *swarm["ready"]["maddrs"], *LOOPBACK, "--identity_path",
                       str(tmp_path / "p.pem")])
    assert result.returncode == 2
    assert "invalid signature" in result.stderr and "Traceback" not in result.stderr
