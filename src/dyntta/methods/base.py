"""The one method interface: ``logits = method(x)`` predicts and adapts online,
``method.reset()`` restores the source state.

A method is an ``nn.Module`` that owns a deep copy of the user's model (the user's model is never
modified) and a frozen dataclass of hyper-parameters, ``config``. Subclasses state only what
differs: :meth:`Method.prepare` turns the copied model into the adapted one, :meth:`Method.step`
handles one batch, and :meth:`Method.on_reset` builds the state that is not a parameter or a
buffer (optimiser, memory, counters, generators).

The whole adaptation state is in ``state_dict()``: parameters and buffers as usual, and every
attribute that :meth:`Method.on_reset` assigns (recorded when the method is built), plus the
attributes a submodule lists in ``adaptation_state`` (e.g. a layer's window), under
``_extra_state`` keys (:mod:`dyntta.state`). ``load_state_dict()`` of a saved adapted model into
a fresh ``adapt(model, name, same options)`` therefore resumes exactly: the next logits are those
the saved one would have given. ``reset()`` is the load of the state saved at construction.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
import warnings
from typing import Any, ClassVar, Literal, Union

import torch
from torch import nn

from dyntta.state import CarriesState


@dataclasses.dataclass(frozen=True)
class NoConfig:
    """A method without hyper-parameters."""


CompileOption = Union[bool, dict]
"""``compile=``: ``False``, ``True`` (``torch.compile``'s defaults, inductor) or a dict of
``torch.compile`` keyword arguments (e.g. ``{"backend": "aot_eager"}``,
``{"mode": "reduce-overhead"}``)."""


class Method(CarriesState):
    """Base class of every test-time adaptation method.

    Args:
        model: a classifier mapping images (B, 3, H, W) in [0, 1] to logits (B, K). It is copied;
            the original is left as it was.
        config: an instance of the method's ``Config`` dataclass (its defaults if omitted).
        validate: check every batch's values (:func:`check_values`: finite and within
            (-0.5, 1.5), i.e. images in [0, 1]); one reduction over the batch. ``False`` skips
            it (the shape and dtype checks, metadata only, always run).
        compile: compile the adapted network with ``torch.compile`` (:data:`CompileOption`),
            backward-free methods only. The batch dimension is marked dynamic, so one graph
            serves the batch sizes of a stream (docs/input-checks-and-compile.md).
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoConfig
    backward: ClassVar[bool] = False
    """Whether the method takes gradient steps (test-time fine-tuning) or not (normalisation)."""
    reads_reference: ClassVar[bool] = False
    """Whether the method reads clean images of the model's domain, given as ``reference=``."""

    def __init__(
        self,
        model: nn.Module,
        config: Any = None,
        *,
        validate: bool = True,
        compile: CompileOption = False,
    ) -> None:
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
        if not isinstance(validate, bool):
            raise ValueError(f"validate must be True or False, got {validate!r}")
        compile_options = compile_arguments(compile)
        if compile_options is not None and self.backward:
            raise ValueError(
                f"compile=True is for backward-free methods; {self.name!r} takes gradient "
                "steps (its optimiser and backward pass run outside a compiled forward)"
            )
        self.config = config
        self.validate = validate
        copied = copy.deepcopy(model)
        copied.register_forward_hook(check_logits)  # copies made by prepare (teachers) keep it
        self.model = self.prepare(copied)
        self.input_dtype = model_dtype(self.model)
        self._recording: set[str] | None = set()
        self.on_reset()
        self._state_names = tuple(sorted(self._recording))
        self._recording = None
        self._source_state = copy.deepcopy(self.state_dict())
        self.compiled = compile_options is not None
        if self.compiled:
            self.model.compile(**compile_options)
        self.outputs_checked = False

    def prepare(self, model: nn.Module) -> nn.Module:
        """Turn the copied source model into the model this method runs (default: eval mode)."""
        return model.eval()

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """Predict (and adapt on) one validated batch; returns logits (B, K)."""
        raise NotImplementedError

    def on_reset(self) -> None:
        """Build the state that is not a parameter or a buffer (called at start, by ``reset()``
        and before a state dict is loaded): every attribute assigned here is adaptation state,
        saved in the state dict."""

    def __setattr__(self, name: str, value: Any) -> None:
        recording = self.__dict__.get("_recording")
        if recording is not None:
            recording.add(name)
        super().__setattr__(name, value)

    def state_names(self) -> tuple[str, ...]:
        return self._state_names

    def set_extra_state(self, state: Any) -> None:
        """Start from a fresh :meth:`on_reset` state, then restore the saved one into it."""
        self.on_reset()
        super().set_extra_state(state)

    def train(self, mode: bool = True) -> "Method":
        """Sets only this module's ``training`` flag: the adapted network's layers keep the
        modes the method gives them (a BN layer switched to training mode by a user would
        overwrite its statistics), so ``adapted.train()`` and ``.eval()`` change no result."""
        if not isinstance(mode, bool):
            raise ValueError(f"train(mode) takes True or False, got {mode!r}")
        self.training = mode
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, K) for a batch ``x: (B, C, H, W)`` of images in [0, 1]."""
        check_batch(x, self.input_dtype)
        if self.validate:
            check_values(x)
        if self.compiled:
            torch._dynamo.maybe_mark_dynamic(x, 0)  # one graph for every batch size
        logits = self.step(x)
        if not self.outputs_checked:
            self.outputs_checked = True
            warn_if_probabilities(logits)
        return logits

    def reset(self) -> None:
        """Restore the exact source state: weights, buffers and any method memory."""
        self.load_state_dict(self._source_state)


def warn_if_probabilities(outputs: torch.Tensor) -> None:
    """Warn (one line) when ``outputs`` (B, K) look like probabilities: non-negative, each row
    summing to 1. Methods read logits (entropies, softmax confidences, pseudo-labels), so a model
    ending in a softmax adapts on the wrong quantity."""
    if outputs.ndim != 2 or outputs.shape[1] < 2 or not outputs.is_floating_point():
        return
    sums = outputs.detach().float().sum(1)
    if bool((outputs >= 0).all()) and bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-3)):
        warnings.warn("the model's outputs are non-negative and sum to 1 per row, like "
                      "probabilities: test-time adaptation methods expect logits (drop the "
                      "model's final softmax)", stacklevel=2)


def compile_arguments(option: CompileOption) -> dict | None:
    """``torch.compile`` keyword arguments for ``compile=option`` (None: do not compile)."""
    if option is False:
        return None
    if option is True:
        return {}
    if isinstance(option, dict):
        return option
    raise ValueError(
        f"compile must be True, False or a dict of torch.compile arguments, got {option!r}"
    )


def model_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's first floating-point parameter or buffer (None if it has none)."""
    tensors = [*model.parameters(), *model.buffers()]
    return next((t.dtype for t in tensors if t.is_floating_point()), None)


