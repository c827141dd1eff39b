"""Every DHT attack of issue 10 at once (``Attacker.cycle``) in windows alternating with clean ones
against a live DiLoCo run, then a learner joining under attack; ``--flood``: issue 30's storage floods
instead (``flood_scenario``: daemons' RSS and live peers). ``--source DIR``: the "before" daemons::

    nice -n 10 .venv/bin/python scripts/chaos/dht_attacks.py [--flood] [--source DIR] [--label after]"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hivemind.dht.node import DHTNode
from hivemind.utils.timed_storage import get_dht_time

from gossamer.crypto.identity import Identity
from gossamer.peer.run.keys import manifest_key, peers_key
from gossamer.peer.run.records import MAX_RECORD_BYTES, PeerRecord, seal_record
from gossamer.transport.dht import KEY_PREFIX
from gossamer.transport.dht.entries import seal_entry
from gossamer_harness.localproc import LOOPBACK, GossamerProcess, rss_bytes
from gossamer_harness.report import machine, write_result

RESULTS = Path(__file__).parent / "results"
FAR_S = 900.0
FLOOD_EVERY_S = 30.0
LEARNERS = 2

RUN = """
[run]
name = "chaos-dht"
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
min_learners = 2
[hyper.diloco]
inner_steps = 2
inner_lr = 0.005
[hyper.mixing]
w1 = "global"
w2 = "global"
[hyper.aggregator]
name = "mean"
"""


def shim_for(source: Path, work: Path) -> Path:
    """A folder that, first on PYTHONPATH, makes ``gossamer`` the checkout at ``source``."""
    package = work / "shim" / "gossamer"
    package.mkdir(parents=True)
    (package / "__init__.py").symlink_to(source / "peer" / "_gossamer" / "__init__.py")
    for layer in ("peer", "crypto", "transport", "protocols"):
        (package / layer).symlink_to(source / layer)
    return package.parent


class Watch:
    """Reads the events of several processes and keeps what the windows need."""

    def __init__(self, procs: dict[str, GossamerProcess]) -> None:
        self.procs = procs
        self.rounds: dict[str, list[tuple[float, int]]] = {name: [] for name in procs}  # (at, peers' params)
        self.peers: dict[str, list[tuple[float, int]]] = {name: [] for name in procs}

    def add(self, name: str, proc: GossamerProcess) -> None:
        self.procs[name] = proc
        self.rounds[name], self.peers[name] = [], []

    def poll(self) -> None:
        for name, proc in self.procs.items():
            while (event := proc._next_event(0.02)) is not None and event["event"] != "exited":
                at = proc.started_at + event["at_s"]
                if event["event"] == "diloco.round":
                    self.rounds[name].append((at, event["params_from"]))
                elif event["event"] == "peers":
                    self.peers[name].append((at, event["count"]))

    def windows(self, name: str, spans: list[tuple[float, float]]) -> dict[str, Any]:
        """One learner over several (start, end) windows together."""
        rounds = [mixed for t, mixed in self.rounds[name] if any(a <= t < b for a, b in spans)]
        counts, changes = [], 0
        for a, b in spans:
            during = [count for t, count in self.peers[name] if a <= t < b]
            counts += [count for t, count in self.peers[name] if t < a][-1:] + during
            changes += len(during)
        seconds = sum(b - a for a, b in spans)
        return {"rounds": len(rounds), "seconds": round(seconds, 1), "rounds_per_s": round(len(rounds) / seconds, 3),
                "mixed_per_round": round(sum(rounds) / len(rounds), 2) if rounds else None,
                "min_live_peers": min(counts) if counts else None, "peer_changes": changes}


async def pump(watch: Watch, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.to_thread(watch.poll)
        await asyncio.sleep(0.2)


class Attacker:
    """A hostile DHT member: a plain hivemind node with no validator."""

    def __init__(self, node: DHTNode, run_id: str, junk: int) -> None:
        self.node = node
        self.peers, self.manifest = KEY_PREFIX + peers_key(run_id), KEY_PREFIX + manifest_key(run_id)
        self.mallory = Identity.generate()
        self.junk = junk
        self.stores = {"accepted": 0, "refused": 0}
        self.flooded_at = 0.0

    async def _store(self, key: str, value: bytes, expiration: float, subkey: str | None = None) -> None:
        ok = await self.node.store(key, value, expiration, subkey=subkey)
        self.stores["accepted" if ok else "refused"] += 1

    async def cycle(self, victims: list[str], owner: str) -> None:
        """Write what a hostile DHT member wrote when the holes were found: ``hijack`` (another key's
        validly signed record, bare and inside an entry, under every victim's subkey, 900 s),
        ``pin`` (each victim's own value replayed for 900 s), ``withdraw`` (an empty value under
        the owner's subkey), ``wipe`` (one plain value over the whole peers key), ``manifest``
        (junk under the manifest key) and ``flood`` (``junk`` random subkeys, every 30 s)."""
        now = get_dht_time()
        record = PeerRecord(peer_id=self.mallory.peer_id, public_key=self.mallory.public_key, name="mallory",
                            http_addr="", tcp_addr="", roles=("learner",), version="x", round=0, timestamp=now)
        bare = seal_record(self.mallory, record)
        wrapped = seal_entry(self.mallory, key=self.peers, payload=bare, signed_at=now, expires_at=now + FAR_S)
        found = await self.node.get(self.peers, latest=True)
        current = found.value if found is not None and isinstance(found.value, dict) else {}
        for victim in victims:
            for value in (bare, wrapped):
                await self._store(self.peers, value, now + FAR_S, subkey=victim)  # hijack
            if victim in current:
                await self._store(self.peers, current[victim].value, now + FAR_S, subkey=victim)  # pin
        await self._store(self.peers, b"", now + 120.0, subkey=owner)  # withdraw
        await self._store(self.peers, b"not a dictionary", now + FAR_S)  # wipe
        await self._store(self.manifest, b"junk", now + FAR_S, subkey=owner)  # manifest
        await self._store(self.manifest, b"junk", now + FAR_S, subkey=self.mallory.peer_id)
        if time.monotonic() - self.flooded_at >= FLOOD_EVERY_S:
            self.flooded_at = time.monotonic()
            subkeys = [os.urandom(32).hex() for _ in range(self.junk)]
            done = await self.node.store_many([self.peers] * self.junk, [os.urandom(256) for _ in range(self.junk)],
                                              [now + FAR_S] * self.junk, subkeys=subkeys)
            accepted = sum(1 for ok in done.values() if ok)
            self.stores["accepted"] += accepted
            self.stores["refused"] += len(done) - accepted


async def keep_attacking(attacker: Attacker, victims: list[str], owner: str, every_s: float,
                         stop: asyncio.Event) -> None:
    while not stop.is_set():
        await attacker.cycle(victims, owner)
        try:
            await asyncio.wait_for(stop.wait(), timeout=every_s)
        except TimeoutError:
            pass


def start_learner(work: Path, ready: dict[str, Any], name: str) -> tuple[GossamerProcess, str]:
    pem = work / f"{name}.pem"
    peer_id = Identity.create(pem).peer_id
    proc = GossamerProcess(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--roles",
                            "learner", "--events", *LOOPBACK, "--threads", "1", "--identity_path", str(pem),
                            "--checkpoint_dir", str(work / "checkpoints")],
                           log_path=work / f"{name}.log")
    return proc, peer_id


class Attack:
    """An attacker's node in the swarm, rewriting every attack until stopped (then it leaves)."""

    def __init__(self, ready: dict[str, Any], victims: list[str], args: argparse.Namespace) -> None:
        self.ready, self.victims, self.args = ready, victims, args
        self.stores = {"accepted": 0, "refused": 0}

    async def __aenter__(self) -> Attack:
        self.node = await DHTNode.create(initial_peers=self.ready["maddrs"], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        self.attacker = Attacker(self.node, self.ready["run_id"], self.args.junk)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(keep_attacking(self.attacker, self.victims, self.ready["peer_id"],
                                                       self.args.every_s, self.stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        try:
            await self.task
        finally:
            for outcome, count in self.attacker.stores.items():
                self.stores[outcome] += count
            await self.node.shutdown()


async def scenario(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    (work / "run.toml").write_text(RUN)
    orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                            "--identity_path", str(work / "owner.pem")], log_path=work / "orch.log")
    procs: list[GossamerProcess] = [orch]
    try:
        ready = orch.wait_ready()
        learners = [start_learner(work, ready, f"l{i}") for i in range(LEARNERS)]
        procs += [proc for proc, _ in learners]
        for proc, _ in learners:
            proc.wait_ready()
        watch = Watch({f"l{i}": proc for i, (proc, _) in enumerate(learners)})
        warm_end = time.monotonic() + args.warmup_s
        while time.monotonic() < warm_end and min(len(r) for r in watch.rounds.values()) < 2:
            await pump(watch, 1.0)

        victims = [ready["peer_id"], *(peer_id for _, peer_id in learners)]
        clean: list[tuple[float, float]] = []
        attacked: list[tuple[float, float]] = []
        stores = {"accepted": 0, "refused": 0}
        for _pair in range(args.pairs):  # alternate, so both kinds of window see the machine's load drift
            start = time.monotonic()
            await pump(watch, args.window_s)
            clean.append((start, time.monotonic()))
            async with Attack(ready, victims, args) as attack:
                start = time.monotonic()
                await pump(watch, args.window_s)
                attacked.append((start, time.monotonic()))
            stores = {k: stores[k] + attack.stores[k] for k in stores}

        join: dict[str, Any] = {}
        async with Attack(ready, victims, args) as attack:
            joiner, _ = start_learner(work, ready, "late")
            procs.append(joiner)
            try:
                event = await asyncio.to_thread(joiner.wait_ready, args.join_timeout_s)
                join["ready_s"] = round(event["at_s"], 1)
                watch.add("late", joiner)
                start = time.monotonic()
                await pump(watch, args.window_s)
                join.update(watch.windows("late", [(start, time.monotonic())]))
            except AssertionError as exc:
                join["failed"] = str(exc).splitlines()[0][:300]
                join["log_tail"] = joiner.log()[-1500:]
        stores = {k: stores[k] + attack.stores[k] for k in stores}
        names = [f"l{i}" for i in range(LEARNERS)]
        return {
            "clean": {name: watch.windows(name, clean) for name in names},
            "attack": {name: watch.windows(name, attacked) for name in names},
            "join_under_attack": join,
            "attacker_stores": stores,
        }
    finally:
        for proc in reversed(procs):
            proc.stop()


FLOOD_LIFETIME_S = 1800.0
FLOOD_BATCH = 40  # entries per store_many: one hivemind message stays under its 4 MiB cap


def rss_mb(proc: GossamerProcess) -> float:
    """A daemon's resident memory with its children (hivemind's p2pd), in MB."""
    return round(sum(rss_bytes(pid) for pid in (proc.proc.pid, *proc.children())) / 1e6, 1)


def padded_record(identity: Identity, now: float, size: int) -> bytes:
    """A valid signed peer record of ``identity`` of about ``size`` bytes (padding in ``capacity``)."""
    def sealed(pad: int) -> bytes:
        return seal_record(identity, PeerRecord(
            peer_id=identity.peer_id, public_key=identity.public_key, name="sybil", http_addr="", tcp_addr="",
            roles=("learner",), version="x", round=0, timestamp=now, capacity={"pad": "x" * pad}))
    return sealed(max(0, size - len(sealed(0))))


async def flood(node: DHTNode, entries: list[tuple[Identity, str, bytes]]) -> dict[str, int]:
    """Store each (signer, full key, payload) as a validly signed entry living FLOOD_LIFETIME_S."""
    outcome = {"accepted": 0, "refused": 0}
    for start in range(0, len(entries), FLOOD_BATCH):
        batch, now = entries[start:start + FLOOD_BATCH], get_dht_time()
        values = [seal_entry(signer, key=key, payload=payload, signed_at=now, expires_at=now + FLOOD_LIFETIME_S)
                  for signer, key, payload in batch]
        done = await node.store_many([key for _, key, _ in batch], values, [now + FLOOD_LIFETIME_S] * len(batch),
                                     subkeys=[signer.peer_id for signer, _, _ in batch])
        accepted = sum(1 for ok in done.values() if ok)
        outcome["accepted"] += accepted
        outcome["refused"] += len(done) - accepted
    return outcome


def flood_doses(run_id: str, args: argparse.Namespace) -> dict[str, Any]:
    """Issue 30's doses, each from ``args.dose`` fresh identities: ``made_up_keys`` (random payloads of
    ``args.entry_kb`` KB under made-up keys ``run/<name>@<16 hex>/peers``), ``made_up_keys_records``
    (valid records just under the 16 KiB cap there), ``junk_under_peers`` (signed junk under the run's peers key)."""
    def made_up(index: int) -> str:
        return KEY_PREFIX + f"run/flood-{index}@{os.urandom(8).hex()}/peers"

    def identities() -> list[Identity]:
        return [Identity.generate() for _ in range(args.dose)]

    now = get_dht_time()
    return {
        "made_up_keys": lambda: [(who, made_up(i), os.urandom(args.entry_kb * 1000))
                                 for i, who in enumerate(identities())],
        "made_up_keys_records": lambda: [(who, made_up(i), padded_record(who, now, MAX_RECORD_BYTES - 256))
                                         for i, who in enumerate(identities())],
        "junk_under_peers": lambda: [(who, KEY_PREFIX + peers_key(run_id), os.urandom(512)) for who in identities()],
    }


async def flood_scenario(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """An orchestrator and two learners started through the CLI; each dose in turn from a plain
    hivemind node, watched while it is stored and ``args.window_s`` after: every daemon's RSS, each
    learner's fewest live peers, and rounds. A clean window comes first."""
    (work / "run.toml").write_text(RUN)
    orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                            "--identity_path", str(work / "owner.pem")], log_path=work / "orch.log")
    procs: list[GossamerProcess] = [orch]
    try:
        ready = orch.wait_ready()
        learners = [start_learner(work, ready, f"l{i}") for i in range(LEARNERS)]
        procs += [proc for proc, _ in learners]
        for proc, _ in learners:
            proc.wait_ready()
        daemons = {"orchestrator": orch, **{f"l{i}": proc for i, (proc, _) in enumerate(learners)}}
        watch = Watch({f"l{i}": proc for i, (proc, _) in enumerate(learners)})
        warm_end = time.monotonic() + args.warmup_s
        while time.monotonic() < warm_end and min(len(r) for r in watch.rounds.values()) < 2:
            await pump(watch, 1.0)

        async def window(flooding: asyncio.Task[dict[str, int]] | None = None) -> dict[str, Any]:
            """Watch while ``flooding`` runs, then ``args.window_s`` more."""
            start, peak = time.monotonic(), {n: rss_mb(p) for n, p in daemons.items()}
            quiet_from = None if flooding is not None else start
            while quiet_from is None or time.monotonic() - quiet_from < args.window_s:
                await pump(watch, 2.0)
                peak = {n: max(peak[n], rss_mb(p)) for n, p in daemons.items()}
                if quiet_from is None and flooding is not None and flooding.done():
                    quiet_from = time.monotonic()
            spans = [(start, time.monotonic())]
            return {"flood_s": round(quiet_from - start, 1), "rss_mb_end": {n: rss_mb(p) for n, p in daemons.items()},
                    "rss_mb_peak": peak, "alive": {n: p.proc.poll() is None for n, p in daemons.items()},
                    "learners": {n: watch.windows(n, spans) for n in watch.procs}}

        phases: dict[str, Any] = {"clean": await window()}
        print(f"clean: {phases['clean']}", file=sys.stderr, flush=True)
        node = await DHTNode.create(initial_peers=ready["maddrs"], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        try:
            for dose, entries in flood_doses(ready["run_id"], args).items():
                if dose not in args.doses:
                    continue
                flooding = asyncio.create_task(flood(node, entries()))
                phases[dose] = await window(flooding)
                phases[dose]["attacker_stores"] = flooding.result()
                print(f"{dose}: {phases[dose]}", file=sys.stderr, flush=True)
        finally:
            await node.shutdown()
        return {"phases": phases, "dose": args.dose, "entry_kb": args.entry_kb}
    finally:
        for proc in reversed(procs):
            proc.stop()


def flood_table(result: dict[str, Any]) -> str:
    rows = ["| phase | attacker stores accepted | orchestrator RSS MB (peak) | learner RSS MB (peak) "
            "| fewest live peers (of 3) per learner | rounds per learner |", "|---|---|---|---|---|---|"]
    for phase, row in result["phases"].items():
        stores = row.get("attacker_stores", {})
        learners = row["learners"]
        rows.append(f"| {phase} | {stores.get('accepted', '-')}/{sum(stores.values()) or '-'} "
                    f"| {row['rss_mb_peak']['orchestrator']} "
                    f"| {', '.join(str(row['rss_mb_peak'][n]) for n in learners)} "
                    f"| {', '.join(str(v['min_live_peers']) for v in learners.values())} "
                    f"| {', '.join(str(v['rounds']) for v in learners.values())} |")
    return "\n".join(rows) + "\n"


def table(result: dict[str, Any]) -> str:
    rows = ["| window | learner | rounds/s | peers' parameters mixed per round | fewest live peers (of 3) "
            "| peer-table changes |", "|---|---|---|---|---|---|"]
    for window, label in (("clean", "attacker away"), ("attack", "attacking")):
        for name, row in result[window].items():
            rows.append(f"| {label} | {name} | {row['rounds_per_s']:.2f} | {row['mixed_per_round']} | "
                        f"{row['min_live_peers']} | {row['peer_changes']} |")
    join = result["join_under_attack"]
    if "failed" in join:
        said = [line for line in join["log_tail"].splitlines() if line.startswith("error:")]
        rows.append(f"| attacking | new learner | failed to join: {(said or [join['failed']])[-1]} | | | |")
    else:
        rows.append(f"| attacking | new learner (ready after {join['ready_s']} s) | {join['rounds_per_s']:.2f} | "
                    f"{join['mixed_per_round']} | {join['min_live_peers']} | {join['peer_changes']} |")
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window_s", type=float, default=20.0, help="length of each clean and each attack window")
    parser.add_argument("--pairs", type=int, default=3, help="clean and attack windows, alternating")
    parser.add_argument("--warmup_s", type=float, default=60.0, help="at most this long for both learners' 2 rounds")
    parser.add_argument("--every_s", type=float, default=2.0, help="the attacker rewrites its values this often")
    parser.add_argument("--junk", type=int, default=2000, help="junk subkeys written under the peers key")
    parser.add_argument("--join_timeout_s", type=float, default=90.0)
    parser.add_argument("--source", type=Path, help="run the daemons from this checkout (the attacker stays)")
    parser.add_argument("--label", default="after", help="name of the result file: dht_attacks_<label>.json")
    parser.add_argument("--flood", action="store_true", help="issue 30's storage floods (result: "
                        "dht_flood_<label>.json); --window_s is then the watch after each dose")
    parser.add_argument("--dose", type=int, default=2000, help="--flood: entries (and fresh identities) per dose")
    parser.add_argument("--entry_kb", type=int, default=60, help="--flood: payload of a made-up key's entry")
    parser.add_argument("--doses", nargs="+", default=["made_up_keys", "made_up_keys_records", "junk_under_peers"],
                        help="--flood: which doses, in this order")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos-dht-") as tmp:
        work = Path(tmp)
        if args.source is not None:
            os.environ["PYTHONPATH"] = str(shim_for(args.source.resolve(), work))
        before = machine()
        if args.flood:
            result = asyncio.run(flood_scenario(work, args))
            result.update(label=args.label, source=str(args.source or "this checkout"), window_s=args.window_s,
                          command=" ".join(sys.argv))
            result = write_result(RESULTS / f"dht_flood_{args.label}.json", result, before=before)
            print(f"## DHT storage floods ({args.label}; load average {result['load_average_after'][0]:.1f})\n")
            print(flood_table(result))
            return 0
        result = asyncio.run(scenario(work, args))
    result.update(label=args.label, source=str(args.source or "this checkout"), window_s=args.window_s,
                  pairs=args.pairs, every_s=args.every_s, junk=args.junk, command=" ".join(sys.argv))
    result = write_result(RESULTS / f"dht_attacks_{args.label}.json", result, before=before)
    print(f"## DHT attacks ({args.label}; load average {result['load_average_after'][0]:.1f})\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
