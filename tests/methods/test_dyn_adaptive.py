"""dyn_adaptive: the DYN successor composed from the cluster-aware layer's options."""

from __future__ import annotations

from copy import deepcopy

import pytest
import torch

import dyntta
from dyntta.norm import ClusterAwareBatchNorm2d
from dyntta.norm.mixing import label_balance_weight
from tests.conftest import random_images, tiny_resnet


def cabn_layers(method):
    return [m for m in method.modules() if isinstance(m, ClusterAwareBatchNorm2d)]


def test_with_dyns_options_it_is_dyn_bit_for_bit():
    model, x = tiny_resnet(), random_images(16, seed=2)
    same = dyntta.adapt(model, "dyn_adaptive", source_weight="fixed", cluster_fraction=1.0,
                        instance_k=None, window=0, neighbours=0, fused=False)
    with torch.no_grad():
        assert torch.equal(same(x), dyntta.adapt(model, "dyn")(x))


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.5, 1.0])
def test_cluster_fraction_clusters_the_first_layers_only(fraction):
    layers = cabn_layers(dyntta.adapt(tiny_resnet(), "dyn_adaptive", cluster_fraction=fraction,
                                      deep_match=None if fraction == 0.0 else 0.1))
    n = round(fraction * len(layers))
    assert [layer.cluster for layer in layers] == [True] * n + [False] * (len(layers) - n)


@pytest.mark.parametrize("deep, expected", [("same", "size"), ("fixed", "fixed"),
                                            ("shift", "shift"), ("labels", "set")])
def test_layers_that_do_not_cluster_use_the_deep_source_weight(deep, expected):
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", source_weight="size",
                          cluster_fraction=0.5, deep_source_weight=deep)
    weights = [(layer.cluster, layer.source_weight) for layer in cabn_layers(method)]
    assert {w for c, w in weights if c} == {"size"}
    assert {w for c, w in weights if not c} == {expected}


@pytest.mark.parametrize("fraction", [1.0, 0.5, 0.25, 0.0])
def test_instance_fraction_picks_the_first_layers_for_the_instance_rule(fraction):
    n = len(cabn_layers(dyntta.adapt(tiny_resnet(), "dyn_adaptive")))
    first = round(fraction * n)
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", cluster_fraction=0.5, instance_k=3.0,
                          instance_spread=2.0, instance_fraction=fraction)
    rules = [(layer.instance_k, layer.instance_spread) for layer in cabn_layers(method)]
    assert rules == [(3.0, 2.0)] * first + [(None, None)] * (n - first)


@pytest.mark.parametrize("deep_window, expected", [(None, 6), (0, 0), (20, 20)])
def test_deep_window_sets_the_window_of_the_layers_that_do_not_cluster(deep_window, expected):
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", cluster_fraction=0.5, window=6,
                          shallow_window=None, deep_window=deep_window)
    windows = {(layer.cluster, layer.window) for layer in cabn_layers(method)}
    assert windows == {(True, 6), (False, expected)}
    x = random_images(4, seed=3)
    with torch.no_grad():
        for _ in range(8):
            method(x)
    kept = {(layer.cluster, 0 if layer.window_mean is None else layer.window_mean.shape[0])
            for layer in cabn_layers(method)}
    assert kept == {(True, 6), (False, expected)}


@pytest.mark.parametrize("shallow_window, expected", [(None, 6), (0, 0), (10, 10)])
def test_shallow_window_sets_the_window_of_the_layers_that_cluster(shallow_window, expected):
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", cluster_fraction=0.5, window=6,
                          deep_window=20, shallow_window=shallow_window)
    assert {(layer.cluster, layer.window) for layer in cabn_layers(method)} == {
        (True, expected), (False, 20)}
    with torch.no_grad():
        for seed in range(8):
            method(random_images(4, seed=seed))
    kept = {(layer.cluster, 0 if layer.window_mean is None else layer.window_mean.shape[0])
            for layer in cabn_layers(method)}
    assert kept == {(True, expected), (False, 20)}
    # the labels rule reads the last `window` predictions, and the match keeps a pool of `window`
    assert method._recent.shape[0] == 6 and method._signature.pool == 6


