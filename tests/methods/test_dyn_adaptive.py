"""dyn_adaptive: its layers' roles in the order they run, its windows and filters, and the deep
layers' source weight, against direct readings of each rule."""

from __future__ import annotations

import math
from copy import deepcopy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import dyntta
from dyntta.methods.dyn_adaptive import FIRST_WEIGHT
from dyntta.norm import AlphaBatchNorm2d, ClassBalance, WindowMatch
from dyntta.norm.adaptive import NeighbourhoodNorm2d, PooledNorm2d, WindowedNorm2d
from dyntta.norm.mixing import label_balance_weight
from dyntta.norm.spectrum import domain_shift, log_band_power
from tests.conftest import random_images, tiny_resnet
from tests.norm.bn_helpers import random_bn
from tests.norm.test_spectrum import blurred, noisy, smooth_images

DEPTH = 4


class Chain(nn.Module):
    """conv - BN - ReLU blocks run as conv0, bn0, conv1, bn1, ..., their modules registered in
    the order ``registration`` gives; conv i has stride ``strides[i]``."""

    def __init__(self, registration=range(DEPTH), strides=(1, 1, 2, 1)) -> None:
        super().__init__()
        torch.manual_seed(0)
        blocks = {i: (nn.Conv2d(3 if i == 0 else 6, 6, 3, stride=strides[i], padding=1),
                      random_bn(6, seed=i)) for i in range(DEPTH)}
        for i in registration:
            self.add_module(f"conv{i}", blocks[i][0])
            self.add_module(f"bn{i}", blocks[i][1])
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        for i in range(DEPTH):
            x = F.relu(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)))
        return self.head(x.mean((2, 3)))


def chains():
    ordered = Chain()
    shuffled = Chain(registration=[2, 0, 3, 1])
    shuffled.load_state_dict(ordered.state_dict())
    return ordered, shuffled


def layers(method) -> list[WindowedNorm2d]:
    return [m for m in method.modules() if isinstance(m, WindowedNorm2d)]


def roles(method) -> dict[str, tuple[str, bool]]:
    """Per BN layer name: its kind and whether it applies the instance rule."""
    return {name.rpartition(".")[2]: (type(m).__name__, m.instance is not None)
            for name, m in method.named_modules() if isinstance(m, WindowedNorm2d)}


def test_a_model_registered_out_of_order_gives_the_outputs_of_the_ordered_one():
    ordered, shuffled = chains()
    assert [n for n, _ in shuffled.named_children()][:2] == ["conv2", "bn2"]
    a, b = dyntta.adapt(ordered, "dyn_adaptive"), dyntta.adapt(shuffled, "dyn_adaptive")
    with torch.no_grad():
        for i, size in enumerate([8, 3, 8, 5]):
            x = random_images(size, seed=i)
            assert torch.equal(a(x), b(x))
    assert roles(a) == roles(b)


def test_roles_follow_the_order_the_layers_run():
    _, shuffled = chains()
    method = dyntta.adapt(shuffled, "dyn_adaptive")
    assert roles(method) == {}  # decided by the first batch
    with torch.no_grad():
        method(random_images(4))
    n = "NeighbourhoodNorm2d"
    assert roles(method) == {"bn0": (n, True), "bn1": (n, True), "bn2": ("PooledNorm2d", False),
                             "bn3": ("PooledNorm2d", False)}
    assert method.roles == (["bn0", "bn1", "bn2", "bn3"], [64, 64, 16, 16])


def test_roles_without_map_sizes_are_refused():
    method = dyntta.adapt(Chain(), "dyn_adaptive")
    with pytest.raises(ValueError, match="older version: its roles hold no map sizes"):
        method.roles = (["bn0", "bn1", "bn2", "bn3"], 4)


@pytest.mark.parametrize("strides", [(1, 1, 1, 1), (1, 2, 1, 1), (1, 1, 1, 2), (2, 1, 2, 1),
                                     (1, 2, 2, 2)])
def test_roles_follow_the_map_sizes(strides):
    """Every layer at the smallest map size pools, except the first; every layer at the
    largest applies the instance rule."""
    method = dyntta.adapt(Chain([3, 1, 0, 2], strides), "dyn_adaptive")
    with torch.no_grad():
        method(random_images(4, size=8))
    sizes, side = [], 8
    for stride in strides:  # a 3 x 3 convolution with padding 1
        side = (side - 1) // stride + 1
        sizes.append(side * side)
    got = roles(method)
    for i in range(DEPTH):
        kind, rule = got[f"bn{i}"]
        pooled = i > 0 and sizes[i] == min(sizes)
        assert kind == ("PooledNorm2d" if pooled else "NeighbourhoodNorm2d")
        assert rule == (sizes[i] == max(sizes))


