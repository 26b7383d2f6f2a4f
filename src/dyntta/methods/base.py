"""The one method interface: ``logits = method(x)`` predicts and adapts online,
``method.reset()`` restores the source state.

A method is an ``nn.Module`` that owns a deep copy of the user's model (the user's model is never
modified) and a frozen dataclass of hyper-parameters, ``config``. Subclasses state only what
differs: :meth:`Method.prepare` turns the copied model into the adapted one, :meth:`Method.step`
handles one batch, and :meth:`Method.on_reset` rebuilds whatever is not in the state dict
(optimiser, memory).
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from typing import Any, ClassVar, Literal, Union

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class NoConfig:
    """A method without hyper-parameters."""


class Method(nn.Module):
    """Base class of every test-time adaptation method.

    Args:
        model: a classifier mapping images (B, 3, H, W) in [0, 1] to logits (B, K). It is copied;
            the original is left as it was.
        config: an instance of the method's ``Config`` dataclass (its defaults if omitted).
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoConfig
    backward: ClassVar[bool] = False
    """Whether the method takes gradient steps (test-time fine-tuning) or not (normalisation)."""

    def __init__(self, model: nn.Module, config: Any = None) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(model, Method):
            raise ValueError(
                f"the model is already adapted (by {model.name!r}); pass the original model, "
                "or call .reset() on the adapted one to restore its source state"
            )
        if config is None:
            config = self.Config()
        if not isinstance(config, self.Config):
            raise ValueError(
                f"config for {self.name!r} must be a {self.Config.__name__}, "
                f"got {type(config).__name__}"
            )
        self.config = config
        self.model = self.prepare(copy.deepcopy(model))
        self._source_state = copy.deepcopy(self.state_dict())
        self.on_reset()

    def prepare(self, model: nn.Module) -> nn.Module:
        """Turn the copied source model into the model this method runs (default: eval mode)."""
        return model.eval()

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """Predict (and adapt on) one validated batch; returns logits (B, K)."""
        raise NotImplementedError

    def on_reset(self) -> None:
        """Rebuild state that lives outside the state dict (called at start and by reset)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, K) for a batch ``x: (B, C, H, W)`` of images in [0, 1]."""
        check_batch(x)
        return self.step(x)

    def reset(self) -> None:
        """Restore the exact source state: weights, buffers and any method memory."""
        self.load_state_dict(self._source_state)
        self.on_reset()


def check_batch(x: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``x`` is a finite floating (B, C, H, W) tensor with B >= 1."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"input must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 4 or x.shape[0] == 0:
        raise ValueError(f"input must have shape (B, C, H, W) with B >= 1, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"input must be floating point (images in [0, 1]), got {x.dtype}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("input contains NaN or Inf values")


def config_from_options(config_cls: type, options: dict[str, Any]) -> Any:
    """Build ``config_cls(**options)``, naming the valid fields when an option is unknown and
    the expected type when a value does not match the field's type hint."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(options) - fields)
    if unknown:
        valid = ", ".join(sorted(fields)) or "none"
        raise ValueError(f"unknown option(s) {unknown} for {config_cls.__name__}; valid: {valid}")
    hints = typing.get_type_hints(config_cls)
    for name, value in options.items():
        if not matches_hint(value, hints[name]):
            raise ValueError(
                f"option {name!r} of {config_cls.__name__} must be {describe_hint(hints[name])}, "
                f"got {value!r} ({type(value).__name__})"
            )
    return config_cls(**options)


def matches_hint(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the type hint of a config field: ``float`` takes ints too, ``int``
    and ``float`` refuse ``bool``, ``tuple[X, ...]`` takes a list (TOML has no tuples)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint in (int, float):
        numbers = (int,) if hint is int else (int, float)
        return isinstance(value, numbers) and not isinstance(value, bool)
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in args)
    if origin in (Union, types.UnionType):
        return any(matches_hint(value, a) for a in args)
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches_hint(v, args[0]) for v in value)
        return len(value) == len(args) and all(map(matches_hint, value, args))
    if hint is None or hint is type(None):
        return value is None
    return isinstance(value, origin or hint)


def describe_hint(hint: Any) -> str:
    """A type hint in words: ``float`` -> "a number", ``Literal["a", "b"]`` -> "one of 'a', 'b'"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (Union, types.UnionType):
        return " or ".join(describe_hint(a) for a in args)
    if origin is tuple:
        return f"a list (each {describe_hint(args[0])})" if args[-1:] == (Ellipsis,) else str(hint)
    words = {float: "a number", int: "an integer", bool: "true or false", str: "a string",
             type(None): "None"}
    return words.get(hint, getattr(hint, "__name__", str(hint)))


def check_unit_interval(name: str, value: float) -> None:
    """Raise ``ValueError`` unless ``0 <= value <= 1``."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")
