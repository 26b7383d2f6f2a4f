"""Models built by the user's own code: a factory named by its import path, ``package.module:name``
(a function or class that returns an ``nn.Module`` when called without arguments), and
optionally a state dict loaded into what it returns."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path
from typing import Callable, Iterator

from torch import nn

from dyntta.models.checkpoint import load_checkpoint, load_state_checked, read_state_dict


@contextlib.contextmanager
def current_folder_importable() -> Iterator[None]:
    """The current folder first on ``sys.path`` while importing (as ``python -m`` has it), so
    that a module file beside the command is found."""
    folder = os.getcwd()
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


def import_factory(path: str) -> Callable[[], nn.Module]:
    """The callable that ``path`` (``package.module:name``, ``name`` may be dotted) names."""
    module_name, sep, name = path.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"model factory {path!r} must look like package.module:function")
    try:
        with current_folder_importable():
            module = importlib.import_module(module_name)
    except (ImportError, SyntaxError) as exc:
        raise ValueError(f"model factory {path!r}: cannot import {module_name!r} "
                         f"({type(exc).__name__}: {exc})") from None
    factory = module
    for part in name.split("."):
        if not hasattr(factory, part):
            raise ValueError(f"model factory {path!r}: {module_name!r} has no {name!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise ValueError(f"model factory {path!r} is a {type(factory).__name__}, not callable: "
                         "name a function (or class) that returns a torch.nn.Module")
    return factory


def build_from_factory(path: str, checkpoint: str | os.PathLike | None = None) -> nn.Module:
    """Call the factory that ``path`` names, load ``checkpoint`` (a state dict, possibly wrapped
    as ``{"state_dict": ...}``; every key must fit) into its module if given; in eval mode."""
    model = import_factory(path)()
    if not isinstance(model, nn.Module):
        raise ValueError(f"model factory {path!r} returned a {type(model).__name__}, not a "
                         "torch.nn.Module")
    if checkpoint is not None:
        _, state = read_state_dict(checkpoint)
        load_state_checked(model, state, str(Path(checkpoint)))
    return model.eval()


def load_model(checkpoint: str | os.PathLike | None, factory: str | None = None) -> nn.Module:
    """The model ``factory`` builds, with ``checkpoint`` loaded into it if given
    (:func:`build_from_factory`); without a factory, the ``checkpoint`` of a known architecture
    (:func:`~dyntta.models.load_checkpoint`)."""
    return build_from_factory(factory, checkpoint) if factory else load_checkpoint(checkpoint)
