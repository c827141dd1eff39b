"""State sync: a joiner downloads the state from real donors over loopback HTTP and checks every byte."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
from collections.abc import AsyncIterator, Mapping

import pytest
import torch
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from gossamer.peer.errors import PeerError
from gossamer.peer.kit.state_donor import StateDonor
from gossamer.peer.kit.statesync import (
    Donor,
    DownloadProgress,
    FetchFailure,
    StateSyncError,
    fetch_state,
    index_digest,
    plan_shards,
    start_offset,
    state_index,
)
from gossamer.transport.errors import RemoteError
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer

VERSION = 7
DOWN = None  # a donor slot whose server is closed before the joiner asks


def make_state() -> dict[str, torch.Tensor]:
    """About 3.5 MB in tensors of several dtypes and sizes, including an empty and a transposed one."""
    gen = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(512, 1024, generator=gen),
        "block.0.w": torch.randn(256, 1024, generator=gen).to(torch.bfloat16),
        "block.0.b": torch.randn(1024, generator=gen, dtype=torch.float64),
        "head.w": torch.randn(700, 300, generator=gen).half(),
        "ids": torch.randint(0, 256, (4096,), generator=gen, dtype=torch.uint8),
        "mask": torch.rand(1000, generator=gen) > 0.5,
        "step": torch.tensor([1234], dtype=torch.int64),
        "empty": torch.zeros(0, 3),
        "proj.t": torch.randn(96, 64, generator=gen).t(),  # not contiguous
    }


def fixed(version: int, tensors: Mapping[str, torch.Tensor]):
    return lambda: (version, tensors)


def joiner_starting_at(position: int, num_donors: int) -> str:
    return next(f"joiner-{k}" for k in range(1000) if start_offset(f"joiner-{k}", num_donors) == position)


def assert_exact_copy(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor]) -> None:
    assert list(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name


def shard_of(peer_position: int, joiner_id: str, num_donors: int = 3) -> int:
    """The shard a donor is asked for first, as fetch_state assigns it (one shard per donor)."""
    return (peer_position - start_offset(joiner_id, num_donors)) % num_donors


@pytest.fixture
async def no_leaks() -> AsyncIterator[None]:
    fds_before = len(os.listdir("/proc/self/fd"))
    yield
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    assert not others, f"tasks left running: {others}"
    assert len(os.listdir("/proc/self/fd")) <= fds_before, "sockets left open"


@contextlib.asynccontextmanager
async def swarm(getters: list) -> AsyncIterator[tuple[HttpClient, list[Donor]]]:
    """One real HTTP server per getter (``DOWN``: started, then closed; a list: those routes) and a client."""
    async with contextlib.AsyncExitStack() as stack:
        servers = []
        for getter in getters:
            app = web.Application()
            app.add_routes(getter if isinstance(getter, list) else StateDonor(getter or fixed(VERSION, {})).routes())
            servers.append(await HttpServer.create(app, host="127.0.0.1", port=0, config=HttpConfig()))
        donors = [Donor(peer_id=f"donor-{i}", http_addr=f"127.0.0.1:{s.address[1]}") for i, s in enumerate(servers)]
        for getter, server in zip(getters, servers, strict=True):
            if getter is DOWN:
                await server.aclose()
            else:
                stack.push_async_callback(server.aclose)
        client = await HttpClient.create(config=HttpConfig())
        stack.push_async_callback(client.aclose)
        yield client, donors


real_http = pytest.mark.usefixtures("no_leaks")


@real_http
async def test_joiner_gets_an_exact_copy_with_one_shard_per_donor() -> None:
    state = make_state()
    digest = index_digest(state_index(VERSION, state))
    joiner = joiner_starting_at(1, 3)
    async with swarm([fixed(VERSION, state)] * 3) as (client, donors):
        got, report = await fetch_state(client, donors, version=VERSION, digest=digest, joiner_id=joiner)
    assert_exact_copy(got, state)
    assert report.num_shards == 3 and report.failures == ()
    assert report.shards_served == {"donor-1": (0,), "donor-2": (1,), "donor-0": (2,)}
    assert report.index_from == "donor-1"
    assert report.bytes_downloaded == sum(t.numel() * t.element_size() for t in state.values())


@real_http
async def test_progress_is_told_once_the_index_is_verified_and_after_every_verified_shard() -> None:
    """The donor asked first is down: shard 0 comes from another donor and is counted once, when it verifies."""
    state = make_state()
    total = sum(t.numel() * t.element_size() for t in state.values())
    told: list[DownloadProgress] = []
    joiner = joiner_starting_at(0, 3)
    async with swarm([DOWN, fixed(VERSION, state), fixed(VERSION, state)]) as (client, donors):
        _, report = await fetch_state(client, donors, version=VERSION, digest=index_digest(state_index(VERSION, state)),
                                      joiner_id=joiner, progress=told.append)
    assert report.num_shards == 3 and [f.peer_id for f in report.failures] == ["donor-0"]
    assert [(p.version, p.shards, p.total_bytes) for p in told] == [(VERSION, 3, total)] * 4
    assert [p.shards_done for p in told] == [0, 1, 2, 3]
    assert told[0].done_bytes == 0 and told[-1].done_bytes == total
    assert all(a.done_bytes < b.done_bytes for a, b in itertools.pairwise(told))


def tamper(tensor: torch.Tensor, how: str) -> torch.Tensor:
    if how == "value":
        flipped = tensor.clone()
        flipped.view(-1).view(torch.uint8)[0] ^= 1
        return flipped
    if how == "dtype":
        return tensor.to(torch.float32 if tensor.dtype == torch.float64 else torch.float64)
    return tensor.reshape(-1) if tensor.dim() != 1 else tensor.reshape(1, -1)


@real_http
@pytest.mark.parametrize("how", ["value", "dtype", "shape"])
async def test_corrupt_and_down_donors_are_routed_around(how: str) -> None:
    state = make_state()
    index = state_index(VERSION, state)
    joiner = joiner_starting_at(0, 3)  # the index comes from donor-0, which is honest
    bad_shard, down_shard = shard_of(1, joiner), shard_of(2, joiner)
    victim = max(plan_shards(index, 3)[bad_shard], key=lambda name: state[name].numel())
    tampered = {**state, victim: tamper(state[victim], how)}
    async with swarm([fixed(VERSION, state), fixed(VERSION, tampered), DOWN]) as (client, donors):
        got, report = await fetch_state(client, donors, version=VERSION, digest=index_digest(index), joiner_id=joiner)
    assert_exact_copy(got, state)
    failed = {(f.peer_id, f.shard): f.reason for f in report.failures}
    assert ("donor-1", bad_shard) in failed and ("donor-2", down_shard) in failed
    assert {peer for peer, _ in failed} == {"donor-1", "donor-2"}  # a retry may also reach donor-2 first
    if how == "value":
        assert f"tensor {victim!r}: sha256 does not match" in failed["donor-1", bad_shard]
    assert report.shards_served["donor-2"] == ()
    assert bad_shard not in report.shards_served["donor-1"]
    assert sorted(s for served in report.shards_served.values() for s in served) == [0, 1, 2]


@real_http
async def test_a_donor_that_failed_the_index_is_not_asked_for_a_shard() -> None:
    state = make_state()
    joiner = joiner_starting_at(1, 3)  # donor-1 is asked for the index first, and is down
    async with swarm([fixed(VERSION, state), DOWN, fixed(VERSION, state)]) as (client, donors):
        got, report = await fetch_state(client, donors, version=VERSION,
                                        digest=index_digest(state_index(VERSION, state)), joiner_id=joiner)
    assert_exact_copy(got, state)
    assert [(f.peer_id, f.shard) for f in report.failures] == [("donor-1", None)]
    assert "ConnectFailed" in report.failures[0].reason
    assert report.index_from == "donor-2" and report.shards_served["donor-1"] == ()


@real_http
async def test_a_stalled_donor_times_out_and_its_shard_moves_on() -> None:
    state, release = make_state(), asyncio.Event()

    async def stall(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(status=503)

    stalled = [*StateDonor(fixed(VERSION, state)).routes()[:1], web.get("/state/shard", stall)]
    joiner = joiner_starting_at(0, 3)
    async with swarm([fixed(VERSION, state), stalled, fixed(VERSION, state)]) as (client, donors):
        got, report = await fetch_state(client, donors, version=VERSION, timeout_s=0.5,
                                        digest=index_digest(state_index(VERSION, state)), joiner_id=joiner)
        release.set()
    assert_exact_copy(got, state)
    assert report.failures == (FetchFailure("donor-1", shard_of(1, joiner), "timed out after 0.5 s"),)


@real_http
@pytest.mark.parametrize("names", [[], ["only"], ["a", "b"]])
async def test_fewer_tensors_than_donors_means_fewer_shards(names: list[str]) -> None:
    state = {name: torch.full((3,), float(k)) for k, name in enumerate(names)}
    async with swarm([fixed(VERSION, state)] * 3) as (client, donors):
        got, report = await fetch_state(client, donors, version=VERSION,
                                        digest=index_digest(state_index(VERSION, state)), joiner_id="j")
    assert_exact_copy(got, state)
    assert report.num_shards == len(names) and report.failures == ()
    assert sorted(len(served) for served in report.shards_served.values()) == [0] * (3 - len(names)) + [1] * len(names)


@real_http
async def test_different_joiners_start_at_different_donors() -> None:
    state = make_state()
    digest = index_digest(state_index(VERSION, state))
    first, second = joiner_starting_at(0, 3), joiner_starting_at(2, 3)
    async with swarm([fixed(VERSION, state)] * 3) as (client, donors):
        _, report_a = await fetch_state(client, donors, version=VERSION, digest=digest, joiner_id=first)
        _, report_b = await fetch_state(client, donors, version=VERSION, digest=digest, joiner_id=second)
    assert (report_a.index_from, report_b.index_from) == ("donor-0", "donor-2")
    assert report_a.shards_served["donor-0"] == (0,) and report_b.shards_served["donor-2"] == (0,)


def test_joiner_ids_spread_over_donors() -> None:
    counts = [0] * 5
    for k in range(500):
        counts[start_offset(f"peer-{k}", 5)] += 1
    assert min(counts) >= 60  # 100 expected each


@real_http
async def test_digest_mismatch_on_every_donor_raises() -> None:
    state = make_state()
    wrong = index_digest(state_index(VERSION + 1, state))
    async with swarm([fixed(VERSION, state)] * 3) as (client, donors):
        with pytest.raises(StateSyncError) as caught:
            await fetch_state(client, donors, version=VERSION, digest=wrong, joiner_id="j")
    assert isinstance(caught.value, PeerError)
    first = start_offset("j", 3)
    rotation = [donor.peer_id for donor in donors[first:] + donors[:first]]
    assert [(f.peer_id, f.shard) for f in caught.value.failures] == [(peer, None) for peer in rotation]
    assert all("does not match the published" in f.reason for f in caught.value.failures)


@real_http
async def test_donor_at_another_version_answers_409_and_is_routed_around() -> None:
    state = make_state()
    index = state_index(VERSION, state)
    joiner = joiner_starting_at(0, 3)
    moved_shard = shard_of(1, joiner)
    async with swarm([fixed(VERSION, state), fixed(VERSION + 1, state), fixed(VERSION, state)]) as (client, donors):
        got, report = await fetch_state(client, donors, version=VERSION, digest=index_digest(index), joiner_id=joiner)
    assert_exact_copy(got, state)
    assert [(f.peer_id, f.shard) for f in report.failures] == [("donor-1", moved_shard)]
    assert "409" in report.failures[0].reason
    assert report.shards_served["donor-1"] == ()


@real_http
async def test_state_moving_on_mid_sync_fails_every_shard_on_every_donor() -> None:
    state = make_state()
    index = state_index(VERSION, state)
    box = {"version": VERSION}

    def moving() -> tuple[int, dict[str, torch.Tensor]]:  # the swarm moves on right after the index is read
        version, box["version"] = box["version"], VERSION + 1
        return version, state

    async with swarm([moving] * 3) as (client, donors):
        with pytest.raises(StateSyncError) as caught:
            await fetch_state(client, donors, version=VERSION, digest=index_digest(index), joiner_id="j")
    assert "shard(s) [0, 1, 2] of 3 failed on every donor" in str(caught.value)
    shard_failures = [f for f in caught.value.failures if f.shard is not None]
    assert len(shard_failures) == 9 and all("409" in f.reason for f in shard_failures)


@real_http
@pytest.mark.parametrize(("query", "complaint"), [
    ("count=3&index=0", "'version'"),
    ("version=x&count=3&index=0", "'version'"),
    ("version=7&count=0&index=0", "'count' must be at least 1"),
    ("version=7&count=3&index=3", "'index' must be below"),
    ("version=7&count=-1&index=0", "'count'"),
    ("version=7&count=99&index=0", "exceeds the number of tensors"),
])
async def test_donor_refuses_bad_shard_parameters(query: str, complaint: str) -> None:
    async with swarm([fixed(VERSION, make_state())]) as (client, donors):
        with pytest.raises(RemoteError) as caught:
            await client.get_tensors(f"http://{donors[0].http_addr}/state/shard?{query}")
    assert caught.value.status == 400
    assert complaint in str(caught.value)


@real_http
async def test_donor_index_follows_the_version_and_matches_the_published_digest() -> None:
    state, box = make_state(), {"version": VERSION}
    donor = StateDonor(lambda: (box["version"], state))
    first = await donor.published()
    box["version"] = VERSION + 1
    second = await donor.published()
    assert first == (VERSION, index_digest(state_index(VERSION, state)))
    assert second == (VERSION + 1, index_digest(state_index(VERSION + 1, state)))


def test_index_is_sorted_canonical_and_sensitive_to_every_byte() -> None:
    state = make_state()
    shuffled = dict(reversed(list(state.items())))
    flipped = {**state, "step": torch.tensor([1235], dtype=torch.int64)}
    index = state_index(VERSION, state)
    assert [entry["name"] for entry in index["tensors"]] == sorted(state)
    assert index["tensors"][0] == {"name": "block.0.b", "dtype": "float64", "shape": [1024], "nbytes": 8192,
                                   "sha256": index["tensors"][0]["sha256"]}
    assert index_digest(state_index(VERSION, shuffled)) == index_digest(index)
    assert index_digest(state_index(VERSION, flipped)) != index_digest(index)


def index_of(sizes: Mapping[str, int]) -> dict:
    return {"version": 0, "tensors": [{"name": n, "nbytes": b} for n, b in sizes.items()]}


@pytest.mark.parametrize(("sizes", "num_shards", "expected"), [
    ({"a": 10}, 1, [["a"]]),
    ({"a": 10, "b": 10}, 3, [["a"], ["b"], []]),
    ({"a": 5, "b": 5, "c": 5, "d": 5}, 2, [["a", "c"], ["b", "d"]]),
    ({"a": 7, "b": 5, "c": 4, "d": 3, "e": 1}, 2, [["a", "d"], ["b", "c", "e"]]),
    ({"x": 1, "y": 100, "z": 1, "w": 50}, 2, [["y"], ["w", "x", "z"]]),
    ({"a": 0, "b": 0, "c": 9}, 2, [["c"], ["a", "b"]]),
])
def test_plan_shards_table(sizes: dict[str, int], num_shards: int, expected: list[list[str]]) -> None:
    assert plan_shards(index_of(sizes), num_shards) == expected


def naive_plan(sizes: Mapping[str, int], num_shards: int) -> list[list[str]]:
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    loads = [0] * num_shards
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        lightest = min(range(num_shards), key=lambda s: (loads[s], s))
        shards[lightest].append(name)
        loads[lightest] += sizes[name]
    return [sorted(s) for s in shards]


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 10**9), max_size=40), st.integers(1, 8),
       st.randoms(use_true_random=False))
def test_plan_shards_is_balanced_deterministic_and_matches_a_naive_greedy(
        sizes: dict[str, int], num_shards: int, rng: random.Random) -> None:
    items = list(sizes.items())
    rng.shuffle(items)
    plan = plan_shards(index_of(dict(items)), num_shards)
    assert plan == naive_plan(sizes, num_shards) == plan_shards(index_of(sizes), num_shards)
    assert sorted(name for shard in plan for name in shard) == sorted(sizes)
    loads = [sum(sizes[name] for name in shard) for shard in plan]
    assert max(loads) - min(loads) <= max(sizes.values(), default=0)


def test_plan_shards_refuses_a_bad_count() -> None:
    with pytest.raises(ValueError, match="num_shards"):
        plan_shards(index_of({"a": 1}), 0)
