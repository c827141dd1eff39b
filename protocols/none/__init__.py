"""Protocol ``none``: a run for membership only. Peers join, publish their records and see each
other (``gossamer status``); nothing trains. Useful to check a network before a real run."""

from __future__ import annotations

from gossamer.peer.plugin import ProtocolPlugin

PLUGIN = ProtocolPlugin(name="none", summary="membership only: peers join and see each other; nothing trains")
