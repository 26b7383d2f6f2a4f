"""Adaptation state beyond parameters and buffers, carried by ``state_dict()``.

Test-time adaptation keeps state that is not a parameter or a buffer: sample memories, windows of
statistics, optimiser moments, counters, random generators. A module that keeps such state in
plain attributes lists their names (:class:`CarriesState`); its ``state_dict()`` then carries them
under ``<prefix>_extra_state`` (PyTorch's extra-state hook) and ``load_state_dict()`` restores
them, so a saved adapted model resumes exactly where it stopped.

The saved form holds only tensors, numbers, strings, ``None``, lists, tuples and dicts with string
keys, so ``torch.load(path)`` reads it with its default ``weights_only=True``. Values are encoded
as follows (decoding restores objects *in place* where the module already holds one of the same
class, so objects shared between modules stay shared):

- tensors, numbers, strings, None, lists, tuples: as they are (tensors detached);
- dicts: ``{"dict": [(key, value), ...]}`` (keys may be tuples);
- ``torch.Generator``: its state and device; ``random.Random``: its state;
- ``torch.optim.Optimizer``: its ``state_dict()``, loaded into the optimiser the module holds;
- an ``nn.Module`` held in an attribute: nothing (its own state dict entries carry it);
- an object of a class of this package (a memory, an augmenter, a filter): its class and its
  attributes, encoded alike.

Anything else is a ``TypeError`` naming the attribute: state that cannot be saved is never
silently dropped.
"""

from __future__ import annotations

import copy
import importlib
import random
from typing import Any, ClassVar

import torch
from torch import nn

PACKAGE = "dyntta."


def encode(value: Any, where: str) -> Any:
    """The saved form of ``value`` (see the module docstring); ``where`` names it in errors."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (list, tuple)):
        items = [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {"dict": [(encode(k, where), encode(v, f"{where}[{k!r}]")) for k, v in value.items()]}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.Generator):
        return {"generator": value.get_state(), "on": str(value.device)}
    if isinstance(value, random.Random):
        return {"random": value.getstate()}
    if isinstance(value, torch.optim.Optimizer):
        return {"optimizer": value.state_dict()}
    if isinstance(value, nn.Module):
        return {"module": None}
    cls = type(value)
    if cls.__module__.startswith(PACKAGE) and hasattr(value, "__dict__"):
        return {"object": f"{cls.__module__}:{cls.__qualname__}",
                "attributes": {k: encode(v, f"{where}.{k}") for k, v in vars(value).items()}}
    raise TypeError(f"{where}: cannot save adaptation state of type {cls.__name__}")


def decode(saved: Any, current: Any, where: str) -> Any:
    """The value ``saved`` (from :func:`encode`) stands for, restored into ``current`` (the
    module's present value) where it is an object of the same kind."""
    if isinstance(saved, torch.Tensor):
        tensor = saved.detach().clone()
        return tensor.to(current.device) if isinstance(current, torch.Tensor) else tensor
    if isinstance(saved, (list, tuple)):
        items = [decode(v, None, f"{where}[{i}]") for i, v in enumerate(saved)]
        return items if isinstance(saved, list) else tuple(items)
    if not isinstance(saved, dict):
        return saved
    if "dict" in saved:
        return {decode(k, None, where): decode(v, None, f"{where}[{k!r}]")
                for k, v in saved["dict"]}
    if "device" in saved:
        return torch.device(saved["device"])
    if "generator" in saved:
        generator = current if isinstance(current, torch.Generator) and \
            str(current.device) == saved["on"] else torch.Generator(device=saved["on"])
        generator.set_state(saved["generator"])
        return generator
    if "random" in saved:
        generator = current if isinstance(current, random.Random) else random.Random()
        generator.setstate(saved["random"])
        return generator
    if "optimizer" in saved:
        if not isinstance(current, torch.optim.Optimizer):
            raise ValueError(f"{where}: the saved state holds an optimiser, this model none")
        current.load_state_dict(copy.deepcopy(saved["optimizer"]))
        return current
    if "module" in saved:
        return current
    if "object" in saved:
        cls = object_class(saved["object"], where)
        target = current if type(current) is cls else cls.__new__(cls)
        attributes = vars(target)
        for name, value in saved["attributes"].items():
            attributes[name] = decode(value, attributes.get(name), f"{where}.{name}")
        return target
    raise ValueError(f"{where}: not a saved adaptation state ({sorted(saved)})")


def object_class(name: str, where: str) -> type:
    """The class ``"module:qualname"`` names; only classes of this package."""
    module, _, qualname = name.partition(":")
    if not module.startswith(PACKAGE):
        raise ValueError(f"{where}: refusing to restore an object of {name} (not a dyntta class)")
    cls = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    return cls


class CarriesState(nn.Module):
    """Mixin for a module whose plain attributes :meth:`state_names` hold adaptation state:
    ``state_dict()`` carries them and ``load_state_dict()`` restores them (module docstring)."""

    adaptation_state: ClassVar[tuple[str, ...]] = ()
    """Names of the attributes that hold adaptation state."""

    def state_names(self) -> tuple[str, ...]:
        return self.adaptation_state

    def get_extra_state(self) -> dict[str, Any]:
        where = type(self).__name__
        return {name: encode(getattr(self, name), f"{where}.{name}")
                for name in self.state_names()}

    def set_extra_state(self, state: Any) -> None:
        where = type(self).__name__
        names = self.state_names()
        if not isinstance(state, dict) or set(state) != set(names):
            found = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{where}: the saved adaptation state holds {found}, this model "
                             f"keeps {sorted(names)}: it was saved from another method or "
                             "configuration")
        for name in names:
            setattr(self, name, decode(state[name], getattr(self, name, None), f"{where}.{name}"))
