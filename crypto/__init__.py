"""Keys, signatures, secret sharing and encrypted channels; the only package that imports
``cryptography``. Time and randomness are parameters, so everything is testable without sleeping
(README.md here is the spec: every check, message and failure model).

- ``errors``     the exception tree below.
- ``identity``   Ed25519 identity in a 0600 file; peer id = hex SHA-256 of the raw public key.
- ``signed``     canonical encoding and signed objects (records, manifests) under their own domain.
- ``tokens``     owner-signed join tokens for allowlist runs (bound to a key, or not; expiring).
- ``envelope``   signed envelopes of data-plane messages and the replay guard that opens them.
- ``channel``    ChaCha20-Poly1305 per-frame channel encryption with implicit counters.
- ``challenge``  proof of holding a key now: a signed answer to a service's fresh nonce.
- ``handshake``  the authenticated X25519 + HKDF key agreement that opens a channel.
- ``sharing``    additive secret sharing in Z_2^64 with 16 fractional bits (TL++ secure mode).

Exceptions::

    CryptoError
     ├── IdentityError       an identity file is missing, malformed or readable by others
     ├── SharingError        a value outside the fixed-point range, a bad party, or a product
                             whose truncation could fail with more than the allowed probability
     └── VerificationError   one opaque error for every failed check (bad signature, tampered
                             byte, wrong recipient, replay, stale or future timestamp)"""
