"""compile=True: every backward-free method's network is one graph with no break,
agrees with eager, and one graph serves the batch sizes of a stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

import dyntta
from dyntta.methods.normalization import NormalizationMethod
from dyntta.norm import ClusterAwareBatchNorm2d, lisc
from dyntta.norm.lisc import pointer_jumping
from dyntta.norm.adaptive import NeighbourhoodNorm2d, PooledNorm2d
from tests.conftest import random_images, randomize_bn, tiny_resnet

BACKWARD_FREE = ["source", "tbn", "alpha_bn", "dyn", "iabn", "unmix_tns", "dyn_adaptive", "datta"]


class CountingBackend:
    """A torch.compile backend that runs the captured graphs as they are and counts them."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_backward_free_list_is_every_method_without_gradient_steps():
    free = {n for n in dyntta.available_methods() if not dyntta.methods.method_class(n).backward}
    assert free == set(BACKWARD_FREE)


@pytest.mark.parametrize("name", BACKWARD_FREE)
def test_adapted_network_is_one_graph_without_breaks(name):
    for warm_up in (0, 2):  # the first batch, then with state (windows, memories) in play
        adapted = dyntta.adapt(tiny_resnet(), name)
        with torch.no_grad():
            for seed in range(warm_up):
                adapted(random_images(8, seed=seed))
            x = random_images(8, seed=warm_up)
            if isinstance(adapted, NormalizationMethod):
                adapted.before_forward(x)  # what step sets before the network runs
            torch._dynamo.maybe_mark_dynamic(x, 0)
            explained = torch._dynamo.explain(adapted.model)(x)
        assert explained.graph_break_count == 0, explained.break_reasons
        assert explained.graph_count == 1


@pytest.mark.parametrize("name", BACKWARD_FREE)
def test_compiled_and_eager_agree_batch_after_batch(name):
    model = tiny_resnet()
    eager = dyntta.adapt(model, name)
    compiled = dyntta.adapt(model, name, compile={"backend": "eager"})
    for i, b in enumerate([8, 5, 11]):  # unmix_tns and datta carry state from batch to batch
        x = random_images(b, seed=i)
        torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)


