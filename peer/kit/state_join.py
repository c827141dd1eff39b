"""State for a joining (or lagging) peer: which version and digest to trust (``plan_state``: what a
majority of the distinct tenured donors offering state advertise, never one donor's word) and the
download from those donors, verified against that digest; where a majority agrees on a version but
not on one digest (gossip replicas differ), the coordinate-wise median of several donors' verified
states (README.md of peer, "kit.state_join")."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from gossamer.peer.kit.statesync import Donor, DownloadProgress, StateFetchReport, StateSyncError, fetch_state
from gossamer.peer.run.tenure import DEFAULT_TENURE_S, seniors
from gossamer.peer.run.view import LivePeer
from gossamer.transport.http_client import HttpClient

MAX_BLEND = 7
"""The most distinct states a blend downloads (each whole): a median of 7 outvotes 3 liars."""
_SHOWN_OFFERS = 8  # offers a NoQuorum message lists


class NoQuorum(StateSyncError):
    """No version (or, after the downloads, not enough of its states) is backed by a majority of
    the distinct donors offering state: nothing is adopted; try again when the records change."""

    def __init__(self, message: str, *, offering: int, quorum: int) -> None:
        super().__init__(message, failures=())
        self.offering, self.quorum = offering, quorum


@dataclass(frozen=True)
class Source:
    """One state on offer: its index digest and the donors that advertise it."""

    digest: str
    donors: tuple[Donor, ...]


@dataclass(frozen=True)
class StatePlan:
    """What to download: ``version``, and one source (a majority advertises its digest) or several
    to blend; ``offering`` distinct donors offered state, ``quorum`` of them must agree; a blend
    needs the states of ``backing`` of its sources' donors (the quorum, or when the sources are a
    sample of ``MAX_BLEND``, a majority of the sample's donors)."""

    version: int
    sources: tuple[Source, ...]
    offering: int
    quorum: int
    backing: int

    @property
    def blended(self) -> bool:
        return len(self.sources) > 1


def _offers(live: Sequence[LivePeer], exclude: str) -> list[tuple[int, str, LivePeer]]:
    """(version, digest, peer) of every reachable peer advertising a well-formed state, one per peer."""
    seen: set[str] = set()
    offers = []
    for peer in live:
        record = peer.record
        version, digest = record.state.get("version"), record.state.get("digest")
        if (record.peer_id == exclude or record.peer_id in seen or not record.http_addr or not record.reachable
                or isinstance(version, bool) or not isinstance(version, int) or version < 0
                or not isinstance(digest, str) or len(digest) != 64):
            continue
        seen.add(record.peer_id)
        offers.append((version, digest, peer))
    return offers


def _describe_offers(offers: Sequence[tuple[int, str, LivePeer]]) -> str:
    groups = Counter((v, d) for v, d, _ in offers)
    shown = sorted(groups.items(), key=lambda item: (-item[0][0], -item[1], item[0][1]))[:_SHOWN_OFFERS]
    more = f", and {len(groups) - len(shown)} more" if len(groups) > len(shown) else ""
    return ", ".join(f"version {v} ({d[:8]}) by {n}" for (v, d), n in shown) + more


