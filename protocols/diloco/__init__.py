"""Protocol ``diloco``: gossip DiLoCo (README.md). Its pure core is ``core``; the rest is its role:
``learner`` (the role), ``ledger`` (a round's ledger), ``contributions`` (what its messages carry),
``keeping`` (the state it keeps and writes for a restart), ``steering`` (which learners steer one),
``settings`` (the manifest), ``names``, and ``commands``/``sampling`` (``gossamer sample``). This
module is the plugin: its events, how they print, and its lazy loaders (``--help`` imports no torch)."""

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
from gossamer.protocols.diloco import names
from gossamer.protocols.diloco.commands import SAMPLE

EVENTS = {
    "waiting": EventSchema("round 0 waits for min_learners learners to be live (mid-run: for any other learner, "
                           "once, when none is in view)", ("learners", "wanted")),
    "ahead": EventSchema("this learner is ahead of the learners' median round and waits for them",
                         ("round", "median", "wait_s")),
    "downloading": EventSchema(DOWNLOADING_DOC, DOWNLOADING),
    "adopted": EventSchema("the learner downloaded the swarm's state and jumped to its round",
                           ("round", "donors", "why")),
    "no_quorum": EventSchema("the learner adopted no state: none is offered by a majority of the distinct donors "
                             "that steer it (offering of them offer state, quorum must agree; reason lists the "
                             "offers); retry: it tries again when the records change",
                             ("offering", "quorum", "reason", "retry")),
    "round": EventSchema("one outer round done; its ledger in short, with its time split (seconds: compute_s "
                         "inner steps, w1_wait_s / w2_wait_s the waits for parameters / pseudo-gradients, "
                         "eval_s held-out evaluation, wall_s the whole round), w2_deadline_s (the limit the W2 "
                         "wait had), slow (learners flagged fail-slow), partial (a contribution went "
                         "unused or a send failed) and problems (the ledger's balance problems; [] when it "
                         "balances)",
                         ("round", "train_loss", "heldout_loss", "params_from", "pgrads_used", "timed_out",
                          "rejected", "bytes_sent", "bytes_received", "note", "rounds", "compute_s", "wall_s",
                          "w1_wait_s", "w2_wait_s", "eval_s", "w2_deadline_s", "slow", "partial", "problems")),
    "finished": EventSchema("the learner reached hyper.rounds and wrote its checkpoint",
                            ("round", "checkpoint", "sample", "heldout_loss")),
}


def describe(event: str, e: Mapping[str, Any]) -> str | None:
    if event == "round":
        timed_out = f"  timed out {len(e['timed_out'])}" if e["timed_out"] else ""
        note = f"  {e['note']}" if e.get("note") else ""
        return (f"round {e['round']}: train loss {e['train_loss']:.3f}  held-out {e['heldout_loss']:.3f}"
                f"  params from {e['params_from']}  pseudo-gradients used {e['pgrads_used']}"
                f"  sent {e['bytes_sent'] / 1e6:.1f} MB{timed_out}{note}")
    if event == "finished":
        loss = f"{e['heldout_loss']:.3f}" if e.get("heldout_loss") is not None else "-"
        return (f"finished at round {e['round']}, held-out loss {loss}; checkpoint {e['checkpoint']}\n"
                f"  sample (prompt 'The '): {e['sample']!r}\n"
                f"  run it again: gossamer sample --checkpoint {e['checkpoint']} \"The \"")
    if event == "waiting":
        return f"waiting for learners before round 0: {e['learners']} of {e['wanted']} live"
    if event == "ahead":
        return (f"at round {e['round']}, ahead of the learners' median {e['median']}: "
                f"waiting up to {e['wait_s']:.0f} s for them")
    if event == "downloading":
        return describe_download(e, unit="round")
    if event == "adopted":
        return f"{e['why']}: now at round {e['round']} ({e['donors']} donor(s))"
    if event == "no_quorum":
        then = "waiting for the records to change" if e["retry"] else "going on from its own state"
        return f"not adopting a state, {then}: {e['reason']}"
    return None


def progress(event: str, e: Mapping[str, Any]) -> tuple[int, int] | None:
    if event == "round" and e.get("rounds"):
        return e["round"] + 1, e["rounds"]
    if event == "downloading":
        return download_progress(e)
    return None


def swarm_check(config: RunConfig, num_peers: int, roles: Sequence[str]) -> None:
    min_learners = config.hyper.get("min_learners", 1)
    if names.LEARNER in roles and isinstance(min_learners, int) and min_learners > num_peers:
        raise ConfigError(f"hyper.min_learners = {min_learners} but this swarm starts {num_peers} learner(s), "
                          f"so round 0 would never start; pass --peers {min_learners} or more")


def settings() -> type:
    from gossamer.protocols.diloco.settings import DilocoSettings

    return DilocoSettings


def roles() -> dict[str, Any]:
    from gossamer.protocols.diloco.learner import LearnerRole

    return {names.LEARNER: LearnerRole}


PLUGIN = ProtocolPlugin(
    name=names.PROTOCOL,
    summary="gossip DiLoCo: full replicas, background parameter mixing, robust pseudo-gradient mixing",
    settings=settings,
    roles=(names.LEARNER,),
    load_roles=roles,
    swarm_roles=(names.LEARNER,),
    events=EVENTS,
    finish=FinishRule("finished", by="peers"),
    commands=(SAMPLE,),
    describe_event=describe,
    progress=progress,
    swarm_check=swarm_check,
)
