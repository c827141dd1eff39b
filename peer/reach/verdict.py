"""What a reachability self-test concludes from its answers, decided without I/O: ``public`` when one
answerer reached both servers (one "not reached" never outvotes a "reached"), ``private`` only on a
quorum of well-formed not-reached answers from distinct answerers and no reached, else what it was."""

from __future__ import annotations

from dataclasses import dataclass, field

from gossamer.peer.run.records import PRIVATE, PUBLIC, UNKNOWN

PRIVATE_QUORUM = 2  # distinct answerers that must fail to reach a peer before it calls itself private


@dataclass(frozen=True)
class Verdict:
    """The outcome of one self-test."""

    kind: str = UNKNOWN
    asked: int = 0
    answered: int = 0
    http: bool = False
    tcp: bool = False
    observed: tuple[str, ...] = ()
    why: tuple[str, ...] = field(default=())
    vetted: bool = False  # the answerers were tenured or vouched for (not whoever was live)

    def to_json(self) -> dict:
        return {"kind": self.kind, "asked": self.asked, "answered": self.answered, "http": self.http,
                "tcp": self.tcp, "observed": list(self.observed), "why": list(self.why), "vetted": self.vetted}


def well_formed(answer: object) -> bool:
    """A dial-back answer that says what it found: ``http`` and ``tcp`` booleans."""
    return isinstance(answer, dict) and isinstance(answer.get("http"), bool) and isinstance(answer.get("tcp"), bool)


def quorum(pool: int) -> int:
    """Not-reached answers needed for ``private`` when ``pool`` answerers could be asked: a run with
    one other peer still learns it is private."""
    return max(1, min(PRIVATE_QUORUM, pool))


def classify(previous: str, *, asked: int, answers: list[dict], needed: int, vetted: bool = False) -> Verdict:
    """The verdict from ``answers`` (one per distinct answerer; malformed ones do not count);
    ``previous`` when they settle nothing."""
    answers = [a for a in answers if well_formed(a)]
    if not answers:
        return Verdict(kind=previous, asked=asked, vetted=vetted)
    reached = any(a["http"] and a["tcp"] for a in answers)
    if reached:
        kind = PUBLIC
    elif len(answers) >= needed:
        kind = PRIVATE
    else:
        kind = previous
    observed = tuple(dict.fromkeys(str(a.get("observed", ""))[:64] for a in answers if a.get("observed")))
    why = tuple(dict.fromkeys(str(a.get("why", ""))[:300] for a in answers if a.get("why")))
    return Verdict(kind=kind, asked=asked, answered=len(answers), http=any(a["http"] for a in answers),
                   tcp=any(a["tcp"] for a in answers), observed=observed, why=why, vetted=vetted)
