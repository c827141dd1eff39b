"""Protocol ``fomoe``: FoMoE, partial-expert replicas of an MoE LM (``README.md``: the method, its messages, a
round, joining, its settings). ``names`` the role name; ``settings`` the manifest; ``host`` the role (rounds,
joining, the experts it holds); ``wire`` the messages and their checks; ``ledger`` a round's ledger; ``coverage``
expert coverage for ``/status`` and ``gossamer status``; ``core`` the pure math (sans-I/O).
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
from gossamer.peer.plugin import EventSchema, FinishRule, Panel, ProtocolPlugin
from gossamer.peer.run.manifest import RunConfig
from gossamer.peer.run.records import PeerRecord
from gossamer.protocols.fomoe import names

EVENTS = {
    "waiting": EventSchema("round 0 waits for min_hosts expert hosts to be live", ("hosts", "wanted")),
    "placement": EventSchema("this host holds a (new) set of experts: at round 0, after members left or joined, "
                             "or on joining", ("round", "members", "experts", "holders", "lost")),
    "downloading": EventSchema(DOWNLOADING_DOC, DOWNLOADING),
    "joined": EventSchema("a joiner was admitted: it downloaded the dense state and took its experts from "
                          "their holders", ("round", "donors", "experts", "why")),
    "round": EventSchema("one round done; its ledger in short",
                         ("round", "rounds", "train_loss", "heldout_loss", "skip_fraction", "experts", "members", "used",
                          "timed_out", "rejected", "bytes_sent", "bytes_received", "note")),
    "finished": EventSchema("the host reached hyper.rounds and wrote its checkpoint (dense part and its experts)",
                            ("round", "checkpoint", "experts", "heldout_loss")),
}


def describe(event: str, e: Mapping[str, Any]) -> str | None:
    if event == "round":
        timed_out = f"  timed out {len(e['timed_out'])}" if e["timed_out"] else ""
        note = f"  {e['note']}" if e.get("note") else ""
        return (f"round {e['round']}: train loss {e['train_loss']:.3f}  held-out {e['heldout_loss']:.3f}  "
                f"experts {e['experts']}  skipped {e['skip_fraction']:.2f}  updates used {e['used']} of "
                f"{e['members'] - 1}  sent {e['bytes_sent'] / 1e6:.2f} MB{timed_out}{note}")
    if event == "placement":
        lost = f"; LOST (restarted from the freshest copy): {e['lost']}" if e["lost"] else ""
        return (f"placement at round {e['round']}: {e['members']} member(s), holding experts {e['experts']}, "
                f"holders per expert {e['holders']}{lost}")
    if event == "downloading":
        return describe_download(e, unit="round")
    if event == "joined":
        return f"{e['why']} at round {e['round']}: dense state from {e['donors']} donor(s), experts {e['experts']}"
    if event == "finished":  # no held-out loss when the host did no round itself (it joined at the last)
        loss = f"{e['heldout_loss']:.3f}" if e.get("heldout_loss") is not None else "-"
        return (f"finished at round {e['round']} holding experts {e['experts']}, held-out loss {loss}; "
                f"checkpoint {e['checkpoint']}")
    if event == "waiting":
        return f"waiting for expert hosts before round 0: {e['hosts']} of {e['wanted']} live"
    return None


def swarm_check(config: RunConfig, num_peers: int, roles: Sequence[str]) -> None:
    min_hosts = config.hyper.get("min_hosts", 1)
    if names.EXPERT_HOST in roles and isinstance(min_hosts, int) and min_hosts > num_peers:
        raise ConfigError(f"hyper.min_hosts = {min_hosts} but this swarm starts {num_peers} expert host(s), "
                          f"so round 0 would never start; pass --peers {min_hosts} or more")


def summarize(records: Sequence[PeerRecord]) -> list[str]:
    """Expert coverage from the live hosts' records (imported on use: it needs torch)."""
    from gossamer.protocols.fomoe.coverage import summarize as coverage_lines

    return coverage_lines(records)


def panel(records: Sequence[PeerRecord]) -> Panel | None:
    """The swarm page's expert coverage table (imported on use: it needs torch)."""
    from gossamer.protocols.fomoe.coverage import panel as coverage_panel

    return coverage_panel(records)


def progress(event: str, e: Mapping[str, Any]) -> tuple[int, int] | None:
    if event == "round" and e.get("rounds"):
        return e["round"] + 1, e["rounds"]
    if event == "downloading":
        return download_progress(e)
    return None


def settings() -> type:
    from gossamer.protocols.fomoe.settings import FomoeSettings

    return FomoeSettings


def roles() -> dict[str, Any]:
    from gossamer.protocols.fomoe.host import ExpertHostRole

    return {names.EXPERT_HOST: ExpertHostRole}


PLUGIN = ProtocolPlugin(
    name=names.PROTOCOL,
    summary="FoMoE: each host holds the dense layers and some experts of an MoE LM; experts sync among holders",
    settings=settings,
    roles=(names.EXPERT_HOST,),
    load_roles=roles,
    swarm_roles=(names.EXPERT_HOST,),
    events=EVENTS,
    finish=FinishRule("finished", by="peers"),
    describe_event=describe,
    swarm_check=swarm_check,
    summarize=summarize,
    progress=progress,
    panel=panel,
)