def plan_state(live: Sequence[LivePeer], *, exclude: str = "", versions: Collection[int] | None = None,
               rng: random.Random | None = None, tenure_s: float = DEFAULT_TENURE_S,
               vouched: Collection[str] = ()) -> StatePlan:
    """The state to adopt from ``live``: of the reachable peers offering state, the tenured ones
    (``run.tenure.seniors``: live for ``tenure_s`` or ``vouched`` for; all when none is), so free
    new identities never count. The quorum is a strict majority of those distinct peers; the
    version is the highest one (among ``versions``, if given) that a quorum offers; at it, the
    digest a quorum advertises, else up to ``MAX_BLEND`` of its digests to blend (all when there
    are that few, else drawn with ``rng``). A private peer that no relay reaches is never a donor
    (``PeerRecord.reachable``). StateSyncError when nobody offers state, NoQuorum when no version
    has a quorum."""
    offering = {o[2].record.peer_id for o in _offers(live, exclude)}
    offers = _offers(seniors([p for p in live if p.record.peer_id in offering], tenure_s=tenure_s, vouched=vouched),
                     exclude)
    if not offers:
        raise StateSyncError("no live peer offers the run's state to download", failures=())
    quorum = len(offers) // 2 + 1
    counts = Counter(v for v, _, _ in offers)
    agreed = [v for v, n in counts.items() if n >= quorum and (versions is None or v in versions)]
    if not agreed:
        within = "" if versions is None else f" within versions {min(versions, default=0)}..{max(versions, default=0)}"
        raise NoQuorum(f"no state version{within} is offered by a majority ({quorum} of {len(offers)}) of the "
                       f"donors: offered {_describe_offers(offers)}", offering=len(offers), quorum=quorum)
    version = max(agreed)
    donors: dict[str, list[Donor]] = {}
    for v, digest, peer in sorted(offers, key=lambda o: o[2].record.peer_id):
        if v == version:
            donors.setdefault(digest, []).append(Donor(peer_id=peer.record.peer_id, http_addr=peer.record.http_addr))
    ranked = sorted(donors, key=lambda d: (-len(donors[d]), d))
    backing = quorum
    if len(donors[ranked[0]]) >= quorum:
        chosen = ranked[:1]
    elif len(ranked) <= MAX_BLEND:
        chosen = ranked
    else:  # many diverging replicas: a random sample, whose median a minority of them cannot move
        chosen = sorted((rng or random.Random()).sample(ranked, MAX_BLEND), key=ranked.index)
        backing = min(quorum, sum(len(donors[d]) for d in chosen) // 2 + 1)
    return StatePlan(version=version, sources=tuple(Source(d, tuple(donors[d])) for d in chosen),
                     offering=len(offers), quorum=quorum, backing=backing)


def choose_donors(live: Sequence[LivePeer], *, exclude: str = "") -> tuple[int, str, list[Donor]]:
    """(version, digest, donors) of a plan with one source (``plan_state``): what a majority
    advertises. NoQuorum also when the majority's version has no majority digest."""
    plan = plan_state(live, exclude=exclude)
    if plan.blended:
        raise NoQuorum(f"version {plan.version} has a majority but no digest does", offering=plan.offering,
                       quorum=plan.quorum)
    source = plan.sources[0]
    return plan.version, source.digest, list(source.donors)


def _structure(state: Mapping[str, torch.Tensor]) -> tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]:
    return tuple((name, t.dtype, tuple(t.shape)) for name, t in sorted(state.items()))


def weighted_median(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[int]) -> dict[str, torch.Tensor]:
    """The coordinate-wise median of ``states`` (same names, dtypes and shapes), each counted
    ``weights`` times; where the weight splits evenly, the midpoint of the two middle values
    (integer tensors: the lower one). Equal inputs give that value bit for bit; a minority of the
    weight, whatever it holds, moves no coordinate outside the range of the rest."""
    if not states or len(states) != len(weights) or any(w < 1 for w in weights):
        raise ValueError("weighted_median needs one positive weight per state, and at least one state")
    w = torch.tensor([float(x) for x in weights])
    half = float(w.sum()) / 2
    out = {}
    for name, first in states[0].items():
        stack = torch.stack([s[name].detach().to("cpu", torch.float64) for s in states])
        values, order = stack.sort(dim=0, stable=True)
        cumulative = w.to(torch.float64)[order].cumsum(0)
        lower = values.gather(0, (cumulative < half).sum(0, keepdim=True))
        upper = values.gather(0, (cumulative <= half).sum(0, keepdim=True).clamp(max=len(states) - 1))
        middle = lower if not first.is_floating_point() else (lower + upper) / 2
        out[name] = middle[0].to(first.dtype)
    return out


class _Progress:
    """The ``progress`` of several concurrent downloads, summed."""

    def __init__(self, version: int, hear: Callable[[DownloadProgress], None] | None) -> None:
        self.version, self.hear, self.parts = version, hear, {}

    def part(self, key: int) -> Callable[[DownloadProgress], None]:
        def heard(progress: DownloadProgress) -> None:
            self.parts[key] = progress
            if self.hear is not None:
                ps = self.parts.values()
                self.hear(DownloadProgress(version=self.version, shards_done=sum(p.shards_done for p in ps),
                                           shards=sum(p.shards for p in ps), done_bytes=sum(p.done_bytes for p in ps),
                                           total_bytes=sum(p.total_bytes for p in ps)))
        return heard


