"""Argument types for the ``dyntta`` command: a bad value is an argparse error naming the option
(``argument --seeds: expected an integer >= 0, got '-1'``) instead of a failure deep in a run."""

from __future__ import annotations

import argparse


def _integer(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts: epochs, workers, batch sizes)."""
    return _integer(text, 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds)."""
    return _integer(text, 0)


def positive_float(text: str) -> float:
    """A finite number > 0 (learning rates)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def device(text: str) -> str:
    """A torch device that exists here: ``cpu``, ``cuda``/``cuda:N`` with a visible GPU, ``mps``
    on Apple silicon."""
    import torch

    try:
        dev = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(
            f"unknown device {text!r}; expected cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(
                f"{text!r}: CUDA is not available here (torch {torch.__version__}, "
                "no CUDA build or no GPU visible); use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: only {count} CUDA device(s) visible")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise argparse.ArgumentTypeError(f"{text!r}: MPS is not available here; use --device cpu")
    elif dev.type != "cpu":
        raise argparse.ArgumentTypeError(f"unsupported device {text!r}; expected cpu, cuda, cuda:N or mps")
    return text


def path(text: str) -> str:
    """A file or folder path with ``~`` expanded, also where the shell leaves it
    (``--out=~/runs``, a quoted ``"~/runs"``): never a folder named ``~``."""
    import os

    return os.path.expanduser(text)
