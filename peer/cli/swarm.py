"""``gossamer swarm``: an orchestrator and N peers as separate processes on loopback.

Ports are chosen by the OS; the orchestrator's ``ready`` event (``--events`` JSON lines) gives
the multiaddrs and run id the peers join with. Each process's events are streamed to this
terminal with its name; its log goes to ``WORKDIR/NAME.log``. A live peer table (from the
orchestrator's ``/status``) is printed whenever it changes. Ctrl+C (or ``--duration_s``) stops
them all: SIGTERM first, SIGKILL for any that do not exit in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gossamer.peer.cli.status import format_table
from gossamer.peer.errors import ConfigError, StartupError
from gossamer.transport.errors import TransportError
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 25.0


@dataclass(frozen=True, kw_only=True)
class SwarmOptions:
    config: Path | None = None
    preset: str | None = None
    peers: int | None = None
    duration_s: float | None = None
    workdir: Path | None = None


def load_swarm_config(options: SwarmOptions) -> tuple[str, dict[str, Any]]:
    """The run config text and its ``[swarm]`` table, from a file or a built-in preset."""
    if options.preset is not None:
        preset = resources.files("gossamer.peer.cli.presets") / f"{options.preset}.toml"
        if not preset.is_file():
            raise ConfigError(f"no built-in preset {options.preset!r}")
        text = preset.read_text(encoding="utf-8")
    else:
        try:
            text = Path(options.config).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read {options.config}: {exc.strerror}") from exc
    try:
        swarm = tomllib.loads(text).get("swarm", {})
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"run config is not valid TOML: {exc}") from exc
    return text, swarm


class Swarm:
    """The processes of one local swarm and the tasks that stream their output."""

    def __init__(self, options: SwarmOptions) -> None:
        self.text, table = load_swarm_config(options)
        self.num_peers = options.peers if options.peers is not None else int(table.get("peers", 3))
        self.duration_s = options.duration_s if options.duration_s is not None else table.get("duration_s")
        self.roles = [str(r) for r in table.get("roles", [])]
        self.threads = int(table.get("threads", 1))
        self.finished: dict[str, dict[str, Any]] = {}
        if self.num_peers < 0:
            raise ConfigError("--peers must be >= 0")
        min_learners = tomllib.loads(self.text).get("hyper", {}).get("min_learners", 1)
        if "learner" in self.roles and isinstance(min_learners, int) and min_learners > self.num_peers:
            raise ConfigError(f"hyper.min_learners = {min_learners} but this swarm starts {self.num_peers} learner(s), "
                              f"so round 0 would never start; pass --peers {min_learners} or more")
        self.workdir = options.workdir or Path(tempfile.mkdtemp(prefix="gossamer-swarm-"))
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(maxsize=1024)
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self, stop: asyncio.Event) -> int:
        self.workdir.mkdir(parents=True, exist_ok=True)
        run_toml = self.workdir / "run.toml"
        run_toml.write_text(self.text, encoding="utf-8")
        print(f"swarm: workdir {self.workdir} (identities and logs)", flush=True)
        try:
            ready = await self._start_orchestrator(run_toml)
            for index in range(1, self.num_peers + 1):
                await self._spawn(f"peer-{index}", ["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"],
                                                    *(["--roles", *self.roles] if self.roles else [])])
            return await self._watch(ready, stop)
        finally:
            await self.aclose()

    async def _start_orchestrator(self, run_toml: Path) -> dict[str, Any]:
        await self._spawn("orchestrator", ["orchestrator", "-c", str(run_toml), "--new_swarm"])
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            name, event = await asyncio.wait_for(self.events.get(), timeout=max(0.1, deadline - time.monotonic()))
            self._print_event(name, event)
            if name == "orchestrator" and event["event"] == "ready":
                return event
            if name == "orchestrator" and event["event"] == "exited":
                raise StartupError(f"the orchestrator exited before it was ready; see {self.workdir / 'orchestrator.log'}")

    async def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("ab")  # closed by _pump when the process exits
        argv = [sys.executable, "-m", "gossamer.peer.cli", *args, "--identity_path", str(self.workdir / f"{name}.pem"),
                "--public_name", name, "--host", "127.0.0.1", "--host_maddrs", "/ip4/127.0.0.1/tcp/0", "--events",
                "--threads", str(self.threads), "--checkpoint_dir", str(self.workdir / "checkpoints")]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=log,
                                                    start_new_session=True)
        self.procs[name] = proc
        self._tasks.append(asyncio.create_task(self._pump(name, proc, log), name=f"swarm-{name}"))

    async def _pump(self, name: str, proc: asyncio.subprocess.Process, log) -> None:
        try:
            assert proc.stdout is not None
            async for line in proc.stdout:
                with contextlib.suppress(ValueError):
                    await self.events.put((name, json.loads(line)))
            await self.events.put((name, {"event": "exited", "code": await proc.wait()}))
        finally:
            log.close()

    async def _watch(self, ready: dict[str, Any], stop: asyncio.Event) -> int:
        client = await HttpClient.create(config=HttpConfig())
        started, last_table, all_seen = time.monotonic(), "", False
        try:
            while not stop.is_set():
                if self.duration_s is not None and time.monotonic() - started >= float(self.duration_s):
                    break
                with contextlib.suppress(TimeoutError):
                    name, event = await asyncio.wait_for(self.events.get(), timeout=1.0)
                    self._print_event(name, event)
                    if event["event"] == "exited":
                        print(f"swarm: {name} exited unexpectedly (code {event['code']}); see {self.workdir / name}.log")
                        return 1
                    if event["event"] == "finished":
                        self.finished[name] = event
                if self.roles and len(self.finished) == self.num_peers:
                    self._print_finish()
                    return 0
                table, count = await self._table(client, ready["http"])
                if table and table != last_table:
                    print(table, flush=True)
                    last_table = table
                if count == self.num_peers + 1 and not all_seen:
                    all_seen = True
                    print(f"swarm: all {count} peers see each other after {time.monotonic() - started:.1f}s", flush=True)
        finally:
            await client.aclose()
        return 0 if all_seen or stop.is_set() else 1

    async def _table(self, client: HttpClient, http_addr: str) -> tuple[str, int]:
        try:
            status = await client.get_json(f"http://{http_addr}/status")
        except TransportError:
            return "", 0
        rows = status.get("live_peers", [])
        for row in rows:
            row["last_seen_s"] = "-"  # keeps the table stable between refreshes
        return f"live peers of {status.get('run_id')}:\n{format_table(rows)}", len(rows)

    def _print_finish(self) -> None:
        name, event = sorted(self.finished.items())[0]
        print(f"swarm: all {len(self.finished)} learners finished; checkpoint of {name}: {event['checkpoint']}")
        print(f"swarm: sample from {name}'s model (prompt 'The '):\n{event['sample']!r}", flush=True)

    @staticmethod
    def _print_event(name: str, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "round":
            print(f"[{name}] round {event['round']}: train loss {event['train_loss']:.3f}  held-out {event['heldout_loss']:.3f}"
                  f"  params from {event['params_from']}  pseudo-gradients used {event['pgrads_used']}"
                  f"  sent {event['bytes_sent'] / 1e6:.1f} MB{'  timed out ' + str(len(event['timed_out'])) if event['timed_out'] else ''}"
                  f"{'  ' + event['note'] if event.get('note') else ''}", flush=True)
        elif kind == "finished":
            print(f"[{name}] finished at round {event['round']}, held-out loss {event['heldout_loss']:.3f}", flush=True)
        elif kind == "ready":
            print(f"[{name}] ready: peer {event['peer_id'][:12]} http {event['http']} roles {event.get('roles')}", flush=True)
        elif kind == "peers":
            print(f"[{name}] sees {event['count']} peer(s)", flush=True)
        elif kind == "waiting":
            print(f"[{name}] waiting for learners before round 0: {event['learners']} of {event['wanted']} live", flush=True)
        elif kind == "ahead":
            print(f"[{name}] at round {event['round']}, ahead of the learners' median {event['median']}: "
                  f"waiting up to {event['wait_s']:.0f} s for them", flush=True)
        elif kind == "adopted":
            print(f"[{name}] {event['why']}: now at round {event['round']} ({event['donors']} donor(s))", flush=True)
        elif kind not in ("exited", "stopped"):
            print(f"[{name}] {json.dumps(event)}", flush=True)

    async def aclose(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        codes = await _wait_all(self.procs, STOP_TIMEOUT_S)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        clean = all(code == 0 for code in codes.values())
        print(f"swarm: stopped {len(codes)} process(es){' cleanly' if clean else ': ' + json.dumps(codes)}", flush=True)


async def _wait_all(procs: dict[str, asyncio.subprocess.Process], timeout_s: float) -> dict[str, int | None]:
    async def wait_one(proc: asyncio.subprocess.Process) -> int:
        try:
            return await asyncio.wait_for(proc.wait(), timeout=timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            return await proc.wait()

    codes = await asyncio.gather(*(wait_one(p) for p in procs.values()))
    return dict(zip(procs, codes, strict=True))


def run_swarm(options: SwarmOptions) -> int:
    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await Swarm(options).run(stop)

    return asyncio.run(main())
