"""A daemon process after its clean shutdown: the event loop (and its signal handlers) is closed,
the interpreter is unloading. A SIGTERM then (``gossamer swarm`` stopping a peer that is exiting
by itself) must end it with its own exit code, not kill it (-15)."""

from __future__ import annotations

import signal
import subprocess
import sys

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
