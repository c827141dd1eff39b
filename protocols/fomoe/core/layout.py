"""Which parameter belongs to the dense part and which to which expert, and their sizes in bytes.

A ``ParamLayout`` is read once from a model (or from a meta-device copy); every other FoMoE
function speaks of expert indices and takes the names and byte counts from it, so nothing else
parses parameter names.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from torch import nn

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.fomoe.core.model import ExpertKey, expert_of


@dataclass(frozen=True)
class ParamLayout:
    """Names and sizes of a FoMoE model's parameters, split into dense and per-expert units."""

    dense: tuple[str, ...]
    """Sorted names of the dense parameters (embeddings, attention, norms, routers)."""
    units: Mapping[ExpertKey, tuple[str, ...]]
    """Sorted parameter names of each (block, expert)."""
    shapes: Mapping[str, tuple[int, ...]]
    """Shape of each parameter."""
    size_bytes: Mapping[str, int]
    """Bytes of each parameter (numel x element size)."""
    n_experts: int

    @classmethod
    def of(cls, model: nn.Module) -> ParamLayout:
        dense: list[str] = []
        units: dict[ExpertKey, list[str]] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        sizes: dict[str, int] = {}
        for name, param in model.named_parameters():
            shapes[name] = tuple(param.shape)
            sizes[name] = param.numel() * param.element_size()
            key = expert_of(name)
            if key is None:
                dense.append(name)
            else:
                units.setdefault(key, []).append(name)
        n_experts = 1 + max((e for _, e in units), default=-1)
        if not units or len(units) != n_experts * len({b for b, _ in units}):
            raise InvalidSetting(f"model: expected every block to hold experts 0..E-1, found units {sorted(units)}")
        return cls(tuple(sorted(dense)), MappingProxyType({k: tuple(sorted(v)) for k, v in sorted(units.items())}),
                   MappingProxyType(shapes), MappingProxyType(sizes), n_experts)

    def units_of(self, experts: Collection[int]) -> list[ExpertKey]:
        """The (block, expert) units of the expert indices ``experts``, in order."""
        return [key for key in self.units if key[1] in experts]

    def names_held(self, experts: Collection[int]) -> frozenset[str]:
        """Names a peer holding ``experts`` trains and sends: the dense ones and those experts'."""
        return frozenset(self.dense).union(*(self.units[key] for key in self.units_of(experts)))

    @property
    def dense_bytes(self) -> int:
        return sum(self.size_bytes[name] for name in self.dense)

    def unit_bytes(self, key: ExpertKey) -> int:
        return sum(self.size_bytes[name] for name in self.units[key])

    def expert_bytes(self, expert: int) -> int:
        """Bytes of expert ``expert`` over all blocks (what a peer holding it holds of it)."""
        return sum(self.unit_bytes(key) for key in self.units_of((expert,)))

    @property
    def n_layers(self) -> int:
        return len({block for block, _ in self.units})

    @property
    def total_bytes(self) -> int:
        return sum(self.size_bytes.values())
