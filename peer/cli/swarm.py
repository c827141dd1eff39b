"""``gossamer swarm``: an orchestrator and N peers as separate processes on loopback, their events
streamed as human lines and the live peer table printed as it changes; Ctrl+C or ``--duration_s``
stops them all (SIGTERM, then SIGKILL), and a swarm whose peers would do none of the protocol's
work is refused before anything starts (README.md of peer, "cli.swarm")."""

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

from gossamer.peer.cli.presets import presets
from gossamer.peer.cli.status import format_table
from gossamer.peer.errors import ConfigError, StartupError
from gossamer.peer.plugin import PluginRegistry, ProtocolPlugin
from gossamer.peer.progress import Progress
from gossamer.peer.run.manifest import run_config_from_dict
from gossamer.transport.errors import TransportError
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 25.0
MAX_LINE = 160  # an event without a human line is shown as its first fields, cut here


@dataclass(frozen=True, kw_only=True)
class SwarmOptions:
    config: Path | None = None
    preset: str | None = None
    peers: int | None = None
    duration_s: float | None = None
    workdir: Path | None = None


def load_swarm_config(options: SwarmOptions) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The run config text, the parsed document and its ``[swarm]`` table, from a file or a preset."""
    if options.preset is not None:
        preset = resources.files("gossamer.peer.cli.presets") / f"{options.preset}.toml"
        if not preset.is_file():
            raise ConfigError(f"no built-in preset {options.preset!r}; the presets are: {', '.join(presets())}")
        text = preset.read_text(encoding="utf-8")
    else:
        try:
            text = Path(options.config).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read {options.config}: {exc.strerror}") from exc
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"run config is not valid TOML: {exc}") from exc
    swarm = doc.get("swarm", {})
    if not isinstance(swarm, dict):
        raise ConfigError("[swarm] must be a table")
    return text, doc, swarm


class Swarm:
    """The processes of one local swarm and the tasks that stream their output."""

    def __init__(self, options: SwarmOptions, plugins: PluginRegistry) -> None:
        self.text, doc, table = load_swarm_config(options)
        run_config = run_config_from_dict(doc, source=str(options.config or f"preset {options.preset}"))
        self.plugin: ProtocolPlugin = plugins.plugin(run_config.protocol)
        self.num_peers = options.peers if options.peers is not None else int(table.get("peers", 3))
        self.duration_s = options.duration_s if options.duration_s is not None else table.get("duration_s")
        self.roles = [str(r) for r in table.get("roles", self.plugin.swarm_roles)]
        self.threads = int(table.get("threads", 1))
        self.finished: dict[str, dict[str, Any]] = {}
        if self.num_peers < 0:
            raise ConfigError("--peers must be >= 0")
        plugins.check_roles(run_config.protocol, self.roles, run=run_config.name)
        self.plugin.read_settings(run_config)  # a bad setting ends here, before any process starts
        self._refuse_idle()
        self.plugin.swarm_check(run_config, self.num_peers, self.roles)
        self.progress = Progress(self.plugin)
        self.workdir = options.workdir or Path(tempfile.mkdtemp(prefix="gossamer-swarm-"))
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(maxsize=1024)
        self._tasks: list[asyncio.Task[None]] = []

    def _refuse_idle(self) -> None:
        """A swarm whose peers take none of the roles that do the protocol's work would start, print
        a table and do nothing: refuse it, saying why."""
        workers = self.plugin.swarm_roles
        if not workers:
            return  # a protocol without work roles (membership only): the peers are the point
        if self.num_peers == 0:
            raise ConfigError(f"--peers 0: a {self.plugin.name} swarm needs peers with role {' or '.join(workers)}, "
                              "or nothing would train")
        if not set(self.roles) & set(workers):
            raise ConfigError(f"the swarm's peers would take roles {self.roles or '(none)'} and none of "
                              f"{', '.join(workers)}, so nothing would train; drop the [swarm] roles line or add "
                              f"{workers[0]} to it")

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
            async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                name, event = await self.events.get()
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
        started, last_table, all_seen = time.monotonic(), None, False
        try:
            while not stop.is_set():
                if self.duration_s is not None and time.monotonic() - started >= float(self.duration_s):
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        name, event = await self.events.get()
                    self._print_event(name, event)
                    if event["event"] == "exited" and (event["code"] != 0 or name == "orchestrator"):
                        print(f"swarm: {name} exited unexpectedly (code {event['code']}); see {self.workdir / name}.log")
                        return 1
                    if event["event"] == "exited":
                        print(f"[{name}] finished its part of the run and exited", flush=True)
                    if self._finishes(name, event):
                        self.finished[name] = event
                if self._done():
                    self._print_finish()
                    return 0
                table, key, count = await self._table(client, ready["http"])
                if table and count and key != last_table:
                    print(table, flush=True)
                    last_table = key
                if count == self.num_peers + 1 and not all_seen:
                    all_seen = True
                    print(f"swarm: all {count} peers see each other after {time.monotonic() - started:.1f}s", flush=True)
        finally:
            await client.aclose()
        return 0 if all_seen or stop.is_set() else 1

    async def _table(self, client: HttpClient, http_addr: str) -> tuple[str, Any, int]:
        """The live peer table, what it is printed again for (its peers, names and roles), its size."""
        try:
            status = await client.get_json(f"http://{http_addr}/status")
        except TransportError:
            return "", None, 0
        rows = status.get("live_peers", [])
        key = sorted((row["peer_id"], row.get("name"), tuple(row.get("roles", []))) for row in rows)
        return f"live peers of {status.get('run_id')}:\n{format_table(rows)}", key, len(rows)

    def _finishes(self, name: str, event: dict[str, Any]) -> bool:
        """Whether ``event`` is the protocol's end-of-run event from a process that counts for it."""
        rule = self.plugin.finish
        if rule is None or event.get("event") != f"{self.plugin.name}.{rule.event}":
            return False
        return (name == "orchestrator") == (rule.by == "owner")

    def _done(self) -> bool:
        rule = self.plugin.finish
        if rule is None:
            return False
        return len(self.finished) >= (1 if rule.by == "owner" else max(1, self.num_peers))

    def _print_finish(self) -> None:
        name, event = sorted(self.finished.items())[0]
        who = "the orchestrator" if self.plugin.finish and self.plugin.finish.by == "owner" \
            else f"all {len(self.finished)} peers"
        print(f"swarm: the run is finished ({who}); see {self.workdir}", flush=True)
        if "checkpoint" in event:
            print(f"swarm: checkpoint of {name}: {event['checkpoint']}", flush=True)
        if event.get("sample") is not None:
            print(f"swarm: sample from {name}'s model (prompt {event.get('prompt', 'The ')!r}):\n"
                  f"{event['sample']!r}", flush=True)

    def _print_event(self, name: str, event: dict[str, Any]) -> None:
        kind = str(event.get("event"))
        line = self.progress.line(kind, event, source=name)
        if line is not None:
            print(f"[{name}] {line}", flush=True)
        elif kind.startswith(f"{self.plugin.name}."):
            print(f"[{name}] {_short(event)}", flush=True)
        elif kind == "ready":
            print(f"[{name}] ready: peer {event['peer_id'][:12]} http {event['http']} roles {event.get('roles')}", flush=True)
        elif kind == "peers":
            print(f"[{name}] sees {event['count']} peer(s)", flush=True)
        elif kind not in ("exited", "stopped"):
            print(f"[{name}] {_short(event)}", flush=True)

    async def aclose(self) -> None:
        # peers that finished their part exit by themselves: a SIGTERM in their last moments (after
        # their own clean shutdown) would only turn their exit code into -15
        finishing = {name: proc for name, proc in self.procs.items()
                     if name in self.finished and name != "orchestrator" and proc.returncode is None}
        await _wait_all(finishing, STOP_TIMEOUT_S)
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


def _short(event: dict[str, Any]) -> str:
    """An event without a human line, on one line: its name and its first fields, cut short."""
    fields = " ".join(f"{key}={json.dumps(value, default=str)}" for key, value in event.items() if key != "event")
    text = f"{event.get('event')} {fields}"
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"


async def _wait_all(procs: dict[str, asyncio.subprocess.Process], timeout_s: float) -> dict[str, int | None]:
    async def wait_one(proc: asyncio.subprocess.Process) -> int:
        try:
            async with asyncio.timeout(timeout_s):
                return await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            return await proc.wait()

    codes = await asyncio.gather(*(wait_one(p) for p in procs.values()))
    return dict(zip(procs, codes, strict=True))


def run_swarm(options: SwarmOptions, *, plugins: PluginRegistry) -> int:
    swarm = Swarm(options, plugins)  # refuses a config that cannot work before anything starts

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await swarm.run(stop)

    return asyncio.run(main())
