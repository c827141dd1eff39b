"""The transport benchmark's rows (entry point ``transport.py``), built as scenarios and run
interleaved, each after one untimed warm-up transfer checked end to end; the ratios and table
are in ``_transport_report``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import _hivemind
import _http
import _raw
import _tcp
from _common import (
    BenchError,
    Scenario,
    run_interleaved,
    summarize,
)
from _relay_rows import relay_rows, relay_table
from _transport_report import TARGETS, compute_ratios, render_table
from _wan import WAN_LATENCY_MS, WAN_MBIT_PER_S, link_rate_bytes_per_s

from gossamer_harness.report import MB, machine, write_result

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "transport.json"
HIVEMIND_MATCHMAKING_S = 1.0
HIVEMIND_REQUEST_TIMEOUT_S = 0.5
HIVEMIND_STEP_TIMEOUT_S = 120.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Transport throughput: raw socket vs gossamer TCP/HTTP vs hivemind")
    parser.add_argument("--size_mb", type=float, default=100.0, help="tensor size in MB (10^6 bytes)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions per loopback row")
    parser.add_argument("--wan_size_mb", type=float, default=25.0, help="tensor size of the WAN rows")
    parser.add_argument("--wan_repeats", type=int, default=3, help="timed repetitions of the WAN rows")
    parser.add_argument("--skip_hivemind", action="store_true", help="leave out the hivemind averager row")
    parser.add_argument("--skip_wan", action="store_true", help="leave out the WAN proxy rows")
    parser.add_argument("--relay", action="store_true",
                        help="add the relay rows: direct vs relayed between network namespaces (root)")
    parser.add_argument("--only_relay", action="store_true", help="run only the relay rows")
    parser.add_argument("--relay_rate_mbit", type=float, default=100.0, help="egress cap of the shaped relay rows")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the results")
    parser.add_argument("--pin_cpu", type=int, default=None,
                        help="pin every benchmark process to this CPU (both sides share one core)")
    args = parser.parse_args(argv)
    if args.size_mb <= 0 or args.wan_size_mb <= 0 or args.repeats < 1 or args.wan_repeats < 1:
        parser.error("sizes must be > 0 and repeat counts >= 1")
    if args.pin_cpu is not None and args.pin_cpu not in os.sched_getaffinity(0):
        parser.error(f"--pin_cpu {args.pin_cpu} is not one of the CPUs available: {sorted(os.sched_getaffinity(0))}")
    return args


def size_bytes(size_mb: float) -> int:
    """``size_mb`` MB rounded down to a whole number of float32 values."""
    return int(size_mb * MB) // 4 * 4


def pair(name: str, module: Any, repeats: int, params: dict[str, Any]) -> Scenario:
    """A receiver process and a sender process of ``module``."""
    return Scenario(name=name, workers=[(module.receiver, params), (module.sender, params)], repeats=repeats)


def hivemind_peers(repeats: int, params: dict[str, Any]) -> Scenario:
    """Two averaging peers."""
    params = {**params, "min_matchmaking_time_s": HIVEMIND_MATCHMAKING_S,
              "request_timeout_s": HIVEMIND_REQUEST_TIMEOUT_S, "step_timeout_s": HIVEMIND_STEP_TIMEOUT_S}
    return Scenario(name="hivemind", workers=[(_hivemind.peer, params), (_hivemind.peer, params)], repeats=repeats)


def build_scenarios(args: argparse.Namespace) -> list[tuple[Scenario, int]]:
    """The rows: raw socket (``sendall`` / ``recv_into`` a preallocated buffer: the ceiling);
    gossamer TCP received straight into a preallocated destination (``payload_buffer``), and as a
    diagnostic with a fresh buffer per frame; gossamer HTTP; hivemind's ``DecentralizedAverager``
    (two peers); gossamer TCP and HTTP through a ``WanProxy``."""
    """The rows to run, in order, each with its payload size."""
    size, wan_size = size_bytes(args.size_mb), size_bytes(args.wan_size_mb)
    loopback = {"size_bytes": size, "seed": 1, "pin_cpu": args.pin_cpu}
    wan = {**loopback, "size_bytes": wan_size, "wan": True}
    rows = [(pair("raw", _raw, args.repeats, loopback), size),
            (pair("tcp", _tcp, args.repeats, {**loopback, "reuse_buffer": True}), size),
            (pair("tcp_fresh", _tcp, args.repeats, loopback), size),
            (pair("http", _http, args.repeats, loopback), size)]
    if not args.skip_hivemind:
        rows.append((hivemind_peers(args.repeats, loopback), size))
    if not args.skip_wan:
        rows.append((pair("tcp_wan", _tcp, args.wan_repeats, wan), wan_size))
        rows.append((pair("http_wan", _http, args.wan_repeats, wan), wan_size))
    return rows


def transfer_seconds(name: str, reps: list[list[dict[str, Any]]]) -> list[float]:
    """Seconds of each timed repetition: the sender's, or for hivemind the slower peer's step."""
    timed = reps[1:]
    if name == "hivemind":
        return [max(result["seconds"] for result in rep) for rep in timed]
    return [rep[1]["seconds"] for rep in timed]


def check_raw(outcome: dict[str, Any]) -> None:
    receiver, sender = outcome["reps"][0]
    if receiver["checksum"] != sender["checksum"]:
        raise BenchError("raw socket: the receiver's buffer differs from what was sent")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Run every row, repetitions interleaved, and return the JSON-ready results per row."""
    scenarios = build_scenarios(args)
    outcomes = run_interleaved([scenario for scenario, _ in scenarios], log=_log)
    check_raw(outcomes["raw"])
    results: dict[str, Any] = {}
    for scenario, size in scenarios:
        outcome = outcomes[scenario.name]
        row = summarize(transfer_seconds(scenario.name, outcome["reps"]), size)
        row.update(repeats=scenario.repeats, warmup_reps=1, workers=outcome)
        results[scenario.name] = row
        _log(f"{scenario.name}: median {row['median_mb_per_s']:.1f} MB/s")
    return results


def run_relay(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    rows = relay_rows(size_bytes=size_bytes(args.size_mb), shaped_size_bytes=size_bytes(args.wan_size_mb),
                      repeats=args.repeats, shaped_repeats=args.wan_repeats, rate_mbit=args.relay_rate_mbit, log=_log)
    return rows, relay_table(rows, args.relay_rate_mbit)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    before = machine()
    if args.only_relay:
        rows, table = run_relay(args)
        print(table)
        write_result(args.json, {"rows": rows, "table_markdown": table}, before=before, args=args)
        print(f"\nwrote {args.json}", file=sys.stderr)
        return 0
    rows = run_all(args)
    link = {"mbit_per_s": WAN_MBIT_PER_S, "latency_ms": WAN_LATENCY_MS,
            "rate_mb_per_s": link_rate_bytes_per_s() / MB}
    ratios = compute_ratios(rows, link["rate_mb_per_s"])
    table = render_table(rows, ratios, link)
    if args.relay:
        relayed, relay_markdown = run_relay(args)
        rows.update(relayed)
        table = f"{table}\n\n{relay_markdown}"
    print(table)
    write_result(args.json, {"hivemind": {"min_matchmaking_time_s": HIVEMIND_MATCHMAKING_S,
                                        "request_timeout_s": HIVEMIND_REQUEST_TIMEOUT_S},
                             "wan_link": link, "targets": TARGETS, "rows": rows, "ratios": ratios,
                             "table_markdown": table}, before=before, args=args)
    print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