class TwoViews(nn.Module):
    """One network run on the images and on their mirror images, logits summed: every BN layer
    runs twice per forward."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x) + self.net(x.flip(3))


class TwoNetworks(nn.Module):
    """:class:`TwoViews` with a copy of the network for the mirror images: each BN layer once."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.first, self.second = net, deepcopy(net)

    def forward(self, x):
        return self.first(x) + self.second(x.flip(3))


def test_a_layer_run_twice_per_forward_gets_a_layer_per_call():
    """The same as two copies of the network, one per call: each call its role and window."""
    net = Chain()
    shared = dyntta.adapt(TwoViews(net), "dyn_adaptive", window=8, shallow_window=16,
                          deep_window=24)
    copies = dyntta.adapt(TwoNetworks(net), "dyn_adaptive", window=8, shallow_window=16,
                          deep_window=24)
    with torch.no_grad():
        for seed in range(8):  # windows fill, the deep filter and class balance act
            x = random_images(4, seed=seed, size=8)
            assert torch.equal(shared(x), copies(x))
    per_call = shared.model.net.bn0
    assert [type(m) for m in per_call.layers] == [NeighbourhoodNorm2d] * 2
    first, second = copies.model.first.bn0, copies.model.second.bn0
    for mine, theirs in zip(per_call.layers, (first, second)):
        assert torch.equal(mine.window_mean, theirs.window_mean)
    assert not torch.equal(per_call.layers[0].window_mean, per_call.layers[1].window_mean)
    assert [type(m).__name__ for m in shared.model.net.bn3.layers] == ["PooledNorm2d"] * 2


def test_a_layer_run_twice_compiles_to_one_graph_that_matches_eager():
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    options = dict(window=8, shallow_window=16, deep_window=24)
    eager = dyntta.adapt(TwoViews(Chain()), "dyn_adaptive", **options)
    compiled = dyntta.adapt(TwoViews(Chain()), "dyn_adaptive", compile={"backend": backend},
                            **options)
    with torch.no_grad():
        for seed in range(12):
            x = random_images(4, seed=seed, size=8)
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
    assert compiled.windows_steady(4) and len(graphs) == 1
    torch._dynamo.reset()


def test_a_layer_run_more_often_than_on_the_first_batch_is_one_error_line():
    class Repeated(nn.Module):  # the BN layer runs B // 2 times
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 3, 1), random_bn(3)

        def forward(self, x):
            for _ in range(x.shape[0] // 2):
                x = self.bn(self.conv(x))
            return x.mean((2, 3))

    method = dyntta.adapt(Repeated(), "dyn_adaptive")
    with torch.no_grad():
        method(random_images(4))
        method(random_images(2))  # fewer calls: the second layer waits
        with pytest.raises(ValueError, match="ran 3 times in one forward; the first batch ran "
                                             "it 2 times"):
            method(random_images(6))


def test_a_layer_run_once_on_the_first_batch_and_twice_later_is_one_error_line():
    class Doubled(nn.Module):  # the BN layer runs twice on a batch of more than 4
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 3, 1), random_bn(3)

        def forward(self, x):
            x = self.bn(self.conv(x))
            return (self.bn(x) if x.shape[0] > 4 else x).mean((2, 3))

    method = dyntta.adapt(Doubled(), "dyn_adaptive")
    with torch.no_grad():
        method(random_images(4))
        method(random_images(3))
        with pytest.raises(ValueError, match="ran more than once in one forward; the first "
                                             "batch ran it once"):
            method(random_images(6))


def test_a_layer_run_twice_keeps_its_layers_through_saved_state():
    method = dyntta.adapt(TwoViews(Chain()), "dyn_adaptive", window=8, shallow_window=16)
    fresh = dyntta.adapt(TwoViews(Chain()), "dyn_adaptive", window=8, shallow_window=16)
    with torch.no_grad():
        for seed in range(4):
            method(random_images(4, seed=seed, size=8))
        fresh.load_state_dict(method.state_dict())
        for seed in range(4, 8):
            x = random_images(4, seed=seed, size=8)
            assert torch.equal(fresh(x), method(x))


