"""Reachability: whether others can dial this peer, and what it does when they cannot.

- ``dialback``  the answering side of the self-test: dial a requester back at its own announced
                addresses (verified record, source address only, rate-limited).
- ``selftest``  the asking side: classify this peer ``public`` or ``private``; the one line that
                tells a private peer's owner what to forward and pass.
- ``relaying``  volunteering a relay (``--relay``) and keeping one while private, with fallback.
- ``service``   ``Reach``: the dial-back service and the self-test loop one daemon holds.
"""
