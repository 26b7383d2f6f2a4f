"""Benchmark protocols: which hyper-parameters the baselines run with.

- ``dyn-paper``: every method at its config's defaults, i.e. the DYN paper's shared setting
  for the gradient baselines (SGD, lr 1e-4, momentum 0.9, batch 64, one online pass) and the
  authors' own settings for the others.
- ``published``: each method with the hyper-parameters of its own paper / released code for
  the dataset family (``cifar10``, ``cifar100``, ``imagenet``), as its config class states in
  ``PUBLISHED`` (with the source of every value in the config's docstring). The stream (batch
  size, order) stays the grid's, so every method still sees the same batches.

Options given in a grid's ``[options.<method>]`` table override both.
"""

from __future__ import annotations

from typing import Any

from dyntta.methods import method_class

PROTOCOLS = ("dyn-paper", "published")
FAMILIES = ("cifar10", "cifar100", "imagenet")
DATASET_FAMILIES = {"cifar10-c": "cifar10", "cifar100-c": "cifar100", "imagenet-c": "imagenet"}
"""The family of each dataset kind whose images and classes say it (``npz`` must say it).
``digits`` has none: no method published hyper-parameters for it, and no paper reports it."""
NO_FAMILY = ("digits",)
"""Dataset kinds that cannot take a family (the embedded demonstration data)."""


def protocol_options(method: str, protocol: str, family: str | None) -> dict[str, Any]:
    """The config options ``protocol`` sets for ``method`` on a dataset of ``family``."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")
    published = getattr(method_class(method).Config, "PUBLISHED", {})
    if protocol == "dyn-paper" or not published:
        return {}
    if family is None:
        raise ValueError(f"the published protocol needs the dataset family for {method!r} (its "
                         f"hyper-parameters were published for {', '.join(FAMILIES)}): set "
                         "family in the grid's [[datasets]] entry; digits has none, so run it "
                         "with --protocol dyn-paper")
    return dict(published.get(family, {}))
