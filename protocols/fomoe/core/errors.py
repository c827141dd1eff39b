"""FoMoE's own errors (drawn in ``protocols.core.errors``' tree)."""

from __future__ import annotations

from gossamer.protocols.core.errors import ProtocolError


class ExpertMessageRefused(ProtocolError):
    """A FoMoE message (an update, a commit, an expert's state) does not fit the run's model or
    placement; the message says why."""
