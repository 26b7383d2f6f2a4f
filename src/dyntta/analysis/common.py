"""What the analyses share: streams, BN-layer selection, evaluation loops, results files, figures.

Results are data: every analysis returns rows (dicts), :func:`write_rows` stores them as JSON
lines (atomically) and its figure is drawn from the rows read back with :func:`read_rows`.
Figures use matplotlib's object API with the Agg canvas (no pyplot, no global backend switch);
matplotlib and scikit-learn are imported when first used, so that the CLI starts quickly.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from dyntta.atomic import write_atomic
from dyntta.data import CORRUPTIONS, Batch, CorruptedDataset, Stream, make_stream
from dyntta.methods.dyn import DYNConfig
from dyntta.norm import ClusterAwareBatchNorm2d, replace_batchnorm
from dyntta.norm.layers import Clustering

STAGE = re.compile(r"(?:^|\.)layer(\d+)(?:\.|$)")


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    """How an analysis cuts its test stream (see :func:`dyntta.data.make_stream`).

    corruptions: names in stream order; ``None`` = every corruption the dataset holds, in the
        standard order. n_samples: dataset rows used per domain (``None`` = all).
    """

    scenario: str = "crossmix"
    corruptions: tuple[str, ...] | None = None
    severity: int = 5
    batch_size: int = 64
    n_samples: int | None = None
    seed: int = 0

    def domains_of(self, dataset: CorruptedDataset) -> tuple[str, ...]:
        """The corruption names this stream uses on ``dataset``."""
        if self.corruptions is not None:
            return tuple(self.corruptions)
        standard = tuple(c for c in CORRUPTIONS if c in dataset.corruptions)
        extra = tuple(c for c in dataset.corruptions if c not in CORRUPTIONS)
        return standard + extra

    def make(self, dataset: CorruptedDataset, **changes: Any) -> Stream:
        """The stream over ``dataset``; ``changes`` override fields (e.g. ``severity=3``)."""
        o = dataclasses.replace(self, **changes)
        return make_stream(
            dataset,
            corruptions=o.domains_of(dataset),
            severity=o.severity,
            scenario=o.scenario,
            batch_size=o.batch_size,
            seed=o.seed,
            n_samples=o.n_samples,
        )

    def describe(self, dataset: CorruptedDataset, **changes: Any) -> str:
        """A short human-readable description, for figure titles."""
        o = dataclasses.replace(self, **changes)
        n = len(o.domains_of(dataset))
        rows = "all" if o.n_samples is None else o.n_samples
        return (
            f"{o.scenario}, {n} domain{'s' if n != 1 else ''}, severity {o.severity}, "
            f"B={o.batch_size}, {rows} rows/domain, seed {o.seed}"
        )


@dataclasses.dataclass(frozen=True)
class Subject:
    """What is analysed: a model (images in [0, 1] -> logits) on a corrupted dataset."""

    model: nn.Module
    dataset: CorruptedDataset
    model_name: str
    dataset_name: str


def bn_layer_names(model: nn.Module) -> list[str]:
    """Qualified names of the model's ``nn.BatchNorm2d`` layers, in module order."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    if not names:
        raise ValueError(f"{type(model).__name__} has no nn.BatchNorm2d layer to analyse")
    return names


