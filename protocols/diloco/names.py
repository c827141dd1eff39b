"""The protocol's name and its role names (spelled here once; the plugin binds them to the roles)."""

PROTOCOL = "diloco"

LEARNER = "learner"  # a full replica trained on this peer's shard, mixed with its peers
