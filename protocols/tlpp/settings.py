"""A TL++ run's settings, read from its signed manifest (``run.protocol = "tlpp"``): ``[model]``,
``[data]`` and ``[hyper]`` keys, each field's bounds and help declared with ``setting``, and the
checks that relate several fields (the model against its cut, normalisation, secure mode). The
table of settings is generated into ``protocols/tlpp/README.md``."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from gossamer.peer.errors import ConfigError
from gossamer.protocols.core.settings import check, setting
from gossamer.protocols.tlpp.core import (
    BUILTINS,
    Declaration,
    Normalize,
    TraversalError,
    build_stages,
    builtin_stages,
    check_cut,
    check_secure,
    infer_shapes,
    split_model,
)

MODELS = tuple(BUILTINS)  # the built-in model names (model.name)
MODES = ("base", "secure")
OPTIMIZERS = ("adam", "sgd")
NORMALIZE = ("none", "nodes", "fixed")
PACING = ("fixed", "adaptive")
DEFAULT_MODEL = "digits_cnn"
MAX_STATS_CHANNELS = 256  # normalize = "nodes": per-channel sums must fit in a node's signed record


def is_peer_id(value: object) -> bool:
    """True for a peer id: 64 lowercase hex digits (SHA-256 of a public key)."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def check_secure_admission(settings: TlppSettings, policy: str) -> None:
    """ConfigError for a secure run that admits anyone: with ``admission.policy = "open"`` anyone
    could run data nodes (sybils that make up the k nodes of a sum, or fill the helper's store)."""
    if settings.secure and policy == "open":
        raise ConfigError("hyper.mode = \"secure\" refuses admission.policy = \"open\": anyone could join as data nodes "
                          "and make up the nodes a gradient sum hides one among; use policy = \"allowlist\" with the "
                          "helper's and the data owners' keys in admission.allow (or join tokens)")


