"""The protocol's name, its role name and its TCP method (spelled here once)."""

PROTOCOL = "context"

SHARD = "cp-shard"  # holds one chunk of every training sequence and the whole model; any number per run

METHOD = "context-ring"  # the TCP method every ring frame names (plan, kv, dkv, share, update, abort)