def deep_bn_layer_names(model: nn.Module) -> list[str]:
    """The BN layers of the deepest stage.

    For the ResNets of :mod:`dyntta.models` (and torchvision's) these are the BN layers under the
    last ``layer<k>`` module (e.g. ``net.layer3.*`` of a CIFAR ResNet-20: 6 layers; of ResNet-26
    also the shortcut BN). A model without ``layer<k>`` modules: the last third of its BN layers.
    """
    names = bn_layer_names(model)
    stages = [STAGE.findall(n) for n in names]
    numbered = [int(s[-1]) for s in stages if s]
    if numbered:
        last = max(numbered)
        return [n for n, s in zip(names, stages) if s and int(s[-1]) == last]
    return names[len(names) - max(1, len(names) // 3) :]


def with_bn_layers(model: nn.Module, make_layer: Callable[[nn.BatchNorm2d], nn.Module]) -> nn.Module:
    """A frozen eval-mode copy of ``model`` whose BatchNorm2d layers are ``make_layer(bn)``.

    Module names are kept, so :func:`bn_layer_names` of the original address the new layers.
    """
    copied = copy.deepcopy(model)
    replace_batchnorm(copied, make_layer)
    return copied.eval().requires_grad_(False)


def dyn_model(model: nn.Module, clustering: Clustering, config: DYNConfig = DYNConfig()) -> nn.Module:
    """A copy of ``model`` whose BN layers are DYN's cluster-aware BN with ``clustering``."""
    return with_bn_layers(
        model,
        lambda bn: ClusterAwareBatchNorm2d(
            bn, alpha=config.alpha, mix=config.mix, unbiased=config.unbiased, clustering=clustering
        ),
    )


def modules_named(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    """The submodules of ``model`` with the given qualified names (``ValueError`` if absent)."""
    table = dict(model.named_modules())
    missing = [n for n in names if n not in table]
    if missing:
        raise ValueError(f"{type(model).__name__} has no module(s) named {missing}")
    return [table[n] for n in names]


def device_of(model: Callable[[torch.Tensor], torch.Tensor]) -> torch.device:
    """The device of a module's first parameter or buffer (CPU for anything else)."""
    if isinstance(model, nn.Module):
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            return tensor.device
    return torch.device("cpu")


@torch.no_grad()
def predictions(
    model: Callable[[torch.Tensor], torch.Tensor],
    stream: Iterable[Batch],
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Iterator[tuple[Batch, torch.Tensor]]:
    """Run ``model`` batch by batch; yields ``(batch, correct)`` with ``correct`` (B,) bool.

    Images go to the model's device; ``transform`` (optional) then maps them before the model
    sees them. Works for plain models and for :class:`~dyntta.methods.base.Method` s, which
    adapt as they go.
    """
    device = device_of(model)
    for batch in stream:
        x = batch.x.to(device)
        if transform is not None:
            x = transform(x)
        yield batch, model(x).argmax(1) == batch.y.to(device)


def accuracy(
    model: Callable[[torch.Tensor], torch.Tensor],
    stream: Iterable[Batch],
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> float:
    """Top-1 accuracy (fraction in [0, 1]) of ``model`` over the whole stream."""
    correct = total = 0
    for _, hit in predictions(model, stream, transform):
        correct += int(hit.sum())
        total += hit.numel()
    if total == 0:
        raise ValueError("the stream holds no samples")
    return correct / total


def context(analysis: str, subject: Subject, stream: str) -> dict[str, str]:
    """The fields every results row carries, so that its figure can be titled from the file."""
    return {
        "analysis": analysis,
        "model": subject.model_name,
        "dataset": subject.dataset_name,
        "stream": stream,
    }


def title(rows: Sequence[dict[str, Any]]) -> str:
    """``"<analysis>: <model> on <dataset>\\n<stream>"`` from the rows' shared context."""
    first = rows[0]
    return f"{first['analysis']}: {first['model']} on {first['dataset']}\n{first['stream']}"


def write_rows(path: str | os.PathLike, rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``rows`` as JSON lines to ``path`` atomically (temp file + ``os.replace``)."""
    if not rows:
        raise ValueError(f"no results to write to {path}")
    path = Path(path)
    write_atomic(path, "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    return path


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a JSON-lines results file; errors name the file and the bad line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"results file {path} does not exist (run the analysis first)")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not a JSON object ({exc})") from exc
    if not rows:
        raise ValueError(f"results file {path} holds no rows")
    return rows


def new_figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6.4, 4.2)):
    """A matplotlib ``Figure`` on the Agg canvas with ``nrows`` x ``ncols`` axes.

    ``size`` is one panel's (width, height) in inches; 100 dpi.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # imported on use: slow
    from matplotlib.figure import Figure

    figure = Figure(figsize=(size[0] * ncols, size[1] * nrows), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    figure.subplots(nrows, ncols, squeeze=False)
    return figure
