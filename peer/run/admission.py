"""Run admission: which peers' records everyone accepts.

``open`` admits every correctly signed record. ``allowlist`` admits the owner, the public keys
listed in the owner-signed manifest, and peers whose record carries an owner-signed join token
that is bound to their key (or to no key), to this run, and not expired.
"""

from __future__ import annotations

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.tokens import verify_join_token
from gossamer.peer.errors import RecordRejected
from gossamer.peer.run.manifest import Manifest
from gossamer.peer.run.records import PeerRecord


class Admission:
    """The admission policy of one run, built from its verified manifest."""

    def __init__(self, manifest: Manifest) -> None:
        self._manifest = manifest
        self._allowed = {bytes.fromhex(key) for key in manifest.config.allow}

    @property
    def policy(self) -> str:
        return self._manifest.config.policy

    def check(self, record: PeerRecord, *, now: float) -> None:
        """Return if ``record``'s peer is admitted; raise RecordRejected with the reason otherwise."""
        key = record.public_key
        if self.policy == "open" or key == self._manifest.owner_public_key or key in self._allowed:
            return
        if not record.join_token:
            raise RecordRejected(f"peer {record.peer_id[:12]} is not on the allowlist and has no join token", reason="policy")
        try:
            verify_join_token(record.join_token, owner_public_key=self._manifest.owner_public_key,
                              run_id=self._manifest.run_id, now=now, peer_public_key=key)
        except VerificationError as exc:
            raise RecordRejected(f"peer {record.peer_id[:12]} has an invalid or expired join token", reason="policy") from exc