def check_batch(x: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """Raise ``ValueError`` unless ``x`` is a floating (B, C, H, W) tensor with no empty
    dimension, of ``dtype`` if given. Metadata only: no read of the values.

    A float64 batch for a float32 model is refused rather than cast: converting is the caller's
    choice (``x.float()``), and a silent cast would hide a copy of the batch.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"input must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 4 or x.numel() == 0:
        raise ValueError(
            f"input must have shape (B, C, H, W) with no empty dimension, got {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"input must be floating point (images in [0, 1]), got {x.dtype}")
    if dtype is not None and x.dtype != dtype:
        raise ValueError(
            f"input is {x.dtype} but the model computes in {dtype}: convert the batch first "
            f"(e.g. x.to({dtype}))"
        )


def check_logits(module: nn.Module, args: Any, output: Any) -> None:
    """Forward hook on the adapted model: raise ``ValueError`` unless it returned logits, a
    (B, K) tensor (a model returning a tuple or a dict needs a wrapper that picks the logits)."""
    if not isinstance(output, torch.Tensor) or output.ndim != 2:
        got = type(output).__name__ if not isinstance(output, torch.Tensor) else \
            f"a tensor of shape {tuple(output.shape)}"
        raise ValueError(f"the model must return logits, a (B, K) tensor, but returned {got}: "
                         "wrap it so that it returns the logits (e.g. the first element)")


VALUE_RANGE = (-0.5, 1.5)
"""Open interval every input value must lie in: images in [0, 1] with room for rounding and
mild out-of-range augmentation, far from 0-255 pixel values and standardised (z-scored) images."""


def check_values(x: torch.Tensor) -> None:
    """Raise unless every value of ``x`` is finite and inside :data:`VALUE_RANGE`.

    One fused reduction (``torch.aminmax``; NaN propagates into both). On the CPU the result is
    read at once and a failure is a ``ValueError`` naming the problem. On an accelerator the
    check is ``torch._assert_async``: the forward does not wait on the host, and a bad batch
    stops the program at the next synchronisation with a device-side assertion (after which the
    device context is unusable; validate on the CPU, or pass ``validate=False``, to avoid that).
    """
    low, high = torch.aminmax(x)
    inside = (low > VALUE_RANGE[0]) & (high < VALUE_RANGE[1])
    if x.device.type != "cpu":
        torch._assert_async(inside, "dyntta: input values must be finite and lie in [0, 1]")
    elif not inside:
        if not bool(torch.isfinite(low) & torch.isfinite(high)):
            raise ValueError("input contains NaN or Inf values")
        raise ValueError(
            f"input values must lie in [0, 1] (images scaled to [0, 1]), got values from "
            f"{float(low):.4g} to {float(high):.4g}: divide 0-255 images by 255 (or pass "
            "validate=False to skip this check)"
        )


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
