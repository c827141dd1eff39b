"""``RelayClient``: the private peer's end of a relay allocation. It keeps an outbound control
connection (proving its identity to the relay's challenge) and splices every connection the relay
announces to its own HTTP or TCP server (README.md, "The client (relay.client)")."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections.abc import Callable

from gossamer.crypto.challenge import NONCE_BYTES, answer_challenge
from gossamer.crypto.identity import Identity
from gossamer.transport.errors import ConnectionClosed, TransportError, TransportTimeout
from gossamer.transport.relay.config import RelayRefused
from gossamer.transport.relay.wire import MAX_LINE_BYTES, Pace, Pipe, read_message, write_message
from gossamer.transport.tcp_client import ConnectFailed

log = logging.getLogger(__name__)


class RelayClient:
    """One live allocation on a relay; see the module docstring."""

    def __init__(self, *, relay: tuple[str, int], targets: list[tuple[str, int]], ports: list[int], attach_port: int,
                 control: tuple[asyncio.StreamReader, asyncio.StreamWriter], ping_s: float, max_connections: int,
                 connect_timeout_s: float, zero_copy: bool) -> None:
        self.relay = relay
        self.ports = ports
        self._attach_at = (relay[0], attach_port)
        self._targets = targets
        self._control = control
        self._ping_s = ping_s
        self._connect_timeout_s = connect_timeout_s
        self._zero_copy = zero_copy
        self._slots = asyncio.Semaphore(max_connections)
        self._pace = Pace(0)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def connect(cls, relay: tuple[str, int], *, relay_name: str, identity: Identity, auth: bytes,
                      targets: list[tuple[str, int]], ping_s: float = 20.0, max_connections: int = 32,
                      connect_timeout_s: float = 10.0, now: Callable[[], float] = time.time,
                      zero_copy: bool = True) -> RelayClient:
        """An allocation of ``len(targets)`` ports on the relay called ``relay_name`` at ``relay``,
        proven with ``identity``; RelayRefused, ConnectFailed or TransportTimeout when there is none.
        ``zero_copy``: splice forwarded connections in the kernel where it can (``wire.Pipe``)."""
        control = await _open(relay, connect_timeout_s)
        try:
            nonce = _challenge(await read_message(control[0], timeout_s=connect_timeout_s), relay)
            proof = answer_challenge(identity, nonce=nonce, audience=relay_name, now=now())
            write_message(control[1], {"op": "allocate", "services": len(targets),
                                       "auth": base64.b64encode(auth).decode(),
                                       "proof": base64.b64encode(proof).decode()})
            answer = await read_message(control[0], timeout_s=connect_timeout_s)
            if answer.get("ok") is not True:
                raise RelayRefused(f"relay {relay[0]}:{relay[1]} refused: {str(answer.get('error'))[:200]}")
            ports, attach_port = answer.get("ports"), answer.get("attach_port")
            if not isinstance(ports, list) or len(ports) != len(targets) or \
                    not all(isinstance(p, int) and 0 < p < 65536 for p in [*ports, attach_port]):
                raise RelayRefused(f"relay {relay[0]}:{relay[1]} answered bad ports {ports!r}, {attach_port!r}")
        except BaseException:
            control[1].close()
            raise
        client = cls(relay=relay, targets=targets, ports=ports, attach_port=attach_port, control=control,
                     ping_s=ping_s, max_connections=max_connections, connect_timeout_s=connect_timeout_s,
                     zero_copy=zero_copy)
        client._loop_task = asyncio.create_task(client._run(), name="relay-client")
        return client

    @property
    def bytes_moved(self) -> int:
        return self._pace.moved

    async def aclose(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._control[1].close()
        if not self.closed.done():
            self.closed.set_result(None)

    async def _run(self) -> None:
        reader, writer = self._control
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._ping(writer))
                while True:
                    message = await read_message(reader, timeout_s=3 * self._ping_s)
                    if message.get("op") == "connect":
                        self._serve(message)
        except* TransportError as group:
            log.info("relay %s:%d lost: %s", *self.relay, group.exceptions[0])
        except* OSError as group:
            log.info("relay %s:%d lost: %s", *self.relay, group.exceptions[0])
        finally:
            writer.close()
            if not self.closed.done():
                self.closed.set_result(None)

    async def _ping(self, writer: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(self._ping_s)
            write_message(writer, {"op": "ping"})
            try:
                async with asyncio.timeout(self._ping_s):
                    await writer.drain()
            except TimeoutError:
                raise TransportTimeout("the relay does not take our pings") from None
            except (OSError, ConnectionError) as exc:
                raise ConnectionClosed(f"relay control connection failed: {exc}") from exc

    def _serve(self, message: dict) -> None:
        service, connection_id = message.get("service"), message.get("id")
        if not isinstance(service, int) or not 0 <= service < len(self._targets) or not isinstance(connection_id, str):
            return
        if self._slots.locked():
            return  # at the cap: the relay closes the connection when we do not attach in time
        task = asyncio.create_task(self._forward(self._targets[service], connection_id[:64]), name="relay-forward")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forward(self, target: tuple[str, int], connection_id: str) -> None:
        async with self._slots:
            outside = inside = None
            try:
                outside = await self._pipe_to(self._attach_at)
                assert outside.transport is not None
                outside.transport.write(json.dumps({"op": "attach", "id": connection_id}).encode() + b"\n")
                inside = await self._pipe_to(target)
                outside.pair(inside)
                await asyncio.gather(outside.done, inside.done)
            except TransportError as exc:
                log.debug("relayed connection to %s:%d failed: %s", *target, exc)
            finally:
                for pipe in (outside, inside):
                    if pipe is not None:
                        pipe.close()

    async def _pipe_to(self, address: tuple[str, int]) -> Pipe:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _transport, pipe = await loop.create_connection(lambda: Pipe(pace=self._pace, zero_copy=self._zero_copy),
                                                                  *address)
        except TimeoutError:
            raise TransportTimeout(f"connect to {address[0]}:{address[1]} timed out") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {address[0]}:{address[1]}: {exc}") from exc
        return pipe


def _challenge(message: dict, relay: tuple[str, int]) -> bytes:
    """The nonce of the relay's challenge; RelayRefused for anything else."""
    try:
        nonce = base64.b64decode(str(message.get("nonce", "")), validate=True)
    except (binascii.Error, ValueError):
        nonce = b""
    if message.get("op") != "challenge" or len(nonce) != NONCE_BYTES:
        raise RelayRefused(f"relay {relay[0]}:{relay[1]} sent no challenge: {str(message)[:200]}")
    return nonce


async def _open(address: tuple[str, int], timeout_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.open_connection(*address, limit=2 * MAX_LINE_BYTES)
    except TimeoutError:
        raise TransportTimeout(f"connect to relay {address[0]}:{address[1]} timed out") from None
    except OSError as exc:
        raise ConnectFailed(f"cannot connect to {address[0]}:{address[1]}: {exc}") from exc