def test_aot_traced_dyn_matches_eager():
    model = tiny_resnet()
    compiled = dyntta.adapt(model, "dyn", compile={"backend": "aot_eager"})
    for b in [8, 5]:
        x = random_images(b, seed=b)
        torch.testing.assert_close(compiled(x), dyntta.adapt(model, "dyn")(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["source", "dyn"])
def test_one_graph_serves_every_batch_size_from_16(name):
    """CPU convolutions choose their kernel by B >= 16 and tracing guards on that choice, so a
    batch below 16 after one above compiles once more; B = 1 is always its own graph."""
    backend = CountingBackend()
    adapted = dyntta.adapt(tiny_resnet(), name, compile={"backend": backend})
    for b in [16, 24, 40, 17]:
        adapted(random_images(b))
    assert backend.graphs == 1
    for b in [5, 2, 12]:
        adapted(random_images(b))
    assert backend.graphs == 2


def eager_and_compiled_dyn_adaptive(backend: CountingBackend):
    """``dyn_adaptive`` with small windows (8, 16, 32) on the tiny ResNet, eager and compiled
    with ``backend``."""
    options = dict(window=8, shallow_window=16, deep_window=32)
    model = tiny_resnet()
    return (dyntta.adapt(model, "dyn_adaptive", **options),
            dyntta.adapt(model, "dyn_adaptive", compile={"backend": backend}, **options))


def test_dyn_adaptive_runs_eager_while_its_windows_fill_then_one_graph():
    """Its windows grow until full and each new size would be a graph of its own (dynamo stops
    at 8 and runs eager from there); it runs eager until every window keeps its size."""
    backend = CountingBackend()
    eager, compiled = eager_and_compiled_dyn_adaptive(backend)
    for _ in range(2):  # the second time after reset(): empty windows, the same graph
        for i in range(12):
            # B = 4: the 32-sample deep window and class memory are full after 8 batches, and
            # the signature memory (32, then the batch) holds 36 from the 10th on
            assert compiled.windows_steady(4) == (i >= 9)
            x = random_images(4, seed=i)
            torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
        assert backend.graphs == 1
        assert not compiled.windows_steady(5)  # another batch size: one eager batch first
        eager.reset()
        compiled.reset()


def test_compiled_dyn_adaptive_reads_each_batchs_one_domain_decision():
    """Once its graph runs, the batches cycle through two domains (half blurred), the 16 images
    as one domain and the last 32 as one: the graph reads each batch's decision, as eager does,
    and holds no decision as a constant (two graphs: with and without the candidates)."""
    backend = CountingBackend()
    eager, compiled = eager_and_compiled_dyn_adaptive(backend)
    decisions = set()
    for i in range(9):  # steady from the fourth batch on
        x = random_images(16, seed=i, size=16)
        if i % 3 == 0:
            x[8:] = F.avg_pool2d(x[8:], 5, 1, 2, count_include_pad=False)
        steady = compiled.windows_steady(16)  # then the graph runs
        torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
        if steady:
            decisions.add(int(compiled.layers()[0].domain_rows))
    assert decisions == {0, 16, 32}
    assert backend.graphs == 2


def test_dyn_adaptives_operators_are_never_captured_in_a_cuda_graph():
    """Each takes its branch by the one-domain mark it reads on the host: a CUDA graph's replay
    (``mode="reduce-overhead"``) would repeat the branch of the batch it captured."""
    for op in (torch.ops.dyntta.neighbourhood_statistics, torch.ops.dyntta.pooled_statistics):
        assert torch.Tag.cudagraph_unsafe in op.default.tags


def test_inductor_compiled_cabn_layer_matches_eager():
    """One inductor (C++) compilation, of DYN's layer alone: the whole network takes minutes."""
    bn = randomize_bn(nn.Sequential(nn.BatchNorm2d(4)))[0]
    layer = ClusterAwareBatchNorm2d(bn)
    compiled = torch.compile(layer, dynamic=True, fullgraph=True)
    for b in [12, 7]:
        x = torch.randn(b, 4, 5, 5, generator=torch.Generator().manual_seed(b))
        with torch.no_grad():
            got = compiled(x)
            labels = layer.last_labels  # set by the compiled graph
            torch.testing.assert_close(got, layer(x), rtol=1e-4, atol=1e-5)
        assert torch.equal(labels, layer.last_labels)


def test_compiled_method_resets_to_the_source_state():
    adapted = dyntta.adapt(tiny_resnet(), "unmix_tns", compile={"backend": "eager"})
    first = adapted(random_images(8))
    adapted(random_images(8, seed=1))
    adapted.reset()
    assert torch.equal(adapted(random_images(8)), first)


def test_gradient_methods_refuse_compile():
    with pytest.raises(ValueError, match="compile=True is for backward-free methods; 'tent'"):
        dyntta.adapt(tiny_resnet(), "tent", compile=True)


def test_a_compile_option_of_the_wrong_type_is_named():
    with pytest.raises(ValueError, match="compile must be True, False or a dict"):
        dyntta.adapt(tiny_resnet(), "dyn", compile="yes")


def chain(b: int) -> torch.Tensor:
    """First neighbours of the deepest possible component: i -> i + 1, and a final mutual pair."""
    neighbours = torch.arange(1, b + 1)
    neighbours[-1] = b - 2
    return neighbours


@pytest.mark.parametrize("b", [2, 3, 5, 64, 1000])
def test_pointer_jumping_names_the_deepest_chain(b):
    """ceil(log2 B) rounds reach the mutual pair from the far end of the longest chain."""
    assert torch.equal(pointer_jumping(chain(b)), torch.full((b,), b - 2))


@st.composite
def tied_first_neighbours(draw):
    """First neighbours under a random symmetric similarity of few distinct values (many exact
    ties, broken to the lowest index as ``argmax`` does), B from 2 to 200."""
    b = draw(st.integers(2, 200))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sim = rng.integers(0, draw(st.integers(1, 50)), size=(b, b)).astype(float)
    sim = sim + sim.T
    np.fill_diagonal(sim, -np.inf)
    return torch.from_numpy(sim.argmax(axis=1))


def union_find_ids(neighbours: list[int]) -> list[int]:
    """Each sample's component of the graph i -- n_i, named by its smallest member."""
    parent = list(range(len(neighbours)))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i, j in enumerate(neighbours):
        a, b = find(i), find(j)
        parent[max(a, b)] = min(a, b)
    return [find(i) for i in range(len(neighbours))]


@settings(max_examples=200, deadline=None)
@given(tied_first_neighbours())
def test_pointer_jumping_names_the_union_find_components(neighbours):
    """Pointer jumping (what the compiled graph's LISC operator runs) against union-find: the
    same partition, each component named by the smaller index of its one mutual pair."""
    ids = pointer_jumping(neighbours).tolist()
    reference = union_find_ids(neighbours.tolist())
    assert len(set(zip(ids, reference))) == len(set(ids)) == len(set(reference))
    for i, root in enumerate(ids):
        partner = neighbours[root].item()
        assert neighbours[partner] == root and root < partner and reference[root] == reference[i]


def random_instance_means(seed: int, b: int, c: int, k: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, c, generator=generator) * 3
    mu = centres[torch.randint(0, k, (b,), generator=generator)]
    return mu + 0.3 * torch.randn(b, c, generator=generator)


TRACED_LISC = torch.compile(lisc, backend="aot_eager", dynamic=True, fullgraph=True)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 160), st.integers(1, 16), st.integers(1, 6))
def test_traced_lisc_gives_exactly_the_eager_partitions(seed, b, c, k):
    mu = random_instance_means(seed, b, c, k)
    assert torch.equal(TRACED_LISC(mu, canonical=False), lisc(mu, canonical=False))
    assert torch.equal(TRACED_LISC(mu), lisc(mu))


