"""A context run's manifest settings: defaults, the keys it reads, and what it refuses (keys of
other text runs it has no use for, a ring that could not train), naming the field."""

from __future__ import annotations

import pytest

from gossamer.peer.errors import ConfigError
from gossamer.peer.run.manifest import RunConfig
from gossamer.protocols.context.core import SubspaceConfig
from gossamer.protocols.context.settings import ContextSettings
from gossamer.protocols.registry import PLUGINS


def context_settings(**tables) -> ContextSettings:
    return PLUGINS.plugin("context").read_settings(RunConfig(name="c", protocol="context", **tables))


def test_defaults_and_manifest_values() -> None:
    default = context_settings()
    assert (default.chunk_tokens, default.batch_size, default.min_shards, default.max_shards) == (32, 8, 2, 4)

    settings = context_settings(model={"context": 64, "subspace": {"rank": 2, "mixtures": 4}},
                                data={"source": "/tmp/t.txt", "heldout_fraction": 0.1},
                                hyper={"chunk_tokens": 16, "batch_size": 2, "seed": 3, "steps": 5, "lr": 1})
    assert settings.subspace == SubspaceConfig(rank=2, mixtures=4)
    assert (settings.data_source, settings.heldout_fraction, settings.seed, settings.lr) == ("/tmp/t.txt", 0.1, 3, 1.0)
    assert (settings.chunk_tokens, settings.batch_size, settings.steps, settings.max_shards) == (16, 2, 5, 4)


@pytest.mark.parametrize(("tables", "message"), [
    ({"hyper": {"num_shards": 4}}, r"hyper: unknown keys \['num_shards'\]"),  # every shard trains the same text
    ({"hyper": {"max_norm": 10.0}}, r"hyper: unknown keys \['max_norm'\]"),  # shares are parts of one gradient
    ({"hyper": {"step_timeout_s": 0}}, r"hyper\.step_timeout_s must be > 0"),
    ({"model": {"dropout": 0.1}}, r"model\.dropout must be 0"),
    ({"model": {"subspace": {"rank": 0}}}, r"model\.subspace\.rank must be >= 1, got 0"),
    ({"model": {"subspace": {"rank": 64}}}, r"model\.subspace: rank: 64 exceeds d_head"),
    ({"hyper": {"min_shards": 5}}, r"hyper\.min_shards x hyper\.chunk_tokens = 5 x 32 tokens exceeds model\.context"),
    ({"hyper": {"share_clip": 0.5}}, r"hyper\.share_clip must be 0 \(off\) or at least 1"),
    ({"hyper": {"share_clip": -1}}, r"hyper\.share_clip must be >= 0"),
])
def test_bad_values_are_refused_naming_the_field(tables: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        context_settings(**tables)
