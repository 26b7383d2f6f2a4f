"""Methods read logits: a model whose first batch of outputs looks like probabilities
(non-negative, rows summing to 1) is warned about once, a model of logits is not."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import dyntta
from dyntta.methods.base import warn_if_probabilities
from tests.conftest import random_images, tiny_resnet


@pytest.mark.parametrize("name", ["source", "tbn", "dyn", "tent"])
def test_a_softmax_model_is_warned_about_on_its_first_batch_only(name):
    method = dyntta.adapt(nn.Sequential(tiny_resnet(), nn.Softmax(dim=1)), name)
    with pytest.warns(UserWarning, match="expect logits") as caught:
        method(random_images(8, seed=0))
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        method(random_images(8, seed=1))


def test_logits_are_not_warned_about():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dyntta.adapt(tiny_resnet(), "tbn")(random_images(8))


@pytest.mark.parametrize("outputs, warned", [
    (torch.tensor([[0.2, 0.8], [0.5, 0.5]]), True),
    (torch.tensor([[0.2, 0.8], [0.5, 0.6]]), False),    # a row does not sum to 1
    (torch.tensor([[1.2, -0.2], [0.5, 0.5]]), False),   # negative: logits
    (torch.tensor([[1.0], [1.0]]), False),              # one class: nothing to tell
    (torch.log_softmax(torch.randn(4, 3), 1), False),   # log-probabilities serve as logits
])
def test_what_counts_as_probabilities(outputs, warned):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_if_probabilities(outputs)
    assert len(caught) == int(warned)
