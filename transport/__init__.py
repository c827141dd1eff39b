"""gossamer's data plane: bytes, frames, peers and addresses (never models or rounds).

Map of the package:

- ``errors``    the exception tree below; every foreign error (OSError, asyncio.TimeoutError,
                aiohttp, msgpack) is translated into it once, here, at the transport boundary.
- ``limits``    ``Limits``: hard caps on every length, count, depth and size a peer can claim.
- ``header``    msgpack headers, decoded exactly and within every cap.
- ``codec``     tensor codec: a msgpack header per tensor (name, dtype from an allowlist, shape,
                byte length, optional fp16/bf16/int8 quantisation) and raw little-endian bytes,
                decoded zero-copy.
- ``frames``    the TCP frame: magic, version, type, header length, payload length, msgpack
                header, payload.
- ``safetensors_stream``  streamed safetensors bodies (HTTP objects, checkpoints) with strict,
                capped parsing.
- ``tcp``       asyncio TCP server and client exchanging frames (request/response, one-way);
                re-exports ``tcp_stream`` (config, stats, zero-copy frame I/O on raw sockets),
                ``tcp_server`` and ``tcp_client``.
- ``slots``     what one connecting peer can hold on a server: connection slots per address
                (``AddressSlots``, ``address_key``) and bytes of bodies / payloads in flight
                (``ByteBudget``), shared by the TCP and HTTP servers.
- ``logs``      ``ThrottledLog``: the servers log what peers can trigger (bad frames, cut
                bodies, failing handlers) at most ``burst`` lines per window.
- ``http``      shared HTTP pieces (``HttpConfig``, capped body and JSON reading);
                ``http_server`` (aiohttp server with body caps, header/idle deadlines against
                slowloris, connection cap, tensor helpers) and ``http_client``.
- ``wan``       a WAN-emulating TCP proxy: latency, jitter, bandwidth cap, drops, resets,
                1-byte slicing, and an access link shared by a peer's proxies
                (``wan_link`` holds the per-link profile, ``AccessLink`` and pacing).
- ``relay``     a relayed data plane for private peers (TURN-style): ``RelayServer`` on a public
                peer, ``RelayClient`` on the private one (a subpackage: ``wire``, ``server``,
                ``client``).
- ``dht``       membership over a hivemind DHTNode: signed entries under ``gossamer/`` keys,
                validated by every node (a subpackage: ``membership``, ``config``, ``startup``,
                ``entries``, ``validation``, ``records``).

Exceptions::

    TransportError
     ├── DecodeError           bytes from a peer that do not parse (bad magic, dtype, shape, ...)
     │    ├── LimitExceeded    a claimed length / count / depth / size over a cap
     │    ├── NonFiniteTensor  NaN or Inf where the caller asked for finite values
     │    └── EntryRefused     (dht.entries) a DHT value that is not a valid signed entry there
     ├── ConnectionClosed      the peer closed or reset the connection (also mid-frame)
     │    └── ConnectFailed    (tcp_client) no connection could be opened to the address
     ├── TransportTimeout      a deadline passed (connect, read, request)
     ├── Overloaded            a connection cap or bounded queue is full
     ├── RemoteError           the peer answered with an error frame or HTTP error status
     ├── RelayRefused          (relay.server) a relay refused an allocation (not authorized, full)
     ├── BootstrapFailed       (dht.startup) no initial peer answered; the message says what to check
     └── DhtStartFailed        (dht.startup) the DHT node (p2pd) could not start; the message says why

Two signals that never reach a caller: ``HandlerError`` (tcp_server), raised by a request
handler to refuse a request (the peer gets its message as an error frame), and
``InjectedReset`` (wan_link), the WAN emulator's own way to reset a link on purpose.
"""
