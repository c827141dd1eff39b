"""Routes: requests that travel a chain of TCP hops, host to host, and come back the same way.

A **route** is the list of hops (a host's TCP address and the units it applies, in order) one
request travels: client -> host 1 -> ... -> host n, each host applying its units and forwarding
the result straight to the next, the last one's answer relayed back along the same connections.
A hop that fails is named in the answer so the client can route around it. What a unit is belongs
to the protocol: a BlockTrain block (one **pass** of the block stack is one route request) or a
stage of the matched autoregressive pipeline.

Modules: ``wire`` (the request and answer frames), ``client`` (``route_through``, ``RemoteRoute``,
``RouteFailed``), ``host`` (``RouteHost``, what every host does with a frame), ``pool`` (``HopPool``,
calling the next hop within a shrinking budget), ``policy`` (which next hops a host forwards to).
"""
