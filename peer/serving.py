"""What a peer serves and announces, whoever runs it (the daemon, or the test harness's ``LocalNet``):
its roles' HTTP routes and TCP methods (and the gate their frames pass before a payload byte is
read), the state it donates to joiners, and its signed record.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from gossamer import __version__
from gossamer.crypto.identity import Identity
from gossamer.peer.config import PeerConfig
from gossamer.peer.kit.state_donor import StateDonor
from gossamer.peer.role import Role
from gossamer.peer.run.records import UNKNOWN, PeerRecord
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import ConnectionInfo, FrameGate, HandlerError

TcpDispatch = Callable[[Frame, ConnectionInfo], Awaitable[Frame | None]]
MAX_REQUEST_BYTES = 1 << 20  # bodies larger than this are streamed by the routes that take them
DEFAULT_TCP_PAYLOAD_BYTES = 1 << 20
"""The largest payload a TCP method takes unless its role declares a gate (``Role.tcp_gates``)."""


def state_donor(roles: Sequence[Role]) -> StateDonor | None:
    """A donor for the first role that holds a replicated model (joiners download it); None if none does."""
    stateful = [role for role in roles if role.model_state() is not None]
    return StateDonor(stateful[0].model_state) if stateful else None


def role_app(roles: Sequence[Role], donor: StateDonor | None, *, extra: Sequence[web.RouteDef] = (),
             middlewares: Sequence[Any] = ()) -> web.Application:
    """The HTTP application of a peer: ``extra`` routes, every role's routes, the donor's."""
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=list(middlewares))
    app.add_routes(list(extra))
    for role in roles:
        app.add_routes(role.routes())
    if donor is not None:
        app.add_routes(donor.routes())
    return app


def role_dispatcher(roles: Sequence[Role], extra: Mapping[str, Callable[[Frame, ConnectionInfo], Awaitable[Frame | None]]] | None = None
                    ) -> TcpDispatch:
    """TCP requests to the role method their header names (or one of ``extra``, the daemon's own
    payload-free methods); HandlerError for an unknown method."""
    methods = {**(extra or {}), **{name: method for role in roles for name, method in role.tcp_methods().items()}}

    async def dispatch(frame: Frame, info: ConnectionInfo) -> Frame | None:
        method = methods.get(str(frame.header.get("method", "")))
        if method is None:
            raise HandlerError(f"unknown method {frame.header.get('method')!r}")
        return await method(frame, info)

    return dispatch


def role_gate(roles: Sequence[Role]) -> FrameGate:
    """The TCP server's gate: before a request's payload is read, its method must be one of the
    roles' (an unknown method is answered by the dispatcher only when it carries no payload) and
    pass that method's gate, or the default cap."""
    methods = {name for role in roles for name in role.tcp_methods()}
    gates = {name: gate for role in roles for name, gate in role.tcp_gates().items()}

    def gate(frame_type: FrameType, header: dict[str, Any], payload_len: int) -> None:
        if frame_type not in (FrameType.REQUEST, FrameType.ONEWAY):
            return  # the server refuses those itself
        name = header.get("method")
        if not isinstance(name, str) or name not in methods:
            if payload_len:
                raise HandlerError(f"unknown method {str(name)[:80]!r}")
            return
        check = gates.get(name)
        if check is not None:
            check(header, payload_len)
        elif payload_len > DEFAULT_TCP_PAYLOAD_BYTES:
            raise HandlerError(f"{name}: payload of {payload_len} bytes exceeds the cap of {DEFAULT_TCP_PAYLOAD_BYTES}")

    return gate


async def donated_state(donor: StateDonor | None) -> dict[str, Any]:
    """What a record says about the state this peer donates: its version and index digest."""
    if donor is None:
        return {}
    version, digest = await donor.published()
    return {"version": version, "digest": digest}


def peer_record(*, identity: Identity, config: PeerConfig, roles: Sequence[Role], http_addr: str, tcp_addr: str,
                now: float, capacity: dict[str, Any], state: dict[str, Any] | None = None,
                tenured: tuple[str, ...] = (), reachability: str = UNKNOWN, relay: str = "") -> PeerRecord:
    """This peer's record: its addresses, roles, round, assignment and donated state, as of ``now``
    (and, from the run owner, the peers it vouches for: ``run.tenure``)."""
    return PeerRecord(
        peer_id=identity.peer_id, public_key=identity.public_key, name=config.public_name,
        http_addr=http_addr, tcp_addr=tcp_addr, roles=tuple(dict.fromkeys(config.roles)), version=__version__,
        round=max((role.round for role in roles), default=0), timestamp=now, capacity=dict(capacity),
        assignment={k: v for role in roles for k, v in role.status().get("assignment", {}).items()},
        join_token=config.join_token, state=state or {}, tenured=tenured, reachability=reachability, relay=relay,
        run_round=max((role.run_round for role in roles), default=0),
    )
