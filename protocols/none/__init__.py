"""Protocol ``none``: a run for membership only (peers join, publish their records and see each
other; nothing trains). What it is for: ``protocols/none/README.md``."""

from __future__ import annotations

from gossamer.peer.plugin import ProtocolPlugin

PLUGIN = ProtocolPlugin(name="none", summary="membership only: peers join and see each other; nothing trains")
