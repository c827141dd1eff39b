"""``gossamer swarm`` prints every event every protocol declares, without error. ``EXAMPLES`` holds a
realistic and a sparse example of every declared event (they must match the schemas exactly, so a
new event fails here until it has one), and each goes the way a real event goes: ``EventSink`` as
a JSON line, ``Swarm._print_event``, and ``ProgressPrinter`` as a peer started by hand prints it."""

from __future__ import annotations

import hashlib
import io
import json
import math
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from gossamer.peer.cli.presets import presets
from gossamer.peer.cli.swarm import Swarm, SwarmOptions
from gossamer.peer.events import EventSink
from gossamer.peer.kit.ledger import Exchange
from gossamer.peer.progress import ProgressPrinter
from gossamer.protocols.context.ledger import StepLedger as RingStepLedger
from gossamer.protocols.registry import PLUGINS
from gossamer.protocols.tlpp.ledger import StepLedger as TlppStepLedger

A, B, C = (hashlib.sha256(name).hexdigest() for name in (b"a", b"b", b"c"))
NAN = math.nan
CHECKPOINT = "/home/volunteer/.gossamer/checkpoints/run-1a2b3c4d5e6f-round20.safetensors"
SAMPLE = "The fox and the hound went out to the river, and there"


def tlpp_step(**changes: Any) -> dict[str, Any]:
    ledger = TlppStepLedger(step=12, epoch=1, index=3, mode="base", expected=[A, B, C], arrived=[A, B], used=[A, B],
                            rejected={C: "forward: timed out after 20 s"}, planned={A: 11, B: 11, C: 10}, samples=22,
                            loss=0.734, accuracy=0.81, applied=True, bytes_sent=48_213, bytes_received=51_877, wall_s=0.42)
    for name, value in changes.items():
        setattr(ledger, name, value)
    return ledger.to_json()


def ring_step(**changes: Any) -> dict[str, Any]:
    ledger = RingStepLedger(step=7, attempt="7.0", leader=A, members=[A, B], index=0, chunks=2, context=512,
                            coefficients=Exchange(expected=[B], arrived=[B], used=[B]),
                            reduce=Exchange(expected=[B], arrived=[B], used=[B]), loss=3.21, chunk_loss=1.6,
                            grad_norm=0.93, applied=True, bytes_sent=131_072, bytes_received=131_072, compute_s=0.8,
                            wall_s=1.1)
    for name, value in changes.items():
        setattr(ledger, name, value)
    return ledger.to_json()


