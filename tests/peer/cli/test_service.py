"""A daemon process after its clean shutdown: the event loop (and its signal handlers) is closed,
the interpreter is unloading. A SIGTERM then (``gossamer swarm`` stopping a peer that is exiting
by itself) must end it with its own exit code, not kill it (-15). A shutdown that overruns its bound names what
each task still awaits."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

from gossamer.peer.cli.service import awaiting

CHILD = """
import asyncio, sys, time
from gossamer.peer.cli import service

async def serve():
    service._install_signal_handlers(asyncio.Event())
    return 3

code = asyncio.run(serve())
service._exit_on_late_signal(code)
print("shut down", flush=True)
time.sleep(60)  # the interpreter's teardown, made long: the signal lands in it
"""


def test_a_sigterm_after_the_clean_shutdown_exits_with_the_daemons_code() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "shut down\n"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 3
    finally:
        child.kill()
        child.wait()


async def test_a_shutdown_that_overruns_names_what_each_task_still_awaits() -> None:
    """The line ``clean shutdown took longer than ...`` lists each pending task's await chain."""
    stuck = asyncio.Event()

    async def holding_a_lock() -> None:
        await stuck.wait()

    async def role_task() -> None:
        await holding_a_lock()

    task = asyncio.create_task(role_task(), name="role-rounds")
    for _ in range(3):
        await asyncio.sleep(0)
    try:
        line = awaiting(task)
        assert line.startswith("  role-rounds: ")
        assert "role_task" in line and "holding_a_lock" in line and "Event.wait" in line, line
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
