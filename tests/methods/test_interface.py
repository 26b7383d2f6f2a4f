"""The method interface and the backward-free normalisation methods."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch
from torch import nn

import dyntta
from dyntta.methods import Method, method_class
from dyntta.methods.base import matches_hint
from dyntta.norm import ClusterAwareBatchNorm2d
from tests.conftest import random_images, tensor_state, tiny_resnet


def test_available_methods_lists_the_backward_free_family():
    assert {"source", "tbn", "alpha_bn", "dyn"} <= set(dyntta.available_methods())


def test_source_equals_the_model_in_eval_mode(tiny_model):
    x = random_images(8)
    torch.testing.assert_close(dyntta.adapt(tiny_model, "source")(x), tiny_model(x))


def test_adapt_copies_and_never_modifies_the_user_model(tiny_model):
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    adapted = dyntta.adapt(tiny_model, "dyn")
    adapted(random_images(8))
    for k, v in tiny_model.state_dict().items():
        assert torch.equal(v, before[k])
    assert sum(isinstance(m, ClusterAwareBatchNorm2d) for m in adapted.modules()) == sum(
        isinstance(m, nn.BatchNorm2d) for m in tiny_model.modules()
    )


def test_dyn_alpha_one_equals_source(tiny_model):
    x = random_images(8)
    torch.testing.assert_close(dyntta.adapt(tiny_model, "dyn", alpha=1.0)(x), tiny_model(x))


def test_tbn_equals_the_model_in_training_mode_without_touching_running_stats(tiny_model):
    x = random_images(8)
    reference = tiny_resnet()
    for m in reference.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.train()
            m.momentum = 0.0
    torch.testing.assert_close(dyntta.adapt(tiny_model, "tbn")(x), reference(x))


def test_alpha_bn_zero_is_tbn_and_one_is_source(tiny_model):
    x = random_images(8)
    tbn = dyntta.adapt(tiny_model, "tbn")(x)
    torch.testing.assert_close(dyntta.adapt(tiny_model, "alpha_bn", alpha=0.0)(x), tbn)
    torch.testing.assert_close(dyntta.adapt(tiny_model, "alpha_bn", alpha=1.0)(x), tiny_model(x))


@pytest.mark.parametrize("name", ["source", "tbn", "alpha_bn", "dyn"])
def test_backward_free_methods_are_deterministic_and_need_no_grad(name, tiny_model):
    adapted = dyntta.adapt(tiny_model, name)
    x = random_images(16)
    out = adapted(x)
    assert not out.requires_grad
    torch.testing.assert_close(adapted(x), out)
    assert all(not p.requires_grad for p in adapted.parameters())


def test_dyn_separates_a_mixed_batch_better_than_tbn():
    """On a batch mixing a clean and a shifted domain, DYN's output for the clean half moves less
    than TBN's when the shifted half joins it: the shifted samples form their own clusters."""
    model = tiny_resnet()
    x = random_images(16)
    x[8:] = (x[8:] * 0.2 + 0.7).clamp(0, 1)
    dyn = dyntta.adapt(model, "dyn", alpha=0.0)(x)[:8]
    dyn_alone = dyntta.adapt(model, "dyn", alpha=0.0)(x[:8])
    tbn = dyntta.adapt(model, "tbn")(x)[:8]
    tbn_alone = dyntta.adapt(model, "tbn")(x[:8])
    assert (dyn - dyn_alone).abs().max() < (tbn - tbn_alone).abs().max()


def test_reset_restores_the_exact_source_state(tiny_model):
    adapted = dyntta.adapt(tiny_model, "dyn")
    state = {k: v.clone() for k, v in tensor_state(adapted).items()}
    with torch.no_grad():
        for p in adapted.parameters():
            p.add_(1.0)
    adapted.reset()
    for k, v in tensor_state(adapted).items():
        assert torch.equal(v, state[k]), k


def test_unknown_method_lists_valid_names(tiny_model):
    with pytest.raises(ValueError, match="unknown method 'nope'; available: .*dyn"):
        dyntta.adapt(tiny_model, "nope")


def test_unknown_option_names_valid_fields(tiny_model):
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['beta'\].*valid: alpha"):
        dyntta.adapt(tiny_model, "dyn", beta=0.3)


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_alpha_out_of_range_is_an_error(bad, tiny_model):
    with pytest.raises(ValueError, match=r"alpha must lie in \[0, 1\]"):
        dyntta.adapt(tiny_model, "dyn", alpha=bad)


def test_nan_and_inf_inputs_are_errors(tiny_model):
    adapted = dyntta.adapt(tiny_model, "dyn")
    x = random_images(8)
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        adapted(x)
    x[0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        adapted(x)


@pytest.mark.parametrize("scale", [255.0, -1.0])
def test_images_outside_the_unit_interval_are_errors_that_say_so(scale, tiny_model):
    adapted = dyntta.adapt(tiny_model, "dyn")
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\].*divide 0-255 images by 255"):
        adapted(random_images(8) * scale)


def test_values_near_the_unit_interval_pass(tiny_model):
    x = random_images(8)
    x[0, 0, 0, :2] = torch.tensor([-0.49, 1.49])
    dyntta.adapt(tiny_model, "dyn")(x)
    x[0, 0, 0, 0] = -0.5
    with pytest.raises(ValueError, match=r"got values from -0.5 to 1.49"):
        dyntta.adapt(tiny_model, "dyn")(x)


