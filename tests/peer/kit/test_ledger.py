"""The one ledger: settling accounts for every expected peer exactly once, and the balance check
finds every way a ledger can be wrong."""

from __future__ import annotations

from gossamer.peer.kit.ledger import Exchange, History


def test_a_settled_exchange_accounts_for_every_expected_peer_once() -> None:
    exchange = Exchange()
    exchange.expect(["a", "b", "c", "d"])
    exchange.reject("c", "shape mismatch")
    exchange.settle(["a", "b", "c"])
    exchange.use(["a", "b", "c"])

    assert exchange.used == ["a", "b"]  # a rejected contribution is never used
    assert exchange.rejected == {"c": "shape mismatch"} and exchange.timed_out == ["d"]
    assert exchange.balance_problems() == []


def test_the_balance_check_names_each_problem() -> None:
    broken = Exchange(expected=["a", "b", "c"], arrived=["a"], used=["a", "b"], rejected={"a": "late"},
                      timed_out=["a"])
    problems = " | ".join(broken.balance_problems())

    assert "['a'] are both used and rejected" in problems
    assert "['a'] are both used and timed out" in problems
    assert "expected ['c'] are neither used, rejected nor timed out" in problems
    assert "used ['b'] never arrived" in problems
    assert "['a'] arrived but are counted as timed out" in problems


def test_a_rejection_from_an_unexpected_peer_is_kept_and_still_balances() -> None:
    exchange = Exchange()
    exchange.expect(["a"])
    exchange.reject("stale", "trained from version 3, which has closed")
    exchange.settle(["a"])
    exchange.use(["a"])

    assert exchange.balance_problems() == [] and "stale" in exchange.rejected


def test_the_history_keeps_the_most_recent_ledgers_by_key() -> None:
    history: History[int, Exchange] = History(maxlen=2)
    for round in range(3):
        history.add(round, Exchange(expected=[str(round)]))

    assert history.get(0) is None and history.get(2).expected == ["2"]  # type: ignore[union-attr]
    assert [e["expected"] for e in history.last(5)] == [["1"], ["2"]] and len(history) == 2
    assert [e.expected for e in history] == [["1"], ["2"]]
