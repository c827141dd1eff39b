"""Routes: requests that travel a chain of TCP hops, host to host, and come back the same way; a hop
that fails is named in the answer so the client can route around it (README.md of peer, "Routes").

- ``wire``    the request and answer frames.
- ``client``  ``route_through``, ``RemoteRoute``, ``RouteFailed``: routing and retrying.
- ``host``    ``RouteHost``: what every host does with a frame.
- ``pool``    ``HopPool``: calling the next hop within a shrinking budget.
- ``policy``  which next hops a host forwards to."""