def test_validate_false_skips_the_value_check_only(tiny_model):
    x = random_images(8) * 255
    adapted = dyntta.adapt(tiny_model, "dyn", validate=False)
    torch.testing.assert_close(adapted(x), dyntta.adapt(tiny_model, "dyn", validate=False)(x))
    with pytest.raises(ValueError, match="floating point"):
        adapted(x.to(torch.uint8))
    with pytest.raises(ValueError, match="validate must be True or False"):
        dyntta.adapt(tiny_model, "dyn", validate="no")


def test_float64_input_is_refused_naming_both_dtypes(tiny_model):
    with pytest.raises(ValueError, match=r"input is torch.float64 but the model computes in "
                       r"torch.float32: convert the batch first \(e.g. x.to\(torch.float32\)\)"):
        dyntta.adapt(tiny_model, "tbn")(random_images(4).double())
    double = dyntta.adapt(tiny_model.double(), "tbn")
    assert double(random_images(4).double()).dtype == torch.float64


@pytest.mark.parametrize(
    "bad, message",
    [(torch.rand(3, 8, 8), r"\(B, C, H, W\)"), (torch.rand(2, 3, 0, 4), "no empty dimension"),
     (torch.zeros(2, 3, 4, 4, dtype=torch.uint8),
     "floating point"), ([[0.0]], "torch.Tensor")],
)
def test_malformed_inputs_are_errors(bad, message, tiny_model):
    with pytest.raises(ValueError, match=message):
        dyntta.adapt(tiny_model, "tbn")(bad)


def test_model_without_batchnorm2d_is_an_error():
    with pytest.raises(ValueError, match="no nn.BatchNorm2d"):
        dyntta.adapt(nn.Sequential(nn.Conv2d(3, 2, 3), nn.Flatten()), "dyn")


def test_non_module_model_is_an_error():
    with pytest.raises(ValueError, match="torch.nn.Module"):
        dyntta.adapt(lambda x: x, "dyn")


def test_config_of_the_wrong_type_is_an_error(tiny_model):
    with pytest.raises(ValueError, match="must be a DYNConfig"):
        method_class("dyn")(tiny_model, config=method_class("alpha_bn").Config())


def test_registry_rejects_nameless_and_duplicate_methods():
    from dyntta.methods.registry import register

    class Nameless(Method):
        pass

    with pytest.raises(ValueError, match="non-empty class attribute 'name'"):
        register(Nameless)

    class Impostor(Method):
        name = "dyn"

    with pytest.raises(ValueError, match="already registered"):
        register(Impostor)


def test_adapting_an_adapted_model_says_so(tiny_model):
    with pytest.raises(ValueError, match="the model is already adapted \\(by 'dyn'\\); pass the "
                       "original model"):
        dyntta.adapt(dyntta.adapt(tiny_model, "dyn"), "tbn")


@pytest.mark.parametrize("method, options, words", [
    ("dyn", {"alpha": "0.5"}, "option 'alpha' of DYNConfig must be a number, got '0.5' (str)"),
    ("dyn", {"alpha": True}, "option 'alpha' of DYNConfig must be a number, got True (bool)"),
    ("dyn", {"mix": "Var"}, "option 'mix' of DYNConfig must be one of 'var', 'std'"),
    ("dyn", {"unbiased": 1}, "option 'unbiased' of DYNConfig must be true or false, got 1"),
    ("note", {"memory_size": 2.5}, "option 'memory_size' of NOTEConfig must be an integer"),
    ("sar", {"frozen": "layer4"}, "option 'frozen' of SARConfig must be a list (each a string)"),
    ("sar", {"frozen": ["layer4", 4]}, "option 'frozen' of SARConfig must be a list"),
])
def test_option_values_of_the_wrong_type_name_the_expected_type(method, options, words,
                                                                tiny_model):
    with pytest.raises(ValueError) as info:
        dyntta.adapt(tiny_model, method, **options)
    assert words in str(info.value)


def test_options_of_the_right_type_pass_ints_for_floats_and_lists_for_tuples(tiny_model):
    assert dyntta.adapt(tiny_model, "dyn", alpha=1).config.alpha == 1
    assert dyntta.adapt(tiny_model, "sar", frozen=["layer4"]).config.frozen == ["layer4"]


@pytest.mark.parametrize("name", dyntta.available_methods())
def test_every_default_fits_its_own_type_hint(name):
    """The check reads the hints: a hint it cannot read would refuse valid options."""
    config = method_class(name).Config
    hints = typing.get_type_hints(config)
    for field in dataclasses.fields(config):
        assert matches_hint(getattr(config(), field.name), hints[field.name]), field.name


class TupleModel(nn.Module):
    """Returns (logits, features), as some classifiers do."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = tiny_resnet()

    def forward(self, x):
        logits = self.inner(x)
        return logits, logits


@pytest.mark.parametrize("name", ["tent", "dyn", "rotta"])
def test_a_model_that_returns_a_tuple_is_named_not_a_traceback(name):
    adapted = dyntta.adapt(TupleModel(), name)
    with pytest.raises(ValueError, match="must return logits, a \\(B, K\\) tensor, but returned "
                                         "tuple"):
        adapted(random_images(8))