def test_a_layer_that_never_runs_changes_nothing():
    ordered, _ = chains()
    unused = deepcopy(ordered)
    unused.spare1, unused.spare2 = random_bn(6, seed=8), random_bn(6, seed=9)  # never called
    a, b = dyntta.adapt(ordered, "dyn_adaptive"), dyntta.adapt(unused, "dyn_adaptive")
    with torch.no_grad():
        for i, size in enumerate([8, 3, 8]):
            x = random_images(size, seed=i)
            assert torch.equal(a(x), b(x))


def test_the_layers_are_those_of_the_config():
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", neighbours=5, prior_strength=4.0,
                          instance_k=3.0, instance_spread=1.5, shallow_window=40,
                          deep_window=24, window=8, deep_match=0.2, deep_balance=6)
    with torch.no_grad():
        method(random_images(4))
    shallow = [m for m in layers(method) if isinstance(m, NeighbourhoodNorm2d)]
    deep = [m for m in layers(method) if isinstance(m, PooledNorm2d)]
    assert shallow and deep
    assert {(m.window, m.neighbours, m.prior_strength) for m in shallow} == {(40, 5, 4.0)}
    assert {m.instance for m in layers(method)} == {(3.0, 1.5), None}
    for adapted in (method, deepcopy(method)):
        match = adapted._match
        balance = adapted._balance
        assert isinstance(match, WindowMatch) and isinstance(balance, ClassBalance)
        # the signatures of the last max(deep_window, shallow_window, 32) images
        assert (match.memory, match.pool, match.quantile) == (40, 8, 0.2)
        assert (balance.memory, balance.per_class, balance.within) == (24, 6, match)
        pooled = [m for m in layers(adapted) if isinstance(m, PooledNorm2d)]
        # one set of filter weights for every pooling layer, computed once per batch
        assert all(m.window == 24 and m.pool_weight is pooled[0].pool_weight for m in pooled)