def test_window_state_is_cleared_by_reset():
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", window=6, shallow_window=None,
                          deep_window=None)
    stream = [random_images(b, seed=b) for b in (1, 3, 4)]
    first = [method(x) for x in stream]
    assert all(layer.window_mean.shape[0] == 6 for layer in cabn_layers(method))
    method.reset()
    assert all(layer.window_mean is None for layer in cabn_layers(method))
    for before, x in zip(first, stream):
        assert torch.equal(before, method(x))


def test_window_lets_one_sample_batches_use_past_samples():
    model = tiny_resnet()
    x = random_images(5, seed=4)
    windowed = dyntta.adapt(model, "dyn_adaptive", window=8)
    plain = dyntta.adapt(model, "dyn_adaptive")
    for i in range(4):
        windowed(x[i : i + 1])
    assert not torch.allclose(windowed(x[4:]), plain(x[4:]))


@pytest.mark.parametrize(
    "option", [{"cluster_fraction": 1.5}, {"instance_k": -1.0}, {"window": -1},
               {"source_weight": "both"}, {"merge_levels": -1},
               {"deep_source_weight": "deep"}, {"instance_fraction": 1.5}, {"neighbours": -1},
               {"deep_window": -1}, {"deep_balance": 0}, {"balanced_alpha": 1.5},
               {"balance_power": -1.0}, {"shallow_window": -1},
               {"deep_match_reference": "window"}, {"spread_per": "sample"},
               {"instance_around": "source"}]
)
def test_bad_options_are_named(option):
    with pytest.raises(ValueError, match=next(iter(option))):
        dyntta.adapt(tiny_resnet(), "dyn_adaptive", **option)


def test_neighbourhoods_replace_clusters_in_the_clustering_layers_only():
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", cluster_fraction=0.5, neighbours=5)
    assert {(layer.cluster, layer.neighbours) for layer in cabn_layers(method)} == {
        (True, 5), (False, 0)}
    with torch.no_grad():
        method(random_images(12, seed=1))
    assert all(layer.last_labels is None for layer in cabn_layers(method) if layer.cluster)


def test_deep_match_links_the_last_clustering_layer_to_the_deep_ones():
    for balance in (None, 32):
        method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", cluster_fraction=0.5,
                              deep_window=20, deep_match=0.1, deep_balance=balance)
        for adapted in (method, deepcopy(method)):
            layers = cabn_layers(adapted)
            n = sum(layer.cluster for layer in layers)
            match = layers[n - 1].signature
            assert match is not None and match.memory == 20 and match.pool == 64
            assert [layer.signature is match for layer in layers] == [i == n - 1 for i in
                                                                       range(len(layers))]
            deep = layers[-1].match if balance else match  # the balance asks the match first
            assert balance is None or (deep.within is match and deep.per_class == balance)
            assert [layer.match is deep for layer in layers] == [not layer.cluster for layer in
                                                                 layers]


@pytest.mark.parametrize("reference", ["pool", "batch"])
def test_deep_match_reference_reaches_the_filter(reference):
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", deep_match_reference=reference)
    assert method._signature.reference == reference


def test_deep_match_keeps_a_window_that_repeats_the_batch():
    model, x = tiny_resnet(), random_images(6, seed=5)
    options = {"cluster_fraction": 0.5, "window": 8, "deep_window": 24}
    matched = dyntta.adapt(model, "dyn_adaptive", deep_match=0.0, **options)
    plain = dyntta.adapt(model, "dyn_adaptive", **options)
    with torch.no_grad():
        for _ in range(5):  # every remembered sample is a copy of a batch member: all stay
            assert torch.equal(matched(x), plain(x))


def test_deep_match_needs_a_clustering_layer():
    with pytest.raises(ValueError, match="deep_match"):
        dyntta.adapt(tiny_resnet(), "dyn_adaptive", cluster_fraction=0.0, deep_match=0.1)
    with pytest.raises(ValueError, match="deep_match"):
        dyntta.adapt(tiny_resnet(), "dyn_adaptive", deep_match=1.5)


