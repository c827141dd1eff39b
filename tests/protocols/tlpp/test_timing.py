"""How the TL++ orchestrator times a phase's requests (``protocols.tlpp.timing.paced``): the calls
still running at the cutoff are cut only when another one answered, and a phase cancelled cancels
its calls."""

from __future__ import annotations

import asyncio

import pytest

from gossamer.peer.kit.secure_link import RequestRefused, SecureLinkError
from gossamer.protocols.tlpp.timing import paced

# -- paced: the phase's calls and the cutoff -------------------------------------------------------

async def never(entered: asyncio.Event | None = None) -> str:
    if entered is not None:
        entered.set()
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def at_once(value: str) -> str:
    return value


async def work(seconds: float, value: str) -> str:
    await asyncio.sleep(seconds)  # the simulated work itself: the outcome does not depend on it
    return value


async def test_the_calls_still_running_at_the_cutoff_are_cut_once_another_answered() -> None:
    outcome = await paced({"fast": at_once("a"), "hung": never()}, 0.01)

    assert outcome.results["fast"] == "a" and set(outcome.took_s) == {"fast"} and set(outcome.cut_s) == {"hung"}
    assert isinstance(outcome.results["hung"], SecureLinkError) and "late" in str(outcome.results["hung"])


async def test_nobody_is_cut_when_nobody_answered_by_the_cutoff_or_there_is_none() -> None:
    slow_for_all = await paced({"a": work(0.05, "a"), "b": work(0.1, "b")}, 0.01)
    fixed = await paced({"a": at_once("a"), "b": work(0.05, "b")}, None)

    assert slow_for_all.results == {"a": "a", "b": "b"} and slow_for_all.cut_s == {}
    assert fixed.results == {"a": "a", "b": "b"} and fixed.cut_s == {}


async def test_a_call_that_failed_is_no_answer_and_cuts_nobody() -> None:
    async def refused() -> str:
        raise RequestRefused("no", code="stale")

    async def times_out() -> str:
        async with asyncio.timeout(0.05):  # the request's own timeout
            return await never()

    outcome = await paced({"refused": refused(), "slow": times_out()}, 0.01)

    assert outcome.cut_s == {} and isinstance(outcome.results["refused"], RequestRefused)
    assert isinstance(outcome.results["slow"], TimeoutError)


async def test_cancelling_a_phase_cancels_its_calls() -> None:
    entered, calls = asyncio.Event(), {}
    calls["hung"] = never(entered)
    phase = asyncio.create_task(paced(calls, None))
    await entered.wait()

    phase.cancel()

    with pytest.raises(asyncio.CancelledError):
        await phase
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
