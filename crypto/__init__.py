"""Keys, signatures, secret sharing and encrypted channels. The only package that imports
``cryptography``.

Primitives below, recipes above; the rest of gossamer uses the recipes:

- ``errors``     the exception tree below.
- ``identity``   Ed25519 identity in a 0600 file; peer id = hex SHA-256 fingerprint of the raw
                 public key.
- ``signed``     canonical encoding and signed objects (records, manifests) under their own
                 signing domain.
- ``tokens``     owner-signed join tokens for allowlist runs (bound to a key, or not; expiring).
- ``envelope``   signed envelopes (sender, recipient, run id, round, timestamp, nonce, payload
                 digest) and the replay guard that checks them.
- ``channel``    ChaCha20-Poly1305 per-frame channel encryption with implicit counters.
- ``challenge``  proof of holding a key now: a signed answer to a service's fresh nonce, bound
                 to the service's name and the time (a relay's allocations).
- ``handshake``  the authenticated X25519 + HKDF key agreement that opens a channel: both
                 ephemerals, both identities and both sides' fresh nonces signed into one
                 transcript, with key confirmation both ways.
- ``sharing``    additive secret sharing in Z_2^64 with 16 fractional bits: fixed point, masks
                 from a ChaCha20 keystream, share-wise affine ops and local truncation (TL++).

Time and randomness are parameters (``seal(..., now=..., nonce=...)``), so everything is
testable without sleeping.

Exceptions::

    CryptoError
     ├── IdentityError       an identity file is missing, malformed or readable by others
     ├── SharingError        a value outside the fixed-point range, a bad party, or a product
                             whose truncation could fail with more than the allowed probability
     └── VerificationError   one opaque error for every failed check (bad signature, tampered
                             byte, wrong recipient, replay, stale or future timestamp)
"""