def test_deep_balance_records_the_predictions_and_keeps_every_class_it_can():
    model, x = tiny_resnet(), random_images(12, seed=4)
    # a fixed deep weight: with the label rule, one predicted class gives the source all of it
    options = {"cluster_fraction": 0.5, "window": 4, "deep_window": 12,
               "deep_source_weight": "fixed"}
    balanced = dyntta.adapt(model, "dyn_adaptive", deep_balance=100, **options)
    plain = dyntta.adapt(model, "dyn_adaptive", **options)
    filters = {id(layer.match) for layer in cabn_layers(balanced) if not layer.cluster}
    assert len(filters) == 1 and None not in filters
    balance = next(layer.match for layer in cabn_layers(balanced) if not layer.cluster)
    with torch.no_grad():
        for i in range(0, 12, 3):  # at most 100 per class: every remembered sample stays
            logits = balanced(x[i : i + 3])
            assert torch.equal(logits, plain(x[i : i + 3]))
        assert torch.equal(balance.classes[-3:], logits.argmax(1))
        balanced.reset()
        assert balance.classes is None
        one = dyntta.adapt(model, "dyn_adaptive", deep_balance=1, **options)
        for i in range(0, 12, 3):
            one(x[i : i + 3])
        assert not torch.allclose(one(x[:3]), plain(x[:3]))


def test_labels_rule_sets_the_deep_weight_from_the_last_window_predictions():
    model, x = tiny_resnet(), random_images(12, seed=6)
    method = dyntta.adapt(model, "dyn_adaptive", cluster_fraction=0.5, window=5,
                          deep_source_weight="labels", balanced_alpha=0.2, balance_power=1.0)
    deep = [layer for layer in cabn_layers(method) if not layer.cluster]
    assert deep and all(float(layer.set_weight) == pytest.approx(0.8) for layer in deep)  # alpha at first
    assert not any(hasattr(layer, "set_weight") for layer in cabn_layers(method) if layer.cluster)
    seen = []
    with torch.no_grad():
        for i in range(0, 12, 3):
            seen.append(method(x[i : i + 3]).argmax(1))
            expected = label_balance_weight(torch.cat(seen)[-5:], 3, 0.2, 1.0)
            for layer in deep:
                assert float(layer.set_weight) == pytest.approx(expected, abs=1e-6)
    method.reset()
    assert all(float(layer.set_weight) == pytest.approx(0.8) for layer in deep)


def test_labels_rule_at_power_zero_is_the_fixed_weight():
    model, x = tiny_resnet(), random_images(12, seed=7)
    options = {"cluster_fraction": 0.5, "window": 4, "alpha": 0.7}
    labels = dyntta.adapt(model, "dyn_adaptive", deep_source_weight="labels",
                          balanced_alpha=0.7, balance_power=0.0, **options)
    fixed = dyntta.adapt(model, "dyn_adaptive", deep_source_weight="fixed", **options)
    with torch.no_grad():
        for i in range(0, 12, 3):
            torch.testing.assert_close(labels(x[i : i + 3]), fixed(x[i : i + 3]))


def test_labels_rule_needs_the_window_it_reads():
    options = {"window": 0, "deep_match": None, "deep_source_weight": "labels"}
    with pytest.raises(ValueError, match="window"):
        dyntta.adapt(tiny_resnet(), "dyn_adaptive", **options)
    dyntta.adapt(tiny_resnet(), "dyn_adaptive", cluster_fraction=1.0, **options)


def test_compiled_network_reads_the_weight_the_labels_rule_sets():
    torch._dynamo.reset()
    model, options = tiny_resnet(), {"balanced_alpha": 0.0, "balance_power": 1.0, "window": 6}
    eager = dyntta.adapt(model, "dyn_adaptive", **options)
    compiled = dyntta.adapt(model, "dyn_adaptive", compile={"backend": "eager"}, **options)
    deep = next(layer for layer in cabn_layers(compiled) if not layer.cluster)
    weights = []
    with torch.no_grad():
        for i, b in enumerate([6, 4, 6, 5]):
            x = random_images(b, seed=10 + i)
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
            weights.append(float(deep.set_weight))
    torch._dynamo.reset()
    assert len({round(w, 6) for w in [0.8, *weights]}) > 1  # the weight did move
