"""Method registry: ``@register`` a :class:`~dyntta.methods.base.Method` subclass under its name."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dyntta.methods.base import CompileOption, Method, config_from_options

_REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: make ``cls`` reachable as ``adapt(model, cls.name)``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} must set a non-empty class attribute 'name'")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"method name {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def available_methods() -> list[str]:
    """Names of all registered methods, sorted."""
    return sorted(_REGISTRY)


def method_class(name: str) -> type[Method]:
    """The registered class for ``name``; the error lists the valid names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown method {name!r}; available: {', '.join(available_methods())}"
        ) from None


def adapt(
    model: nn.Module,
    method: str = "dyn",
    *,
    validate: bool = True,
    compile: CompileOption = False,
    reference: torch.Tensor | None = None,
    **options: Any,
) -> Method:
    """Wrap ``model`` in the test-time adaptation method ``method``.

    Args:
        model: a classifier taking images (B, 3, H, W) in [0, 1]. It is copied, not modified.
        method: a name from :func:`available_methods` (default ``"dyn"``).
        validate: check that every batch is finite and in [0, 1] (one reduction per batch,
            see :func:`~dyntta.methods.base.check_values`); ``False`` skips it.
        compile: ``True`` (or a dict of ``torch.compile`` arguments) compiles the adapted
            network; backward-free methods only (the others raise ``ValueError``).
        reference: clean images (n, 3, H, W) in [0, 1] of the model's own domain, for the
            methods that read them (``dyn_adaptive``: n >= 32; a few thousand) and only those.
        **options: fields of the method's ``Config`` dataclass (e.g. ``alpha=0.8``).

    Returns:
        The method, called like the model: ``logits = adapted(x)``.
    """
    cls = method_class(method)
    config = config_from_options(cls.Config, options)
    if reference is None:
        return cls(model, config, validate=validate, compile=compile)
    if not cls.reads_reference:
        readers = [name for name in available_methods() if method_class(name).reads_reference]
        raise ValueError(f"method {method!r} reads no reference images (those that do: "
                         f"{', '.join(readers)})")
    return cls(model, config, validate=validate, compile=compile, reference=reference)