# protocol -> event -> (a full example, what the sparse form changes)
EXAMPLES: dict[str, dict[str, tuple[dict[str, Any], dict[str, Any]]]] = {
    "diloco": {
        "waiting": ({"learners": 1, "wanted": 3}, {"learners": 0}),
        "ahead": ({"round": 7, "median": 5, "wait_s": 30.0}, {"median": 0, "wait_s": 0.0}),
        "adopted": ({"round": 12, "donors": 2, "why": "joined"}, {"donors": 1, "why": "caught up (3 rounds behind)"}),
        "no_quorum": ({"offering": 3, "quorum": 2, "reason": "no version is offered by 2 of 3 donors: 12 by 1, 11 by 2"
                                                                 " (digests differ)", "retry": True}, {"retry": False}),
        "round": ({"round": 3, "train_loss": 2.41, "heldout_loss": 2.55, "params_from": 2, "pgrads_used": 1,
                   "timed_out": [C], "rejected": {B: "pseudo-gradient: stale round 2"}, "bytes_sent": 1_234_567,
                   "bytes_received": 1_198_004, "note": "clipped 1 of 3 updates", "rounds": 20, "compute_s": 4.2,
                   "wall_s": 6.9, "w1_wait_s": 0.3, "w2_wait_s": 1.8, "eval_s": 0.4, "w2_deadline_s": 12.0,
                   "slow": [C], "partial": True, "problems": []},
                  {"train_loss": NAN, "heldout_loss": NAN, "params_from": 0, "pgrads_used": 0, "timed_out": [],
                   "rejected": {}, "note": "", "rounds": 0, "slow": [], "partial": False,
                   "problems": ["params: expected ['c'] are neither used, rejected nor timed out"]}),
        "finished": ({"round": 20, "checkpoint": CHECKPOINT, "sample": SAMPLE, "heldout_loss": 2.07},
                     {"heldout_loss": None, "sample": ""}),
    },
    "blocktrain": {
        "assignment": ({"assignment": {A: 0, B: 1, C: 1}, "coverage": [1, 2], "versions": [3, 4]},
                       {"assignment": {}, "coverage": [0, 0], "versions": [0, 0]}),
        "version": ({"block": 1, "version": 4, "used": [A, B], "rejected": {C: "stale: trained from version 2"},
                     "timed_out": [], "train_loss": 3.1, "update_norm": 0.42, "heldout_ce": 4.3, "versions": [4, 4],
                     "target": 10, "deadline_s": 30.0, "slow": [C]},
                    {"used": [], "rejected": {}, "timed_out": [B], "train_loss": None, "update_norm": None,
                     "heldout_ce": None, "target": 0, "deadline_s": None, "slow": []}),
        "finished": ({"versions": [10, 10], "heldout_ce": 3.9, "initial_heldout_ce": 5.5,
                      "checkpoints": "/srv/run/blocks", "sample": SAMPLE, "prompt": "The "},
                     {"heldout_ce": None, "initial_heldout_ce": None, "sample": None}),
        "assigned": ({"block": 1}, {"block": 0}),
        "update": ({"block": 1, "version": 4, "loss": 3.2, "accepted": True, "reason": None},
                   {"accepted": False, "reason": "stale: version 4 is closed"}),
        "error": ({"error": "cannot reach the coordinator at 127.0.0.1:40111: connection refused"}, {"error": ""}),
        "worker_finished": ({"updates": {"sent": 12, "accepted": 11, "refused": 1}}, {"updates": {}}),
        "serving": ({"blocks": [0, 1], "versions": {0: 3, 1: 4}}, {"blocks": [], "versions": {}}),
    },
    "tlpp": {
        "waiting": ({"nodes": 2, "wanted": 3, "helpers": 1, "helper_sees": 2},
                    {"nodes": 0, "helpers": 0, "helper_sees": None}),
        "normalized": ({"nodes": [A, B, C], "samples": 1_200, "mean": [0.13], "std": [0.31]},
                       {"nodes": [A], "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}),
        "step": (tlpp_step(), tlpp_step(arrived=[], used=[], rejected={A: "forward: refused", B: "forward: refused"},
                                        samples=0, loss=NAN, accuracy=NAN, applied=False)),
        "eval": ({"step": 25, "steps": 150, "loss": 0.9, "accuracy": 0.71, "samples": 360}, {"steps": 0}),
        "finished": ({"step": 150, "applied_steps": 149, "test_loss": 0.31, "test_accuracy": 0.92,
                      "checkpoint": CHECKPOINT}, {"applied_steps": 0, "test_loss": NAN, "test_accuracy": 0.0}),
        "error": ({"step": 40, "message": "the helper failed step 40: timed out", "kind": "HelperFailed",
                   "checkpoint": CHECKPOINT}, {"message": "", "kind": "TrainingStopped"}),
    },
    "fomoe": {
        "waiting": ({"hosts": 1, "wanted": 3}, {"hosts": 0}),
        "placement": ({"round": 0, "members": 3, "experts": [0, 2, 5], "holders": [2, 2, 2, 2, 2, 2], "lost": []},
                      {"round": 9, "members": 1, "experts": [], "holders": [1, 0, 1, 1, 1, 1], "lost": [1]}),
        "joined": ({"round": 6, "donors": 2, "experts": [1, 4], "why": "joined"}, {"donors": 1, "experts": []}),
        "round": ({"round": 3, "rounds": 20, "train_loss": 2.7, "heldout_loss": 2.9, "skip_fraction": 0.25,
                   "experts": [0, 2, 5], "members": 3, "used": 2, "timed_out": [], "rejected": {},
                   "bytes_sent": 2_345_678, "bytes_received": 2_301_112, "note": ""},
                  {"rounds": 0, "train_loss": NAN, "heldout_loss": NAN, "members": 1, "used": 0, "timed_out": [C],
                   "rejected": {B: "update: expert 3 is not held by b"}, "note": "cut off: 1 of 3 members agreed"}),
        "finished": ({"round": 20, "checkpoint": CHECKPOINT, "experts": [0, 2, 5], "heldout_loss": 2.4},
                     {"heldout_loss": None, "experts": []}),  # a host that restarted at the last round
    },
    "context": {
        "waiting": ({"shards": 1, "wanted": 2}, {"shards": 0}),
        "ring": ({"step": 7, "attempt": "7.0", "leader": A, "members": [A, B], "index": 1, "chunks": 2, "context": 512},
                 {"members": [A], "index": 0, "chunks": 1, "context": 256}),
        "step": ({**ring_step(), "steps": 100}, {**ring_step(index=1, chunk_loss=None, grad_norm=None), "steps": 0}),
        "aborted": (ring_step(applied=False, aborted="shard b stopped answering", suspects=[B], loss=None),
                    ring_step(applied=False, aborted="abandoned", suspects=[], loss=None, chunk_loss=None)),
        "adopted": ({"step": 9, "donors": 1, "why": "placed in the ring"}, {"donors": 0, "why": "behind the ring"}),
        "finished": ({"step": 100, "loss": 3.0, "heldout_loss": 3.1, "context": 512, "checkpoint": CHECKPOINT},
                     {"loss": None}),
    },
}
DOWNLOADING = ({"version": 12, "shards_done": 3, "shards": 8, "done_bytes": 1_234_567, "total_bytes": 3_600_000},
               {"shards_done": 0, "done_bytes": 0})  # the sparse one: its index verified, no shard yet
for _protocol in ("diloco", "fomoe", "context"):
    EXAMPLES[_protocol]["downloading"] = DOWNLOADING
DAEMON_EVENTS = [  # the daemon's own events, every protocol's swarm sees them too
    {"event": "ready", "wall_time": 1.7e9, "peer_id": A, "run_id": "demo@1a2b3c4d", "maddrs": ["/ip4/127.0.0.1/tcp/1"],
     "http": "127.0.0.1:40111", "tcp": "127.0.0.1:40112", "roles": ["orchestrator"], "listening": True},
    {"event": "peers", "count": 3, "peer_ids": [A, B, C]},
    {"event": "reachability", "reachability": "relayed", "verdict": "private", "relayed_by": B},
    {"event": "stopped", "peer_id": A, "code": 0, "checkpoints": {}},
    {"event": "exited", "code": 0},
]
EVENTS_OF = [(plugin.name, event) for plugin in PLUGINS for event in plugin.events]


def swarm_of(protocol: str, tmp_path: Path) -> Swarm:
    """A swarm (not started) on the built-in preset of ``protocol``."""
    for preset in presets():
        text = (resources.files("gossamer.peer.cli.presets") / f"{preset}.toml").read_text(encoding="utf-8")
        if tomllib.loads(text)["run"].get("protocol") == protocol:
            return Swarm(SwarmOptions(preset=preset, workdir=tmp_path / "swarm"), PLUGINS)
    raise AssertionError(f"no built-in preset runs protocol {protocol!r}")


def as_emitted(protocol: str, event: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The event as the swarm reads it from a peer's stdout: through ``EventSink`` as one JSON line."""
    stream = io.StringIO()
    EventSink(enabled=True, stream=stream).emit(f"{protocol}.{event}", **fields)
    return json.loads(stream.getvalue())


def forms(protocol: str, event: str) -> list[dict[str, Any]]:
    full, sparse = EXAMPLES[protocol][event]
    return [full, {**full, **sparse}]


@pytest.mark.parametrize("protocol", [plugin.name for plugin in PLUGINS])
def test_every_declared_event_has_an_example_with_exactly_its_fields(protocol: str) -> None:
    declared = PLUGINS.plugin(protocol).events
    assert set(EXAMPLES.get(protocol, {})) == set(declared), "add an example of each new event to EXAMPLES"
    for event, schema in declared.items():
        for fields in forms(protocol, event):
            assert set(fields) == set(schema.fields), f"{protocol}.{event}: the example does not match its schema"


@pytest.mark.parametrize(("protocol", "event"), EVENTS_OF, ids=[f"{p}.{e}" for p, e in EVENTS_OF])
def test_the_swarm_prints_every_declared_event(protocol: str, event: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    swarm = swarm_of(protocol, tmp_path)
    for source in ("orchestrator", "peer-1"):
        for fields in forms(protocol, event):
            swarm._print_event(source, as_emitted(protocol, event, fields))

            printed = capsys.readouterr().out
            assert printed.startswith(f"[{source}] ") and printed.endswith("\n"), printed


@pytest.mark.parametrize(("protocol", "event"), EVENTS_OF, ids=[f"{p}.{e}" for p, e in EVENTS_OF])
def test_a_hand_started_peer_prints_every_declared_event(protocol: str, event: str) -> None:
    """Without ``--events`` the role's fields reach ``ProgressPrinter`` as emitted (not through JSON:
    tuples, int keys)."""
    stream = io.StringIO()
    sink = EventSink(enabled=False, observer=ProgressPrinter(PLUGINS.plugin(protocol), stream=stream))
    for fields in forms(protocol, event):
        sink.emit(f"{protocol}.{event}", **fields)
    assert all(line.strip() for line in stream.getvalue().splitlines())


@pytest.mark.parametrize("protocol", sorted(EXAMPLES))
def test_the_swarm_prints_the_daemons_events(protocol: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    swarm = swarm_of(protocol, tmp_path)
    for event in DAEMON_EVENTS:
        swarm._print_event("peer-1", dict(event))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[peer-1] ready: peer ") and lines[1] == "[peer-1] sees 3 peer(s)"
    assert len(lines) == 3, "stopped and exited are shown by the watch loop itself"


def test_a_blocktrain_swarm_prints_the_workers_and_the_coordinators_finished_events(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The events of the original crash: a worker's end (``blocktrain.worker_finished``, once also
    named ``finished``, without a round) and the coordinator's ``blocktrain.finished``; the swarm
    prints both and is finished by the coordinator's alone (``FinishRule(by="owner")``)."""
    swarm = swarm_of("blocktrain", tmp_path)
    worker_done = as_emitted("blocktrain", "worker_finished", {"updates": {"sent": 12, "accepted": 11, "refused": 1}})
    run_done = as_emitted("blocktrain", "finished", EXAMPLES["blocktrain"]["finished"][0])
    unnamespaced = {"event": "finished", "updates": {"sent": 3}}  # an older peer's worker event

    for name, event in (("peer-1", worker_done), ("peer-2", unnamespaced), ("orchestrator", run_done)):
        swarm._print_event(name, event)
        if swarm._finishes(name, event):
            swarm.finished[name] = event

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[peer-1] the run is finished; updates {'accepted': 11, 'refused': 1, 'sent': 12}"
    assert lines[1].startswith("[peer-2] finished updates=")
    assert lines[2].startswith("[orchestrator] finished: block versions [10, 10], held-out CE 3.900 (from 5.500)")
    assert list(swarm.finished) == ["orchestrator"] and swarm._done()