class WithUnusedHead(nn.Module):
    """``tiny_resnet`` beside a BN layer its forward never runs (as an auxiliary head)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_resnet()
        self.aux = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_bn_layer_that_never_runs_does_not_keep_the_compiled_method_eager():
    """Its window never fills; the windows of the layers that run decide when the graph
    compiles."""
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    model = WithUnusedHead().eval()
    options = dict(window=8, shallow_window=16, deep_window=32)
    eager = dyntta.adapt(model, "dyn_adaptive", **options)
    compiled = dyntta.adapt(model, "dyn_adaptive", compile={"backend": backend}, **options)
    with torch.no_grad():
        for i in range(12):
            x = random_images(4, seed=i)
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
    assert compiled.model.aux.window_mean is None  # it never ran
    assert compiled.windows_steady(4) and len(graphs) == 1
    torch._dynamo.reset()


def test_windows_fill_to_their_sizes_and_reset_empties_them():
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", shallow_window=10, deep_window=20,
                          window=6)
    stream = [random_images(4, seed=seed) for seed in range(8)]
    with torch.no_grad():
        first = [method(x) for x in stream]
    kept = {(type(m).__name__, m.window_mean.shape[0]) for m in layers(method)}
    assert kept == {("NeighbourhoodNorm2d", 10), ("PooledNorm2d", 20)}
    assert method._recent.shape[0] == 6
    method.reset()
    assert all(m.window_mean is None for m in layers(method))
    with torch.no_grad():
        for before, x in zip(first, stream):
            assert torch.equal(before, method(x))


def test_without_windows_or_instance_rule_every_group_the_batch_is_alpha_bn():
    """Neighbourhoods of the whole batch, the source at N / (N + B), and pools of the batch,
    the source at a fixed deep weight of the same value (from the second batch on)."""
    model, x = tiny_resnet(), random_images(6, seed=3)
    # an infinitely wide band: the instance rule keeps no instance statistic
    method = dyntta.adapt(model, "dyn_adaptive", instance_k=float("inf"), shallow_window=0,
                          deep_window=0, neighbours=64, prior_strength=3.0,
                          balanced_alpha=3.0 / 9.0, balance_power=0.0)
    with torch.no_grad():
        method(random_images(6, seed=4))  # the deep weight is DYN's until the first prediction
    assert {type(m) for m in layers(method)} == {NeighbourhoodNorm2d, PooledNorm2d}
    # alpha-BN with unbiased instance variances: rescale the running variance it mixes
    reference = deepcopy(model)
    for name, bn in list(reference.named_modules()):
        if isinstance(bn, nn.BatchNorm2d):
            parent, _, attribute = name.rpartition(".")
            setattr(reference.get_submodule(parent), attribute, UnbiasedAlphaBN(bn, 3.0 / 9.0))
    with torch.no_grad():
        torch.testing.assert_close(method(x), reference(x), rtol=1e-5, atol=1e-5)


class UnbiasedAlphaBN(AlphaBatchNorm2d):
    """alpha-BN whose batch variance averages unbiased instance variances (as the layers do)."""

    def statistics(self, x):
        mu, s2 = x.mean((2, 3)), x.var((2, 3))
        mean = mu.mean(0)
        var = s2.mean(0) + (mu - mean).square().mean(0)
        return self.alpha * self.running_mean + (1 - self.alpha) * mean, \
            self.alpha * self.running_var + (1 - self.alpha) * var


def test_deep_weight_follows_the_last_window_predictions():
    model, x = tiny_resnet(), random_images(12, seed=6)
    method = dyntta.adapt(model, "dyn_adaptive", window=5, balanced_alpha=0.2,
                          balance_power=1.0)
    assert FIRST_WEIGHT == 0.8
    assert float(method.deep_source_weight) == pytest.approx(FIRST_WEIGHT)
    seen = []
    with torch.no_grad():
        for i in range(0, 12, 3):
            before = float(method.deep_source_weight)
            seen.append(method(x[i : i + 3]).argmax(1))
            deep = [m for m in layers(method) if isinstance(m, PooledNorm2d)]
            # this batch ran at the weight of the predictions before it
            assert deep and all(float(m.source_weight) == before for m in deep)
            expected = label_balance_weight(torch.cat(seen)[-5:], 3, 0.2, 1.0)
            assert float(method.deep_source_weight) == pytest.approx(expected, abs=1e-6)
    assert "deep_source_weight" in method.state_dict()
    method.reset()
    assert float(method.deep_source_weight) == pytest.approx(0.8)


def test_compiled_network_reads_the_deep_weight_the_method_sets():
    torch._dynamo.reset()
    model, options = tiny_resnet(), {"balanced_alpha": 0.0, "balance_power": 1.0, "window": 6}
    eager = dyntta.adapt(model, "dyn_adaptive", **options)
    compiled = dyntta.adapt(model, "dyn_adaptive", compile={"backend": "eager"}, **options)
    weights = []
    with torch.no_grad():
        for i, b in enumerate([6, 4, 6, 5]):
            x = random_images(b, seed=10 + i)
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
            weights.append(float(compiled.deep_source_weight))
    torch._dynamo.reset()
    assert len({round(w, 6) for w in [0.8, *weights]}) > 1  # the weight did move


def one_domain_then_mixture(b: int) -> list[torch.Tensor]:
    base = smooth_images(2 * b, seed=7)
    noise, blur = noisy(base, seed=8), blurred(base)
    return [noise[:b], torch.cat([noise[b : b + b // 2], blur[b + b // 2 :]])]


def test_neighbourhood_layers_pool_the_last_images_only_when_they_are_one_domain():
    """The spectral test reads the batch topped up to 32 images with the images before it, and
    a batch of 16 to 31 alone at the stricter threshold of fewer images; every windowed layer
    (the pooling layers too, which then apply no instance rule) is told."""
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive")
    base = smooth_images(176, seed=7)
    noise, blur = noisy(base, seed=8), blurred(base)
    mixture = torch.cat([blur[120:136], noise[104:120]])
    batches = [noise[:16], noise[16:32], blur[32:48], blur[48:64], noise[64:104], mixture,
               blur[136:160], torch.cat([blur[160:168], noise[168:176]])]
    # 16 noisy alone (spread 0.22); then 32 of one domain; 16 of each, the blurred batch alone
    # (0.66); 32 blurred; a batch of 40; a mixture of 32; 24 blurred after 16 noisy (the last 32
    # mix, the batch alone 0.65); 16 that mix
    for x, expected in zip(batches, [16, 32, 16, 32, 40, 0, 24, 0], strict=True):
        with torch.no_grad():
            method(x)
        kinds = {type(m) for m in layers(method)}
        assert kinds == {NeighbourhoodNorm2d, PooledNorm2d}
        assert [int(m.domain_rows) for m in layers(method)] == [expected] * len(layers(method))
    # one memory of the images' signatures (the last 512, deep_window) for the test and the
    # deep layers' filter
    torch.testing.assert_close(method._match.current, log_band_power(torch.cat(batches)))
    method.reset()
    assert method._match.current is None


def group(n: int, mean: float, seed: int) -> torch.Tensor:
    """(n, 12) signatures whose every entry has sample mean ``mean`` and standard deviation 0.3
    across the n rows."""
    x = torch.randn(n, 12, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (x - x.mean(0)) / x.std(0) * 0.3 + mean


@pytest.mark.parametrize("batch", [16, 4])
@pytest.mark.parametrize(("shift", "joined"), [(0.0, True), (3.9, True), (4.1, False)])
def test_the_images_before_a_batch_join_it_only_where_their_spectra_do_not_lie_apart(
        batch, shift, joined):
    """Batch and earlier images each spread by 0.3 nats, the 32 together by well under 1.2;
    their mean signatures lie ``shift`` squared standard errors apart (the two-sample reading
    of :func:`~dyntta.norm.spectrum.domain_shift`). Under 4 the 32 are one group; over it a
    batch of 16 is judged alone (0.3 < 0.8 nats) and one of 4, too few to judge, is not."""
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive")
    offset = 0.3 * math.sqrt(shift * (1 / batch + 1 / (32 - batch)))
    method._match.current = torch.cat([group(100, 2.0, seed=1), group(32 - batch, 3.0, seed=2),
                                       group(batch, 3.0 + offset, seed=3)])
    assert float(domain_shift(method._match.current[-32:], batch)) == pytest.approx(shift)
    rows, candidates = method.read_spectra(batch)
    assert rows == (32 if joined else 16 if batch == 16 else 0)
    assert (candidates is None) == bool(rows)


def test_neighbourhood_layers_search_the_spectrally_nearest_images_of_their_pool():
    """On a batch not of one domain, each image's candidates are the 32 images of the
    neighbourhood layers' pool (the last ``max(shallow_window, B)`` images, as many as seen)
    whose signatures are nearest its own; a batch of one domain has none."""
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", shallow_window=40)
    base = smooth_images(80, seed=7)
    images = torch.stack([noisy(base[:64], seed=8), blurred(base[:64])], 1).flatten(0, 1)
    for end in (16, 32, 48, 64):  # pools of 16, 32, 40 and 40 images, each half blurred
        with torch.no_grad():
            method(images[end - 16 : end])
        pool = log_band_power(images[max(0, end - 40) : end])
        distance = ((pool[-16:, None] - pool[None]) ** 2).sum(-1).sqrt()
        expected = distance.sort(1).values[:, :32]
        neighbourhood = [m for m in layers(method) if isinstance(m, NeighbourhoodNorm2d)]
        for m in neighbourhood:
            assert int(m.domain_rows) == 0
            assert m.window_mean.shape[0] == pool.shape[0]  # the pool the layer searched
            torch.testing.assert_close(distance.gather(1, m.candidates), expected)
    method.before_forward(noisy(base[64:], seed=9))  # 16 images of one domain
    assert all(int(m.domain_rows) == 16 and m.candidates is None for m in neighbourhood)


def test_pooling_layers_group_each_image_with_the_spectrally_nearest_rows_they_keep():
    """On a batch not of one domain, each image's group in the pooling layers is the
    ``window`` rows they keep of their pool (the last ``deep_window - B`` images, then the
    batch) whose signatures are nearest its own; on a batch of one domain, the pool."""
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive", window=6, deep_window=20,
                          deep_balance=2)
    base = smooth_images(72, seed=7)
    images = torch.cat([noisy(base[:24], seed=8), blurred(base[24:40])])
    images = images[torch.randperm(40, generator=torch.Generator().manual_seed(0))]
    for start in range(0, 40, 8):
        x = images[start : start + 8]
        probe = deepcopy(method)  # the decisions for x, read before the method takes it
        probe.before_forward(x)
        deep = [m for m in layers(probe) if isinstance(m, PooledNorm2d)]
        n_window = min(20 - 8, start)
        kept = torch.ones(n_window + 8, dtype=torch.bool)
        if n_window:
            kept[:n_window] = probe._balance.keep(n_window, 8)
        assert all(torch.equal(m.pool_weight > 0, kept) for m in deep)
        pool = log_band_power(images[start - n_window : start + 8])
        distance = ((pool[-8:, None] - pool[None]) ** 2).sum(-1).sqrt()
        distance[:, ~kept] = float("inf")
        expected = distance.sort(1).values[:, : min(6, int(kept.sum()))]
        assert deep and kept[:n_window].any() == (start > 0)
        for m in deep:
            torch.testing.assert_close(distance.gather(1, m.candidates), expected)
        with torch.no_grad():
            method(x)
    method.before_forward(noisy(base[40:], seed=9))  # 32 images of one domain
    assert all(m.candidates is None for m in layers(method) if isinstance(m, PooledNorm2d))


def test_pooling_layers_judge_their_window_against_the_images_judged_one_domain():
    """On a batch judged one domain the deep filter always keeps, and judges the older rows
    against, the images judged one domain (here a blurred batch of 16 alone after 48 noisy
    images, which it then drops), not the batch topped up to ``window``; on a mixed batch the
    batch topped up again."""
    method = dyntta.adapt(tiny_resnet(), "dyn_adaptive")
    base = smooth_images(96, seed=7)
    noise, blur = noisy(base[:48], seed=8), blurred(base[48:])
    with torch.no_grad():
        for start in (0, 16, 32):
            method(noise[start : start + 16])
    method.before_forward(blur[:16])
    assert method._match.pool == 16 and method._match.blocks == 16  # the batches before, whole
    signatures = log_band_power(torch.cat([noise, blur[:16]]))
    older, pool = signatures[:48], signatures[48:]
    within = ((pool[:, None] - pool[None]) ** 2).sum(-1).sqrt().fill_diagonal_(float("inf"))
    nearest = ((older[:, None] - pool[None]) ** 2).sum(-1).sqrt().min(1).values
    expected = nearest <= torch.quantile(within.min(1).values, 0.9)
    assert torch.equal(method._match.keep(48, 16), expected) and not expected.any()
    deep = [m for m in layers(method) if isinstance(m, PooledNorm2d)]
    assert deep and all(torch.equal(m.pool_weight, torch.cat([expected.float(), torch.ones(16)]))
                        for m in deep)
    with torch.no_grad():
        method(blur[:16])
    method.before_forward(torch.cat([noise[:8], blur[16:24]]))  # mixed: the last 64 again
    assert method._match.pool == 64 and method._match.blocks == 0  # image by image


@pytest.mark.parametrize("offsets", [False, True])
def test_compiled_network_follows_the_one_domain_test(offsets):
    """Also with source ratios so low that the first stage's groups of one domain give every
    sample its own mean in every channel (at a band of 0 standard errors: its own mean; which
    moves the logits)."""
    torch._dynamo.reset()
    model = tiny_resnet()
    options = {"shallow_window": 0, "deep_window": 0, **({"instance_k": 0.0} if offsets else {})}
    reference = {"reference": random_images(32, seed=9)} if offsets else {}
    plain = dyntta.adapt(model, "dyn_adaptive", **options)
    eager = dyntta.adapt(model, "dyn_adaptive", **options, **reference)
    compiled = dyntta.adapt(model, "dyn_adaptive", **options, compile={"backend": "eager"},
                            **reference)
    for method in (eager, compiled):
        method.source_ratios = {n: r * 1e-6 for n, r in method.source_ratios.items()}
    moved = []
    with torch.no_grad():
        for x in one_domain_then_mixture(32) * 2:
            logits = eager(x)
            torch.testing.assert_close(compiled(x), logits, rtol=1e-5, atol=1e-5)
            moved.append(not torch.allclose(plain(x), logits))
    assert any(moved) == offsets
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "option", [{"instance_k": -1.0}, {"instance_spread": -1.0}, {"neighbours": 0},
               {"prior_strength": 0.0}, {"window": 0}, {"shallow_window": -1},
               {"deep_window": -1}, {"deep_match": 1.5}, {"deep_balance": 0},
               {"balanced_alpha": 1.5}, {"balance_power": -1.0}]
)
def test_bad_options_are_named(option):
    with pytest.raises(ValueError, match=next(iter(option))):
        dyntta.adapt(tiny_resnet(), "dyn_adaptive", **option)
