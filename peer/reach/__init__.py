"""Reachability: whether others can dial this peer, and what it does when they cannot.

- ``dialback``  the answering side of the self-test: dial a requester back at its own addresses.
- ``selftest``  the asking side: ask vetted answerers, and say what to forward when private.
- ``verdict``   what the answers mean: one reached is public, a quorum of not-reached private (no I/O).
- ``relaying``  volunteering a relay (``--relay``) and keeping one while private, with fallback.
- ``service``   ``Reach``: the dial-back service and the self-test loop one daemon holds."""
