"""A relay in a process of its own, for the tests that take it past its descriptor limit (argv[1]:
that limit): prints ``ready`` (its ports) as a JSON line; SIGUSR1 takes every free descriptor
(``filled``), SIGUSR2 gives them back (``released``), SIGTERM ends it. Admits ``peer:<peer id>``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import signal
import sys

from gossamer.transport.relay import RelayRefused, RelayServer


def authorize(auth: bytes) -> str:
    if not auth.startswith(b"peer:"):
        raise RelayRefused("not a peer of this run")
    return auth[5:].decode()


def say(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def main() -> None:
    relay = await RelayServer.create(name="relay", authorize=authorize)
    loop, stop, taken = asyncio.get_running_loop(), asyncio.Event(), []

    def fill() -> None:
        while True:
            try:
                taken.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        say("filled", count=len(taken))

    def release() -> None:
        while taken:
            os.close(taken.pop())
        say("released")

    loop.add_signal_handler(signal.SIGUSR1, fill)
    loop.add_signal_handler(signal.SIGUSR2, release)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    say("ready", port=relay.address[1], attach_port=relay.attach_port)
    await stop.wait()
    release()
    await relay.aclose()


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main())