def test_dyns_graph_holds_each_layers_clustering_and_mix_as_one_operator():
    """Neither the similarity, a pointer-jumping round, the cluster statistics nor the mix is
    traced: each CABN layer calls the operator that computes them once."""
    targets = []

    def backend(graph_module, example_inputs):
        targets.extend(str(n.target) for n in graph_module.graph.nodes)
        return graph_module.forward

    adapted = dyntta.adapt(tiny_resnet(), "dyn", compile={"backend": backend})
    adapted(random_images(8))
    layers = sum(isinstance(m, ClusterAwareBatchNorm2d) for m in adapted.model.modules())
    assert layers > 0
    assert targets.count("dyntta.cabn_mix.default") == layers
    assert not any(op in t for t in targets
                   for op in ("gather", "argmax", "lisc_ids", "lerp", "matmul"))


def test_dyn_adaptives_graph_holds_each_layers_statistics_as_one_operator():
    """No neighbour search, group statistic, mix, instance rule or window filter is traced: each
    neighbourhood layer calls its operator once, each pooling layer its own, and the filter's
    weights (computed before the forward) are an input."""
    targets = []

    def backend(graph_module, example_inputs):
        targets.extend(str(n.target) for n in graph_module.graph.nodes)
        return graph_module.forward

    options = dict(window=8, shallow_window=16, deep_window=32)
    adapted = dyntta.adapt(tiny_resnet(), "dyn_adaptive", compile={"backend": backend}, **options)
    for i in range(12):  # eager while the windows fill, then the graph
        adapted(random_images(4, seed=i))
    kinds = [type(m) for m in adapted.model.modules()]
    assert kinds.count(NeighbourhoodNorm2d) > 0 and kinds.count(PooledNorm2d) > 0
    assert targets.count("dyntta.neighbourhood_statistics.default") == \
        kinds.count(NeighbourhoodNorm2d)
    assert targets.count("dyntta.pooled_statistics.default") == kinds.count(PooledNorm2d)
    # the normalisation's rsqrt is traced (inductor fuses it), the rule's sqrt is not
    assert not any(op in t.replace("rsqrt", "") for t in targets
                   for op in ("topk", "lerp", "sqrt", "cdist", "quantile", "cumsum"))
