"""Running a daemon as a process: SIGINT/SIGTERM start a clean shutdown (checkpoints, record
withdrawn, ``p2pd`` gone), a second one forces the exit; the process ends by itself with code 1
when a role failed and 0 when every role finished, and serves on when only serving roles are left."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import faulthandler
import io
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

from gossamer.peer.config import PeerConfig
from gossamer.peer.daemon import Daemon
from gossamer.peer.plugin import PluginRegistry
from gossamer.peer.processes import child_pids
from gossamer.peer.run.manifest import RunConfig

log = logging.getLogger(__name__)
SHUTDOWN_TIMEOUT_S = 20.0
SUPERVISE_S = 1.0  # how often the roles' state is looked at


def run_daemon(config: PeerConfig, *, plugins: PluginRegistry, run_config: RunConfig | None = None,
               role_options: Mapping[str, Mapping[str, Any]] | None = None) -> int:
    """Run one daemon until SIGINT/SIGTERM; returns the process exit code. ``role_options``: extra
    keyword arguments for named roles (``gossamer serve`` passes its ``--blocks`` this way)."""
    logging.getLogger().setLevel(config.log_level.upper())
    _stacks_on_sigusr1()
    code = asyncio.run(_serve(config, plugins, run_config, role_options))
    _exit_on_late_signal(code)
    return code


def _stacks_on_sigusr1() -> None:
    """``kill -USR1 PID`` writes every thread's stack to stderr (the log): a stuck daemon says where.
    Not where stderr has no file descriptor (the CLI run in-process under a test's capture)."""
    if hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(io.UnsupportedOperation, ValueError, AttributeError):
            faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)


def _exit_on_late_signal(code: int) -> None:
    """The clean shutdown is done (checkpoints written, p2pd gone) and the event loop, with its
    signal handlers, is closed; what is left is the interpreter unloading torch and hivemind
    (seconds on a busy host, when ``gossamer swarm`` stops the peers that are already exiting by
    themselves). A SIGINT/SIGTERM then ends the process at once with its own exit code instead
    of killing it (-15); from the interpreter's own teardown on (atexit, which runs this module's
    hook first, then the C-level cleanup that resets Python's handlers) it is ignored."""

    def exit_now(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)

    def ignore() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, exit_now)
    atexit.register(ignore)


async def _serve(config: PeerConfig, plugins: PluginRegistry, run_config: RunConfig | None,
                 role_options: Mapping[str, Mapping[str, Any]] | None) -> int:
    stop = asyncio.Event()
    _install_signal_handlers(stop)
    creating = asyncio.create_task(Daemon.create(config, plugins=plugins, run_config=run_config,
                                                 role_options=role_options))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({creating, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not creating.done():  # a requested stop during start-up (a role still joining): nothing to keep yet
        creating.cancel()
        await asyncio.gather(creating, return_exceptions=True)
        log.info("stopped during start-up")
        return 0
    stopping.cancel()
    daemon = creating.result()  # re-raises a start-up error for the CLI to print
    _announce(daemon)
    code = await supervise(daemon, stop)
    log.info("shutting down (press Ctrl+C again to force)")
    closing = asyncio.create_task(daemon.aclose(checkpoint=True), name="shutdown")
    done, _ = await asyncio.wait({closing}, timeout=SHUTDOWN_TIMEOUT_S)
    if not done:
        log.error("clean shutdown took longer than %.0fs; forcing exit. Still waiting:\n%s", SHUTDOWN_TIMEOUT_S,
                  "\n".join(awaiting(task) for task in asyncio.all_tasks() if task is not asyncio.current_task()))
        force_exit(1)
    closing.result()
    for role, path in daemon.checkpoints.items():
        print(f"{role}: checkpoint written to {path} (started again with the same --identity_path and "
              f"--checkpoint_dir, it resumes from there)", file=sys.stderr, flush=True)
    daemon.events.emit("stopped", peer_id=daemon.identity.peer_id, code=code, checkpoints=daemon.checkpoints)
    daemon.events.close()
    return code


def awaiting(task: asyncio.Task) -> str:
    """One line for a task that has not finished: its name and what it awaits, outermost first."""
    chain, coro = [], task.get_coro()
    while coro is not None and len(chain) < 12:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            chain.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return f"  {task.get_name()}: {' -> '.join(chain) or repr(task)}"


async def supervise(daemon: Daemon, stop: asyncio.Event) -> int:
    """Wait for Ctrl+C/SIGTERM (0), a failed role (1) or every role finished (0)."""
    said_idle = False
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SUPERVISE_S):
                await stop.wait()
        state = daemon.state()
        details = "; ".join(f"{name}: {h['detail']}" for name, h in state["roles"].items() if h["detail"])
        if state["state"] == "failed":
            failed = [name for name, h in state["roles"].items() if h["state"] == "failed"]
            print(f"error: role {', '.join(failed)} failed: {details}", file=sys.stderr, flush=True)
            return 1
        if state["state"] == "finished":
            print(f"the run is finished for this peer ({details}); exiting", file=sys.stderr, flush=True)
            return 0
        if state["state"] == "idle" and not said_idle:
            said_idle = True
            serving = [name for name, h in state["roles"].items() if h["state"] == "serving"]
            print(f"the run is finished ({details}); still serving as {', '.join(serving)} until Ctrl+C",
                  file=sys.stderr, flush=True)
    return 0


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            force_exit(130)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)


def _announce(daemon: Daemon) -> None:
    status = daemon.status()
    maddrs = status["addresses"]["dht"]
    print(f"gossamer peer {daemon.identity.peer_id[:16]} is up in run {daemon.manifest.run_id}\n"
          f"  http {status['addresses']['http']}  tcp {status['addresses']['tcp']}  roles {','.join(status['roles']) or '-'}\n"
          f"  to join this network, pass:\n    --run {daemon.manifest.run_id} --initial_peers {' '.join(maddrs)}",
          file=sys.stderr, flush=True)
    daemon.events.emit("ready", wall_time=time.time(), peer_id=daemon.identity.peer_id,
         run_id=daemon.manifest.run_id, maddrs=maddrs,
         http=status["addresses"]["http"], tcp=status["addresses"]["tcp"], roles=status["roles"],
         listening=status["listening"])


def force_exit(code: int) -> None:
    """Kill our children (so no p2pd is left behind) and exit at once."""
    for pid in child_pids(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(code)
