"""Expert coverage as ``gossamer status`` and the swarm page show it, from the hosts' records: the
newest placement only (a dead host's record, live until it expires, is left out), flags for an
expert no live host holds and for one the last re-placement found without an agreed holder."""

from __future__ import annotations

from gossamer.peer.run.records import PeerRecord
from gossamer.protocols.fomoe.coverage import coverage_table, panel, summarize


def host(index: int, experts: list[int], *, round: int, placement_round: int, members: int,
         tokens: list[int] | None = None, lost: list[int] | None = None) -> PeerRecord:
    assignment = {"experts": experts, "n_experts": 4, "replication": 2, "placement_round": placement_round,
                  "members": members, "tokens": tokens or [10, 20, 30, 40], "lost": lost or []}
    return PeerRecord(peer_id=f"{index:x}" * 64, public_key=b"k", name="", http_addr="", tcp_addr="",
                      roles=("expert-host",), version="0", round=round, timestamp=0.0, assignment=assignment)


def test_the_newest_placement_is_shown_and_a_dead_hosts_stale_record_is_left_out() -> None:
    survivors = [host(1, [0, 1], round=3, placement_round=3, members=3),
                 host(2, [1, 2, 3], round=3, placement_round=3, members=3),
                 host(3, [0, 2, 3], round=3, placement_round=3, members=3, lost=[3])]
    dead = host(4, [2, 3], round=2, placement_round=0, members=4)
    table = coverage_table([*survivors, dead])
    assert not isinstance(table, str)
    heading, rows = table
    assert "4 expert(s), r = 2, 3 member(s) (round 3)" in heading
    assert [row[0] for row in rows] == [0, 1, 2, 3]
    assert [len(row[1]) for row in rows] == [2, 2, 2, 2] and ("4" * 12) not in str(rows)
    assert [row[2] for row in rows] == [10, 20, 30, 40]
    assert rows[3][3].startswith("lost at the last re-placement") and rows[0][3] == ""
    lines = summarize([*survivors, dead])
    assert lines[0] == heading and len(lines) == 6 and "NO LIVE HOLDER" not in "\n".join(lines)
    shown = panel([*survivors, dead])
    assert shown is not None and shown.title == "expert coverage" and len(shown.rows) == 4


def test_an_expert_no_live_host_holds_is_flagged() -> None:
    records = [host(1, [0, 1], round=5, placement_round=4, members=2),
               host(2, [1, 2], round=5, placement_round=4, members=2)]  # expert 3's holders are gone
    lines = summarize(records)
    assert lines[-1].startswith("3") and "NO LIVE HOLDER" in lines[-1], lines


def test_before_any_placement_there_is_one_line_and_no_panel() -> None:
    waiting = host(1, [], round=0, placement_round=-1, members=0)
    assert summarize([waiting]) == ["experts: 1 expert host(s) live, none in a placement yet"]
    assert panel([waiting]) is None