async def _blend(client: HttpClient, plan: StatePlan, *, joiner_id: str, timeout_s: float,
                 progress: Callable[[DownloadProgress], None] | None,
                 ) -> tuple[dict[str, torch.Tensor], StateFetchReport]:
    """Every source of ``plan`` downloaded (each verified against its own digest) and their
    weighted median; NoQuorum unless the states that came, of the most common structure, are
    backed by ``plan.backing`` donors."""
    summed = _Progress(plan.version, progress)

    async def one(k: int, source: Source) -> tuple[Source, dict[str, torch.Tensor], StateFetchReport] | StateSyncError:
        try:
            tensors, report = await fetch_state(client, source.donors, version=plan.version, digest=source.digest,
                                                joiner_id=joiner_id, timeout_s=timeout_s, progress=summed.part(k))
        except StateSyncError as exc:
            return exc
        return source, tensors, report

    results = await asyncio.gather(*(one(k, source) for k, source in enumerate(plan.sources)))
    came = [r for r in results if not isinstance(r, StateSyncError)]
    shapes = Counter()
    for source, tensors, _ in came:
        shapes[_structure(tensors)] += len(source.donors)
    if came:
        structure = max(shapes, key=lambda s: shapes[s])
        came = [r for r in came if _structure(r[1]) == structure]
    backed = sum(len(source.donors) for source, _, _ in came)
    failures = tuple(f for r in results for f in (r.failures if isinstance(r, StateSyncError) else r[2].failures))
    if backed < plan.backing:
        reasons = "; ".join(str(r) for r in results if isinstance(r, StateSyncError))
        raise NoQuorum(f"the states of version {plan.version} that could be downloaded and agree in shape are "
                       f"backed by {backed} donors, fewer than the {plan.backing} needed: {reasons}",
                       offering=plan.offering, quorum=plan.quorum)
    blended = await asyncio.to_thread(weighted_median, [t for _, t, _ in came], [len(s.donors) for s, _, _ in came])
    reports = [r for _, _, r in came]
    served = {peer: shards for r in reports for peer, shards in r.shards_served.items()}
    report = StateFetchReport(version=plan.version, num_shards=sum(r.num_shards for r in reports),
                              index_from=reports[0].index_from, shards_served=served, failures=failures,
                              bytes_downloaded=sum(r.bytes_downloaded for r in reports), sources=len(came))
    return blended, report


async def download_state(client: HttpClient, live: Sequence[LivePeer], *, joiner_id: str, timeout_s: float = 120.0,
                         progress: Callable[[DownloadProgress], None] | None = None,
                         versions: Collection[int] | None = None, rng: random.Random | None = None,
                         tenure_s: float = DEFAULT_TENURE_S, vouched: Collection[str] = (),
                         ) -> tuple[int, dict[str, torch.Tensor], StateFetchReport]:
    """Download and verify the state a majority of ``live``'s donors agree on (``plan_state``);
    returns (version, tensors, report). ``progress`` hears how far the download is
    (``statesync.fetch_state``); ``report.sources`` says how many states were blended (1: none).
    NoQuorum when no state has a majority: the caller waits for the records to change. Tenure
    (``tenure_s``, ``vouched``) applies here, for every protocol's catch-up."""
    plan = plan_state(live, exclude=joiner_id, versions=versions, rng=rng, tenure_s=tenure_s, vouched=vouched)
    if plan.blended:
        tensors, report = await _blend(client, plan, joiner_id=joiner_id, timeout_s=timeout_s, progress=progress)
        return plan.version, tensors, report
    source = plan.sources[0]
    tensors, report = await fetch_state(client, source.donors, version=plan.version, digest=source.digest,
                                        joiner_id=joiner_id, timeout_s=timeout_s, progress=progress)
    return plan.version, tensors, replace(report, sources=1)
