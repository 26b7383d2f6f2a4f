"""DYN-adaptive: DYN's cluster-aware BN with rules that adapt to the batch (beyond the paper).

Not the DYN paper's method (that is ``dyn``, kept bit-identical). One probe forward on the first
batch orders the BN layers as they run and reads the size of their feature maps; each takes a role:

- **neighbourhood layers**, before the network's last, smallest map size (and the first layer,
  whatever its size; :class:`~dyntta.norm.adaptive.NeighbourhoodNorm2d`): each sample takes the
  statistics of its ``neighbours`` nearest samples among the last ``shallow_window`` (the batch
  and those just before it), searched among the ``MIN_IMAGES`` (32) images whose spectra are
  nearest its own (:func:`~dyntta.norm.spectrum.nearest_spectra`), the source weighted by that
  size;
- **pooling layers**, at the last map size (:func:`pools`;
  :class:`~dyntta.norm.adaptive.PooledNorm2d`): one pool of the last ``deep_window`` samples, of
  which they keep those whose spectra look like the current pool's
  (:class:`~dyntta.norm.WindowMatch`; on a batch of one domain it judges whole each block of B
  before it that is one domain of its own) and, of those, the most recent ``deep_balance`` of each
  predicted class (:class:`~dyntta.norm.ClassBalance`, NOTE's class-balanced memory), the source
  weighted by how evenly the last ``window`` predictions spread over the classes
  (:func:`~dyntta.norm.mixing.label_balance_weight`);
- **the instance rule** in the layers at the largest map size (the first stage,
  :func:`applies_instance_rule`, whatever their role above): NOTE's instance-aware rule around
  those statistics, its band widened per channel to the observed spread of instance means
  (:func:`~dyntta.norm.adaptive.widened_instance_rule`).

Each batch, the images' spectra say how the layers group it (:meth:`DYNAdaptive.read_spectra`):

- **one domain** (the batch topped up to 32 with the images just before it spreads like one
  domain, :func:`~dyntta.norm.spectrum.one_domain`, and the batch does not lie apart from those
  images, :func:`~dyntta.norm.spectrum.domain_shift`; or a batch of 16 to 31 alone, at the
  stricter threshold of fewer images): those images are one group in the neighbourhood layers,
  the pooling layers' filter judges against them, and no layer applies the instance rule (within
  one domain a sample's statistics leave the group's by its content, not its domain); in the
  first stage the source pulls the group's statistics by at most the size weight times their
  members' spread (:func:`~dyntta.norm.adaptive.one_domain_statistics`: a low-contrast domain
  keeps its own variance), and, given clean ``reference`` images, the channels whose images spread
  their means further apart than the source's (:attr:`DYNAdaptive.source_ratios`,
  :func:`~dyntta.norm.adaptive.offset_channels`) give each image its own mean by NOTE's rule;
- **mixed**: the neighbourhood search above; the pooling layers' filter judges against the batch
  topped up to ``window``, and each sample's group there is the ``window`` kept rows whose
  spectra are nearest its own.

Why: shallow layers' statistics carry the domain, deep ones' the labels (IBN-Net, Pan et al.,
ECCV 2018), so neighbourhoods before the last stage and the instance rule in the first, and
label-balanced pools in the last stage, which feeds the classifier (stages read from the network,
not shares of its depth: the first and the last stage are 7 and 6 of the ResNet-20's 19 BN
layers, 3 and 2 of the MLPerf-Tiny ResNet-8's 7; in a network of one map size throughout, such as
a ConvMixer, every layer is both, and all but the first pool). A sample's nearest samples share
its content as well as its domain, so a batch of one domain serves better than any neighbourhood;
in a mixed one the spectra, which corruptions move more than content does, keep each search to
the images most likely of the sample's domain. The measurements behind each rule and constant:
docs/dyn-adaptive-rules.md; its standing against the baselines: RESULTS.md, "`dyn_adaptive`
across architectures".

State: each layer remembers its window of instance statistics; the method owns what several
layers share: the deep layers' source weight (buffer ``deep_source_weight``), the two window
filters (the spectral one holds the signatures of the last images), what it sets in the layers
before each batch from those signatures (the one-domain decision, each sample's candidates and
its deep group) and the last predictions.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from dyntta.methods.base import check_unit_interval
from dyntta.methods.dyn import DYNConfig
from dyntta.methods.normalization import NormalizationMethod
from dyntta.methods.reference import reference_ratios
from dyntta.methods.registry import register
from dyntta.norm import ClassBalance, SourceBatchNorm2d, WindowMatch
from dyntta.norm.adaptive import NeighbourhoodNorm2d, PerCall, PooledNorm2d, WindowedNorm2d
from dyntta.norm.mixing import label_balance_weight
from dyntta.norm.spectrum import (
    MIN_IMAGES, SAME_DOMAIN_SHIFT, domain_shift, log_band_power, nearest_spectra, one_domain)

FIRST_WEIGHT = DYNConfig.alpha
"""The deep layers' source weight before the first prediction: DYN's."""


def pools(i: int, sizes: list[int]) -> bool:
    """Whether the i-th BN layer to run, of those whose maps have ``sizes`` positions (H x W) in
    the order they run, pools: it runs at the network's last, smallest map size (after its last
    downsampling, nearest the classifier) and is not the first layer."""
    return 0 < i < len(sizes) and sizes[i] == min(sizes)


def applies_instance_rule(i: int, sizes: list[int]) -> bool:
    """Whether the i-th BN layer to run (``sizes`` as in :func:`pools`) applies the instance
    rule: it runs at the network's largest map size (its first stage, before the first
    downsampling)."""
    return i < len(sizes) and sizes[i] == max(sizes)


@dataclasses.dataclass(frozen=True)
class DYNAdaptiveConfig:
    """Hyper-parameters of DYN-adaptive (each constant's measured sensitivity:
    docs/dyn-adaptive-rules.md, "The constants, each swept alone").

    neighbours: n >= 1 nearest samples behind each sample's statistics in the neighbourhood
        layers (of its ``MIN_IMAGES`` spectral candidates); 8.
    prior_strength: N > 0: those layers weight the source ``N / (N + n)`` (in the first stage,
        on a group of one domain, its pull bounded by the members' spread); 16, or what
        :func:`~dyntta.methods.source_weights.calibrate_source_weights` reads for the model
        on clean images of its domain.
    instance_k, instance_spread: the instance rule's band, ``max(k, c * sqrt(rho))`` standard
        errors (:func:`~dyntta.norm.adaptive.widened_instance_rule`); 8 and 2.5.
    balanced_alpha, balance_power: the deep source weight for perfectly even predictions (0.4,
        or what :func:`~dyntta.methods.source_weights.calibrate_source_weights` reads) and its
        power p (2: it leaves 1 as the square of the evenness).
    window: the predictions the deep source weight reads, the pool (batch topped up with the
        most recent samples) that the deep layers' filter judges against on a batch not of one
        domain (on one, the images judged one domain), and each image's group in those layers
        on such a batch; 64.
    shallow_window, deep_window: samples remembered by the neighbourhood layers (256) and by
        the pooling layers (512); each tops a batch of B up to that many with the most recent
        ``shallow_window - B`` or ``deep_window - B`` of them.
    deep_match: the quantile q in [0, 1] of :class:`~dyntta.norm.WindowMatch`; 0.1.
    deep_balance: most recent samples of each predicted class the deep layers keep; 32.
    """

    neighbours: int = 8
    prior_strength: float = 16.0
    instance_k: float = 8.0
    instance_spread: float = 2.5
    balanced_alpha: float = 0.4
    balance_power: float = 2.0
    window: int = 64
    shallow_window: int = 256
    deep_window: int = 512
    deep_match: float = 0.1
    deep_balance: int = 32

    def __post_init__(self):
        for name in ("balanced_alpha", "deep_match"):
            check_unit_interval(name, getattr(self, name))
        for name in ("neighbours", "window", "deep_balance"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("shallow_window", "deep_window"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (samples), got {getattr(self, name)}")
        for name in ("instance_k", "instance_spread", "balance_power"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.prior_strength > 0:
            raise ValueError(f"prior_strength must be > 0 (samples), got {self.prior_strength}")


@register
class DYNAdaptive(NormalizationMethod):
    """Beyond the DYN paper: size-weighted neighbourhoods among the spectrally nearest images
    in the BN layers before the last stage (the last images, when they are one domain),
    label-balanced pools in the last stage, the instance rule in the first stage (module
    docstring). Every BN layer holds the source statistics until the first batch, whose probe
    forward orders the layers as they run, reads their map sizes and gives each its role.
    With ``compile=True`` it runs eager until its windows keep their size
    (:meth:`windows_steady`), then compiled.
    """

    name = "dyn_adaptive"
    Config = DYNAdaptiveConfig
    reads_reference = True

    def __init__(self, model: nn.Module, config: DYNAdaptiveConfig | None = None, *,
                 reference: torch.Tensor | None = None, **options) -> None:
        """``reference``: clean images (n, C, H, W) in [0, 1] of the model's own domain,
        n >= ``MIN_IMAGES``, on which it reads the source's between/within ratios
        (:attr:`source_ratios`); None: none read, the first stage's groups of one domain are
        not tested against them. Other arguments: :class:`~dyntta.methods.base.Method`'s."""
        # read before the base class saves the source state, which then holds them
        self._source_ratios = {} if reference is None else reference_ratios(model, reference)
        super().__init__(model, config, **options)

    def prepare(self, model: nn.Module) -> nn.Module:
        c = self.config
        self._placeholders: list[SourceBatchNorm2d] = []
        # the spectral signatures of the last images: the deep filter's and the spectral test's
        memory = max(c.deep_window, c.shallow_window, MIN_IMAGES)
        self._match = WindowMatch(memory, c.window, c.deep_match)
        self._balance = ClassBalance(c.deep_window, c.deep_balance, self._match)
        self.register_buffer("deep_source_weight", torch.tensor(FIRST_WEIGHT))
        self._roles: tuple[list[str], list[int]] | None = None
        return super().prepare(model)

    def make_layer(self, bn):
        """The source BN until the probe forward gives the layer its role."""
        layer = SourceBatchNorm2d(bn)
        self._placeholders.append(layer)
        return layer

    def layers(self) -> list[WindowedNorm2d]:
        return [m for m in self.modules() if isinstance(m, WindowedNorm2d)]

    def assign_roles(self, x: torch.Tensor) -> None:
        """Run ``x`` once with the source statistics, recording the order in which the BN
        layers run and the size of each one's feature maps, and give each layer its role."""
        calls: list[tuple[nn.Module, int]] = []
        hooks = [m.register_forward_pre_hook(
            lambda m, inputs: calls.append((m, inputs[0].shape[2] * inputs[0].shape[3])))
            for m in self._placeholders]
        try:
            self.model.forward(x)
        finally:
            for hook in hooks:
                hook.remove()
        names = {m: name for name, m in self.model.named_modules()}
        ran = [names[m] for m, _ in calls]  # a layer run k times is named k times
        # those that did not run come last (any role would do)
        self.roles = (ran + [names[m] for m in self._placeholders if names[m] not in ran],
                      [size for _, size in calls])

    @property
    def roles(self) -> tuple[list[str], list[int]] | None:
        """The BN layers' names in the order that gave them their roles (the order they run,
        then those that did not run; a layer that runs k times per forward is named k times
        and gets a layer per call, :class:`~dyntta.norm.adaptive.PerCall`) and the positions
        (H x W) of each running call's maps; None before the first batch. Part of the saved
        state, so that a saved adapted model loads into a fresh one with its layers in their
        roles."""
        return self._roles

    @roles.setter
    def roles(self, value: tuple[list[str], list[int]] | None) -> None:
        if value is None or not self._placeholders:
            return
        order, sizes = value
        if not isinstance(sizes, (list, tuple)):
            raise ValueError("dyn_adaptive state from an older version: its roles hold no map "
                             "sizes; adapt the source model again")
        c = self.config
        layers: dict[str, list[nn.Module]] = {}
        for i, name in enumerate(order):
            bn = self.model.get_submodule(name)
            instance = (c.instance_k, c.instance_spread) \
                if applies_instance_rule(i, sizes) else None
            if pools(i, sizes):
                layer = PooledNorm2d(bn, c.deep_window, FIRST_WEIGHT, instance)
            else:
                layer = NeighbourhoodNorm2d(bn, c.shallow_window, c.neighbours,
                                            c.prior_strength, instance)
            layers.setdefault(name, []).append(
                layer.to(bn.running_mean.device).requires_grad_(False))
        for name, calls in layers.items():
            parent, _, attribute = name.rpartition(".")
            setattr(self.model.get_submodule(parent), attribute,
                    calls[0] if len(calls) == 1 else PerCall(calls))
        self._placeholders = []
        self._roles = (list(order), list(sizes))
        self.source_ratios = self._source_ratios

    @property
    def source_ratios(self) -> dict[str, torch.Tensor]:
        """The (C,) between/within ratios of the first stage's BN layers by name, read on the
        reference images (:func:`~dyntta.methods.reference.source_ratios`; empty without
        them), handed to those layers' test of groups of one domain
        (:func:`~dyntta.norm.adaptive.offset_channels`). Part of the saved state."""
        return self._source_ratios

    @source_ratios.setter
    def source_ratios(self, value: dict[str, torch.Tensor]) -> None:
        self._source_ratios = dict(value)
        for name, ratio in self._source_ratios.items():
            for m in self.model.get_submodule(name).modules():
                if isinstance(m, NeighbourhoodNorm2d):
                    m.source_ratio = ratio.to(m.running_mean.device)

    @property
    def windows(self) -> dict[str, tuple[torch.Tensor | None, torch.Tensor | None]]:
        """Each windowed layer's remembered instance means and variances, by layer name (saved
        state; setting it restores them)."""
        return {name: (m.window_mean, m.window_var) for name, m in self.model.named_modules()
                if isinstance(m, WindowedNorm2d)}

    @windows.setter
    def windows(self, value: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]]) -> None:
        for name, (mean, var) in value.items():
            layer = self.model.get_submodule(name)
            layer.window_mean, layer.window_var = mean, var

    def state_names(self) -> tuple[str, ...]:
        # the roles before the windows: a fresh model's layers take their roles first
        return (*super().state_names(), "_match", "_balance", "source_ratios", "roles",
                "windows")

    def windows_steady(self, batch_size: int) -> bool:
        """Whether the window of every layer that runs and each filter memory already has the
        size it keeps from here on, for batches of ``batch_size``. Until then the state the
        network reads changes shape from batch to batch, and a compiled network would compile a
        graph per shape (dynamo stops at 8 and runs eager from there)."""
        if self._placeholders:
            return False
        order, sizes = self._roles
        # a layer that never runs (an unused head) never fills
        running = [self.model.get_submodule(name) for name in set(order[: len(sizes)])]
        running = [m for module in running for m in module.modules()
                   if isinstance(m, WindowedNorm2d)]
        if any(m.window and (m.window_mean is None or m.window_mean.shape[0] < m.window)
               for m in running):
            return False
        match, classes = self._match, self._balance.classes
        return match.current is not None and \
            match.current.shape[0] == match.memory + batch_size and \
            classes is not None and classes.shape[0] >= self._balance.memory

    def read_spectra(self, batch_size: int) -> tuple[int, torch.Tensor | None]:
        """What the spectral signatures of the batch
        (:func:`~dyntta.norm.spectrum.log_band_power`, observed last) and of the images before
        it say:

        - how many of the last images are one domain: ``max(B, MIN_IMAGES)`` when the spectra
          of that many say so (:func:`~dyntta.norm.spectrum.one_domain`) and, below
          ``MIN_IMAGES``, those of the batch do not lie apart from those of the images before
          it (:func:`~dyntta.norm.spectrum.domain_shift`), else B when those of the batch alone
          say so (at the stricter threshold of fewer images), else 0;
        - on a batch not of one domain, each image's ``MIN_IMAGES`` candidate neighbours: (B, K)
          indices into the pool of the neighbourhood layers (the last ``max(shallow_window, B)``
          images, as many as seen) of the images whose spectra are nearest its own
          (:func:`~dyntta.norm.spectrum.nearest_spectra`); None on a batch of one domain."""
        b, recent = batch_size, self._match.current
        last = recent[-max(b, MIN_IMAGES) :]
        # a batch of MIN_IMAGES or more is `last` itself: judged once; the images before a
        # smaller one join it only where their spectra do not lie apart from its own
        one = one_domain(last) and (
            last.shape[0] == b or domain_shift(last, b) < SAME_DOMAIN_SHIFT)
        rows = last.shape[0] if one else \
            b if b < MIN_IMAGES and one_domain(recent[-b:]) else 0
        if rows:
            return rows, None
        pool = recent[-max(self.config.shallow_window, b) :]
        return rows, nearest_spectra(pool, MIN_IMAGES, b)

    def aim_filter(self, rows: int, batch_size: int) -> None:
        """Set the deep filter for a batch of ``batch_size`` whose last ``rows`` images the
        spectra say are one domain (:meth:`read_spectra`): it keeps those images and judges the
        blocks of ``batch_size`` before them whole where they are one domain of their own; on a
        batch not of one domain (``rows`` 0) it keeps the last ``window`` images and judges the
        others one by one."""
        self._match.pool = rows or self.config.window
        self._match.blocks = batch_size if rows else 0

    def deep_groups(self, weight: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Each image's group in the pooling layers on a batch not of one domain: (B, K) indices
        into their pool (the batch after the remembered samples that top it up; ``weight``,
        their ``pool_weight``, says which rows they keep) of the ``window`` kept rows whose
        spectral signatures are nearest its own
        (:func:`~dyntta.norm.spectrum.nearest_spectra`)."""
        pool = self._match.current[self._match.current.shape[0] - weight.shape[0] :]
        return nearest_spectra(pool, self.config.window, batch_size, weight > 0)

    def before_forward(self, x: torch.Tensor) -> None:
        """The roles (first batch), then what the batch's spectra say, into the filter and the
        layers (the one-domain decision, each image's candidates in the neighbourhood layers;
        the rows the pooling layers keep and, on a mixed batch, each image's group there), and
        the deep source weight: computed once per batch for all the layers."""
        if self._placeholders:
            self.assign_roles(x)
        self._match.observe(log_band_power(x.detach().float()))
        b = x.shape[0]
        rows, candidates = self.read_spectra(b)
        self.aim_filter(rows, b)
        deep = next((m for m in self.layers() if isinstance(m, PooledNorm2d)), None)
        weight = None if deep is None else deep.filter_weights(self._balance, b)
        groups = None if rows or deep is None else self.deep_groups(weight, b)
        for m in self.modules():
            if isinstance(m, WindowedNorm2d):
                m.calls = 0  # each runs once per forward (those of a PerCall once each)
                m.domain_rows.fill_(rows)
            if isinstance(m, PooledNorm2d):
                m.source_weight.copy_(self.deep_source_weight)
                m.pool_weight, m.candidates = weight, groups
            elif isinstance(m, NeighbourhoodNorm2d):
                m.candidates = candidates
            elif isinstance(m, PerCall):
                m.call = 0  # the forward's first call goes to its first layer

    @torch.no_grad()
    def step(self, x: torch.Tensor) -> torch.Tensor:
        self.before_forward(x)
        # compiled: eager while the windows fill, the compiled graph once their shapes hold
        steady = not self.compiled or self.windows_steady(x.shape[0])
        logits = self.model(x) if steady else self.model.forward(x)
        classes = logits.argmax(1)
        self._balance.record(classes, logits.shape[1])
        recent = classes if self._recent is None else torch.cat([self._recent, classes])
        self._recent = recent[-self.config.window :]
        self.deep_source_weight.fill_(label_balance_weight(
            self._recent, logits.shape[1], self.config.balanced_alpha, self.config.balance_power))
        return logits

    def on_reset(self) -> None:
        self._recent: torch.Tensor | None = None  # the last predicted classes
        for m in self.layers():
            m.reset_window()
        self._match.reset()
        self._balance.reset()