@dataclass(frozen=True, kw_only=True)
class TlppSettings:
    """Everything the TL++ roles need from the manifest."""

    model: str = setting("", table="model", key="name",
                         doc=f"a built-in model ({', '.join(MODELS)}); none named and no stages: {DEFAULT_MODEL}")
    stages: tuple[tuple[str, ...], ...] = setting(
        (), table="model", doc='a declared model: a list of stages, each a list of layer specs ("conv 16", "relu")')
    input_shape: tuple[int, ...] = setting((1, 8, 8), table="model",
                                           doc="one sample: [C, H, W] for images, [F] for tabular data")
    num_classes: int = setting(10, table="model", low=2, doc="the classes the model tells apart")
    cut: int = setting(0, table="model", low=0,
                       doc="stages [0, cut) run on the data nodes, the rest on the orchestrator; 0: below the last stage")
    channels: tuple[int, ...] = setting((), table="model", doc="a built-in's conv widths; empty: its defaults")
    hidden: int = setting(0, table="model", low=0, doc="a built-in's hidden width; 0: its default")
    test: str = setting("builtin:digits:test", table="data",
                        doc="the held-out split the orchestrator evaluates on (a source as a node's --data)")
    test_fraction: float = setting(0.2, table="data", above=0.0, below=1.0,
                                   doc="the built-in digits' stratified test split, the same on every host")
    split_seed: int = setting(0, table="data", low=0, doc="the seed of the built-in digits' train/test split")
    num_shards: int = setting(4, table="data", low=1,
                              doc="a node without --data takes shard (peer id mod num_shards) of the digits")
    normalize: str = setting("none", table="data", choices=NORMALIZE,
                             doc='per-channel input normalisation: "nodes" pools the counts and sums the nodes '
                                 'publish at the start; "fixed" takes mean and std from here')
    mean: tuple[float, ...] = setting((), table="data", doc='normalize = "fixed": one mean per channel')
    std: tuple[float, ...] = setting((), table="data", doc='normalize = "fixed": one std (> 0) per channel')
    mode: str = setting("base", table="hyper", choices=MODES,
                        doc='"secure": the cut activations and gradients travel as additive shares to the '
                            "orchestrator and the helper")
    batch_size: int = setting(50, table="hyper", low=1, doc="samples per virtual batch, drawn across the nodes")
    optimizer: str = setting("adam", table="hyper", choices=OPTIMIZERS,
                             doc='the orchestrator\'s optimizer (secure mode refuses "sgd")')
    lr: float = setting(3e-3, table="hyper", above=0.0, doc="learning rate")
    momentum: float = setting(0.0, table="hyper", low=0.0, doc='momentum (optimizer = "sgd")')
    weight_decay: float = setting(0.0, table="hyper", low=0.0, doc="weight decay")
    steps: int = setting(0, table="hyper", low=0, doc="optimizer steps; 0: `epochs` passes over the nodes' data")
    epochs: int = setting(1, table="hyper", low=0, doc="passes over the nodes' data when `steps` is 0")
    seed: int = setting(0, table="hyper", low=0, doc="the model's initial weights and each epoch's shuffle")
    drop_last: bool = setting(False, table="hyper", doc="drop an epoch's short tail batch")
    max_abs: float = setting(48.0, table="hyper", above=0.0,
                             doc="secure: the bound on |cut activation| a node enforces before sharing")
    max_failure: float = setting(2e-4, table="hyper", above=0.0, high=1.0,
                                 doc="secure: the truncation failure probability per virtual batch the guard allows")
    min_nodes: int = setting(1, table="hyper", low=1, doc="training starts once this many nodes are live")
    node_timeout_s: float = setting(20.0, table="hyper", above=0.0,
                                    doc="deadline of one request to a node; with adaptive pacing its ceiling")
    pacing: str = setting("fixed", table="hyper", choices=PACING,
                          doc='"fixed" waits up to node_timeout_s for every node; "adaptive" drops the nodes '
                              "still outstanding at a phase's measured deadline once another answered")
    node_floor_s: float = setting(5.0, table="hyper", above=0.0,
                                  doc="adaptive pacing: the deadline's floor, so a node on a busy host is not dropped")
    helper_timeout_s: float = setting(20.0, table="hyper", above=0.0,
                                      doc="deadline of one request to the helper (fixed: one helper per run)")
    helper_wait_s: float = setting(5.0, table="hyper", above=0.0,
                                   doc="how long the helper waits for the shares a request names, and the helper "
                                       "and a node wait to see each other live")
    eval_every: int = setting(10, table="hyper", low=0,
                              doc="steps between evaluations on the held-out split; 0: only at the end")
    helper: str = setting("", table="hyper", doc="secure: the peer id of the run's one helper (required)")
    min_sum_nodes: int = setting(2, table="hyper", low=2,
                                 doc="secure: k, the fewest nodes whose gradients are ever summed and revealed")
    min_batch: int = setting(0, table="hyper", low=0,
                             doc="secure: the fewest samples a revealed gradient sum covers; 0: 2 x num_classes")

    def __post_init__(self) -> None:
        check(self)
        self._check_model()
        self._check_normalization()
        self._check_secure()
        if self.steps == 0 and self.epochs == 0:
            raise ConfigError("hyper.steps and hyper.epochs are both 0: set one of them")
        if self.pacing == "adaptive" and self.node_floor_s > self.node_timeout_s:
            raise ConfigError(f"hyper.node_floor_s ({self.node_floor_s}) is above hyper.node_timeout_s "
                              f"({self.node_timeout_s}): the adaptive deadline lies between them")
        if self.helper_wait_s >= self.helper_timeout_s:
            raise ConfigError(f"hyper.helper_wait_s ({self.helper_wait_s}) must be shorter than hyper.helper_timeout_s "
                              f"({self.helper_timeout_s}), or the orchestrator gives up before the helper answers")

    def _check_model(self) -> None:
        if self.model and self.stages:
            raise ConfigError(f"model.name = {self.model!r} and model.stages are both set: name a built-in or "
                              "declare the stages, not both")
        if self.stages and (self.channels or self.hidden):
            raise ConfigError("model.channels and model.hidden size a built-in; a declared model.stages gives its "
                              "sizes in its layers")
        where = "model." if self.stages else f"model.name = {self.model or DEFAULT_MODEL!r}: "
        try:
            infer_shapes(self.declaration, input_shape=self.input_shape, num_classes=self.num_classes)
            if self.cut == 0:
                object.__setattr__(self, "cut", len(self.declaration) - 1)
            check_cut(self.declaration, self.cut)
        except TraversalError as exc:
            raise ConfigError(f"{'model.' if str(exc).startswith(('input_shape', 'cut')) else where}{exc}") from exc
        if self.secure:
            try:
                check_secure(self.declaration, self.cut)
            except TraversalError as exc:
                raise ConfigError(f"hyper.mode = \"secure\": {where}{exc}") from exc

    def _check_secure(self) -> None:
        """Secure mode's own settings (SECURITY.md, "TL++ secure mode: threat model")."""
        if not self.secure:
            if self.helper:
                raise ConfigError("hyper.helper is read only in secure mode (hyper.mode = \"secure\"); this run is "
                                  "in base mode, where the cut activations travel in plaintext to the orchestrator")
            return
        if not is_peer_id(self.helper):
            raise ConfigError(f"hyper.mode = \"secure\" needs hyper.helper, the peer id of the run's one helper (64 "
                              f"hex digits; its operator prints it with `gossamer identity show`), got "
                              f"{self.helper[:80]!r}")
        if self.optimizer == "sgd":
            raise ConfigError("hyper.mode = \"secure\" refuses hyper.optimizer = \"sgd\": the helper receives the "
                              "orchestrator-side weights every step, and with SGD their difference is lr times the "
                              "summed gradient, exactly (SECURITY.md); use \"adam\"")
        floor = 2 * self.num_classes
        if self.min_batch and self.min_batch < floor:
            raise ConfigError(f"hyper.min_batch = {self.min_batch}: secure mode needs at least 2 x num_classes = "
                              f"{floor} (below it the orchestrator solves the cut activations from the summed "
                              "gradient); 0 takes that floor")
        if self.batch_size < self.smallest_batch:
            raise ConfigError(f"hyper.batch_size = {self.batch_size} is below hyper.min_batch = {self.smallest_batch} "
                              "(the fewest samples secure mode reveals a gradient sum of): raise batch_size")
        if self.min_nodes < self.min_sum_nodes:
            raise ConfigError(f"hyper.min_nodes = {self.min_nodes} is below hyper.min_sum_nodes = {self.min_sum_nodes}: "
                              "secure mode never reveals a gradient summed over fewer nodes, so training could not "
                              "start")

    def too_few(self, nodes: Collection[str], rows: Mapping[str, int]) -> str:
        """Secure mode: why a sum over ``nodes`` (holding ``rows`` samples each) must not be revealed
        (fewer than ``min_sum_nodes`` nodes or ``min_batch`` samples), or "" when it may."""
        if len(nodes) < self.min_sum_nodes:
            return f"{len(nodes)} node(s), fewer than min_sum_nodes = {self.min_sum_nodes}"
        samples = sum(rows[n] for n in nodes)
        return f"{samples} samples, fewer than min_batch = {self.smallest_batch}" if samples < self.smallest_batch else ""

    @property
    def smallest_batch(self) -> int:
        """Secure mode: the fewest samples a revealed gradient sum covers (``min_batch``, or 2 x num_classes)."""
        return self.min_batch or 2 * self.num_classes

    def _check_normalization(self) -> None:
        channels = self.input_shape[0]
        if self.normalize != "fixed" and (self.mean or self.std):
            raise ConfigError(f"data.mean and data.std are read only with data.normalize = \"fixed\" (it is "
                              f"{self.normalize!r})")
        if self.normalize == "fixed" and not (len(self.mean) == len(self.std) == channels and min(self.std) > 0):
            raise ConfigError(f"data.normalize = \"fixed\" needs data.mean and data.std with {channels} value(s) each "
                              f"(one per channel of model.input_shape), std > 0; got {list(self.mean)} and "
                              f"{list(self.std)}")
        if self.normalize == "nodes" and channels > MAX_STATS_CHANNELS:
            raise ConfigError(f"data.normalize = \"nodes\" pools per-channel sums from the nodes' records, at most "
                              f"{MAX_STATS_CHANNELS} channels; model.input_shape has {channels}: fix data.mean and "
                              "data.std instead (data.normalize = \"fixed\")")

    @cached_property
    def declaration(self) -> Declaration:
        """The model's stages: the declared ones, or the built-in's."""
        if self.stages:
            return self.stages
        try:
            return builtin_stages(self.model or DEFAULT_MODEL, num_classes=self.num_classes,
                                  channels=self.channels, hidden=self.hidden)
        except TraversalError as exc:
            raise ConfigError(f"model.{exc}") from exc

    @property
    def secure(self) -> bool:
        return self.mode == "secure"

    @property
    def num_stages(self) -> int:
        return len(self.declaration)

    def build_model(self, device: torch.device | str) -> nn.Sequential:
        """The run's model, initialised from ``seed`` (every host builds the same one). With
        ``data.normalize`` set, stage 0 starts with a ``Normalize`` layer (``normalization``):
        fixed statistics are loaded here, the nodes' pooled ones by the orchestrator."""
        first = None
        if self.normalize != "none":
            first = Normalize(self.input_shape)
            if self.normalize == "fixed":
                first.set(self.mean, self.std)
        return build_stages(self.declaration, input_shape=self.input_shape, num_classes=self.num_classes,
                            seed=self.seed, device=device, first=first)

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """The orchestrator's optimizer over ``model`` (``hyper.optimizer``, ``lr``, ...)."""
        if self.optimizer == "sgd":
            return torch.optim.SGD(model.parameters(), lr=self.lr, momentum=self.momentum,
                                   weight_decay=self.weight_decay)
        return torch.optim.Adam(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def normalization(self, model: nn.Sequential) -> Normalize | None:
        """The model's input normalisation layer, if the run normalises."""
        return model[0][0] if self.normalize != "none" else None

    def split(self, model: nn.Sequential) -> tuple[nn.Sequential, nn.Sequential]:
        """(node side, orchestrator side) of ``model`` at the cut; ConfigError if the split cannot work."""
        try:
            return split_model(model, self.cut)
        except TraversalError as exc:
            raise ConfigError(f"model.cut = {self.cut}: {exc}") from exc
