"""Routes: one request forwarded host to host over TCP, each host applying its units (BlockTrain's
blocks, the AR baseline's stages) and sending the result straight on.

- ``wire``     route frames: the hops, the answer, failed hops.
- ``host``     what every host of a route does with a frame, whatever it computes.
- ``pool``     pooled TCP connections to next hops, with shrinking budgets.
- ``policy``   which next hops a host forwards to (live peers announcing the units).
- ``client``   the client side: a route through the live hosts, retried around failed ones.
"""
