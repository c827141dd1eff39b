"""Protocol ``context``: compressed context parallelism, a ring of cp-shards (``README.md``). ``names`` the role and
TCP method; ``settings`` the manifest; ``shard`` the role (the step loop); ``membership`` the ``Ring`` (members,
leader, suspects); ``links`` signed frames in and out; ``runner`` the ``AttemptRunner``; ``attempt`` one attempt's
state and deadline; ``state`` the ``StateKeeper`` (downloads, checkpoints); ``wire`` the frames; ``ledger`` a
step's ledger; ``replica`` the model, optimizer and data; ``core`` the pure math (sans-I/O).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.download_events import (
    DOWNLOADING,
    DOWNLOADING_DOC,
    describe_download,
    download_progress,
)
from gossamer.peer.plugin import EventSchema, FinishRule, ProtocolPlugin
from gossamer.peer.run.manifest import RunConfig
from gossamer.peer.run.records import PeerRecord
from gossamer.protocols.context import names
from gossamer.protocols.context.ledger import LEDGER_FIELDS

EVENTS = {
    "waiting": EventSchema("the leader waits for min_shards live shards before it plans a step", ("shards", "wanted")),
    "ring": EventSchema("this shard accepted (or, as leader, proposed) a plan with another ring than its last one: "
                        "the members, the leader and this shard's place",
                        ("step", "attempt", "leader", "members", "index", "chunks", "context")),
    "step": EventSchema("one step applied on this shard: its ledger (ring messages, gradient reduction, loss) "
                        "and the run's hyper.steps (0: no end)", (*LEDGER_FIELDS, "steps")),
    "aborted": EventSchema("an attempt of a step was aborted (a shard died, a deadline passed, a refusal): its "
                           "ledger, with the reason and the suspects left out of the next plans", LEDGER_FIELDS),
    "downloading": EventSchema(DOWNLOADING_DOC, DOWNLOADING),
    "adopted": EventSchema("this shard downloaded the ring's state (joining, or behind) and is now at its step",
                           ("step", "donors", "why")),
    "finished": EventSchema("the run reached hyper.steps: the last step's loss, a held-out loss, a checkpoint",
                            ("step", "loss", "heldout_loss", "context", "checkpoint")),
}


def describe(event: str, e: Mapping[str, Any]) -> str | None:
    if event == "step":
        leads = "  (leader)" if e["index"] == 0 else ""
        return (f"step {e['step']}: loss {e['loss']:.3f}  chunk {e['index']} of {e['chunks']} "
                f"({e['context']}-token context)  sent {e['bytes_sent'] / 1e6:.2f} MB  {e['wall_s']:.2f} s{leads}")
    if event == "aborted":
        suspects = f"; suspects {', '.join(s[:12] for s in e['suspects'])}" if e["suspects"] else ""
        return f"step {e['step']} aborted ({e['chunks']} shards): {e['aborted']}{suspects}"
    if event == "ring":
        return (f"from step {e['step']}: a ring of {e['chunks']} led by {e['leader'][:12]}, this shard holds chunk "
                f"{e['index']} of a {e['context']}-token context")
    if event == "waiting":
        return f"waiting for shards: {e['shards']} of {e['wanted']} live"
    if event == "downloading":
        return describe_download(e, unit="step")
    if event == "adopted":
        return f"{e['why']}: now at step {e['step']} ({e['donors']} donor(s))"
    if event == "finished":
        return (f"finished at step {e['step']}: held-out loss {e['heldout_loss']:.3f} at {e['context']} tokens; "
                f"checkpoint {e['checkpoint']}")
    return None


def progress(event: str, e: Mapping[str, Any]) -> tuple[int, int] | None:
    if event == "step" and e.get("steps"):
        return e["step"] + 1, e["steps"]
    if event == "downloading":
        return download_progress(e)
    return None


def swarm_check(config: RunConfig, num_peers: int, roles: Sequence[str]) -> None:
    min_shards = config.hyper.get("min_shards", 2)
    if names.SHARD in roles and isinstance(min_shards, int) and min_shards > num_peers:
        raise ConfigError(f"hyper.min_shards = {min_shards} but this swarm starts {num_peers} cp-shard(s), so no "
                          f"ring would ever train; pass --peers {min_shards} or more")


def summarize(records: Sequence[PeerRecord]) -> list[str]:
    """``gossamer status``: the ring the shards last ran, and the step each is at."""
    shards = [r for r in records if names.SHARD in r.roles]
    if not shards:
        return []
    placed = sorted((r for r in shards if "chunk" in r.assignment), key=lambda r: r.assignment["chunk"])
    lines = [f"context: {len(shards)} cp-shard(s), at step {min(r.round for r in shards)}"
             f"{'' if len({r.round for r in shards}) == 1 else f'..{max(r.round for r in shards)}'}"]
    rings = {(r.assignment.get("chunks"), r.assignment.get("context")) for r in placed}
    for chunks, context in sorted(rings, key=str):
        members = [r for r in placed if (r.assignment.get("chunks"), r.assignment.get("context")) == (chunks, context)]
        order = ", ".join(f"{r.assignment['chunk']}:{r.name or r.peer_id[:12]}" for r in members)
        lines.append(f"  ring of {chunks} chunk(s), {context}-token context: {order}")
    spare = [r for r in shards if "chunk" not in r.assignment]
    if spare:
        lines.append(f"  not in a ring yet: {', '.join(r.name or r.peer_id[:12] for r in spare)}")
    return lines


def settings() -> type:
    from gossamer.protocols.context.settings import ContextSettings

    return ContextSettings


def roles() -> dict[str, Any]:
    from gossamer.protocols.context.shard import CpShardRole

    return {names.SHARD: CpShardRole}


PLUGIN = ProtocolPlugin(
    name=names.PROTOCOL,
    summary="compressed context parallelism: ring attention over WAN with subspace-coded keys and values",
    settings=settings,
    roles=(names.SHARD,),
    load_roles=roles,
    swarm_roles=(names.SHARD,),
    events=EVENTS,
    finish=FinishRule("finished", by="peers"),
    describe_event=describe,
    progress=progress,
    swarm_check=swarm_check,
    summarize=summarize,
)
