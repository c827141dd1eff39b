"""Run admission: which peers' records everyone accepts. ``open`` admits every correctly signed
record; ``allowlist`` the owner, the listed keys and holders of an owner-signed join token bound
to their key and this run. A token bound to no key is never accepted from a (public) record."""

from __future__ import annotations

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.tokens import JoinToken, verify_join_token
from gossamer.peer.errors import ConfigError, RecordRejected
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
        if self.admits_key(key):
            return
        if not record.join_token:
            raise RecordRejected(f"peer {record.peer_id[:12]} is not on the allowlist and has no join token", reason="policy")
        try:
            token = self._verify(record.join_token, key, now=now)
        except VerificationError as exc:
            raise RecordRejected(f"peer {record.peer_id[:12]} has an invalid or expired join token", reason="policy") from exc
        if token.peer_public_key is None:
            raise RecordRejected(f"peer {record.peer_id[:12]} published a join token bound to no key (anyone who read "
                                 f"it could use it)", reason="policy")

    def admits_key(self, public_key: bytes) -> bool:
        """True if the policy admits ``public_key`` without a token."""
        return (self.policy == "open" or public_key == self._manifest.owner_public_key
                or public_key in self._allowed)

    def check_own_token(self, token: str, *, public_key: bytes, now: float) -> None:
        """ConfigError unless this daemon (``public_key``) may publish ``token`` and be admitted by it;
        nothing to check when it is admitted without one."""
        if not token or self.admits_key(public_key):
            return
        try:
            parsed = self._verify(token, public_key, now=now)
        except VerificationError as exc:
            raise ConfigError(f"--join_token is not a valid token of run {self._manifest.run_id} for this identity (its "
                              f"owner, run, expiry or key do not match)") from exc
        if parsed.peer_public_key is None:
            raise ConfigError("--join_token is bound to no key: published in this peer's record it would admit "
                              "anyone who read it, so it is not accepted. Ask the run owner for a token bound to your "
                              f"key: gossamer token -c run.toml --peer_public_key {public_key.hex()}")

    def _verify(self, token: str, public_key: bytes, *, now: float) -> JoinToken:
        return verify_join_token(token, owner_public_key=self._manifest.owner_public_key,
                                 run_id=self._manifest.run_id, now=now, peer_public_key=public_key)
