"""gossamer's data plane: bytes, frames, peers and addresses (never models or rounds); every foreign
error is translated into the tree below once, at this boundary (README.md here is the spec).

- ``errors``    the exception tree below.
- ``limits``    ``Limits``: hard caps on every length, count, depth and size a peer can claim.
- ``header``    msgpack headers, decoded exactly and within every cap.
- ``codec``     tensor codec: a msgpack header per tensor and raw little-endian bytes, zero-copy.
- ``frames``    the TCP frame: prefix, msgpack header, payload.
- ``safetensors_stream``  streamed safetensors bodies (HTTP objects, checkpoints), strictly parsed.
- ``tcp``       asyncio TCP server and client exchanging frames; re-exports ``tcp_stream`` (whole
                frames over a raw socket), ``tcp_server`` and ``tcp_client``.
- ``slots``     what one connecting peer can hold on a server: connection slots per address,
                bytes in flight; shared by the TCP and HTTP servers.
- ``logs``      ``ThrottledLog``: what peers can trigger is logged at most ``burst`` lines per window.
- ``http``      shared HTTP pieces (``HttpConfig``, capped body and JSON reading); ``http_server``
                and ``http_client``.
- ``relay``     a relayed data plane for private peers (TURN-style; ``wire``, ``splice``,
                ``server``, ``client``).
- ``dht``       membership over a hivemind DHTNode: signed entries under ``gossamer/`` keys.

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

``HandlerError`` (tcp_server) never reaches a caller: a request handler raises it to refuse a
request, and the peer gets its message as an error frame."""
