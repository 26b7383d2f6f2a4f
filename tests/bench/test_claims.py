"""The paper's claims: the shipped list, and each verdict on constructed results."""

from __future__ import annotations

import pytest

from dyntta.bench.claims import Condition, Side, claims_report, load_claims, paper_difference
from dyntta.bench.paper import our_runs, published_rows
from dyntta.methods import available_methods
from tests.bench.test_paper import CIFAR10_C, flat, noisy

BASELINES = ["source", "tbn", "alpha_bn", "iabn", "note", "tent", "eata", "sar", "deyo", "vida",
             "rotta"]
CLAIMS = {c.id: c for c in load_claims()}
CIFAR100_C = {"name": "cifar100-c", "path": "C100", "checkpoint": "r.pt", "family": "cifar100"}
IMAGENET_C = {"name": "imagenet-c", "path": "IN-C", "checkpoint": "r.pt", "family": "imagenet"}


def verdicts(records, claim_id):
    """``[(verdict, protocol)]`` of one claim on ``records``."""
    text = claims_report(our_runs(records), published_rows(), [CLAIMS[claim_id]])
    return [(line.split("**")[1], line.split("protocol ")[1].split(",")[0])
            for line in text.splitlines() if line.startswith("- **")]


def test_the_shipped_claims_name_known_methods_and_hold_on_the_papers_own_cells():
    rows = published_rows()
    assert {"table1-crossmix-average", "table1-crossmix-cifar10", "table1-random-cifar10-deyo",
            "table1-shuffle-cifar10-deyo", "domains-6-average", "wild-cifar10", "rounds-cifar10",
            "batch-size-cifar10"} <= set(CLAIMS)
    for claim in CLAIMS.values():
        assert claim.paper and claim.source and claim.reading and claim.conditions
        for c in claim.conditions:
            assert {c.a.method, c.b.method} <= set(available_methods())
            paper = paper_difference(c, claim.families, rows)
            if claim.id.startswith("batch-size"):  # a figure without printed numbers
                assert paper is None
            else:
                assert (paper > c.bound) if c.above else (paper < c.bound), (claim.id, str(c))


def test_best_expands_to_every_baseline():
    claim = CLAIMS["table1-crossmix-cifar10"]
    assert [(c.a.method, c.b.method, c.bound, c.above) for c in claim.conditions] == \
        [("dyn", m, 0.0, True) for m in BASELINES]


@pytest.mark.parametrize("above, low, high, outcome", [
    (True, 0.5, 2.0, "holds"), (True, -2.0, -0.5, "fails"), (True, -0.5, 2.0, "undecided"),
    (False, -2.0, -0.5, "holds"), (False, 0.5, 2.0, "fails"), (False, -0.5, 2.0, "undecided"),
])
def test_a_condition_is_decided_by_where_its_interval_lies(above, low, high, outcome):
    side = Side("dyn", ("crossmix", 64, 15, None, 1))
    assert Condition(side, side, 0.0, above).verdict(low, high) == outcome


@pytest.mark.parametrize("deyo, dyn, verdict", [(0.75, 0.5, "replicated"),
                                                (0.5, 0.75, "not replicated")])
def test_deyo_ahead_on_random_replicated_or_not(deyo, dyn, verdict):
    records = [flat("deyo", deyo, scenario="random"), flat("dyn", dyn, scenario="random")]
    assert verdicts(records, "table1-random-cifar10-deyo") == [(verdict, "dyn-paper")]


def test_a_difference_inside_the_interval_is_inconclusive():
    records = [noisy("deyo", 0.6, scenario="random"), noisy("dyn", 0.6, scenario="random")]
    assert verdicts(records, "table1-random-cifar10-deyo") == [("inconclusive", "dyn-paper")]


def test_best_needs_every_baseline_and_is_judged_per_protocol():
    records = [flat("dyn", 0.75)] + [flat(m, 0.5) for m in BASELINES]
    assert verdicts(records, "table1-crossmix-cifar10") == [("replicated", "dyn-paper")]
    records.append(flat("tent", 0.875, protocol="published", options={
        "optimizer": "adam", "lr": 0.001, "nesterov": False}))
    assert verdicts(records, "table1-crossmix-cifar10") == [("replicated", "dyn-paper")]
    records += [flat(m, 0.5, protocol="published", options=o) for m, o in (
        ("eata", {"optimizer": "adam", "lr": 0.001, "fisher_alpha": 1.0, "d_margin": 0.4}),
        ("sar", {"lr": 0.001}), ("deyo", {"optimizer": "adam", "lr": 0.001}))]
    assert verdicts(records, "table1-crossmix-cifar10") == [
        ("replicated", "dyn-paper"), ("not replicated", "published")]
    assert verdicts(records[1:], "table1-crossmix-cifar10") == []  # no dyn: not covered


def test_an_average_claim_averages_over_datasets():
    records = []
    for dataset, dyn in ((CIFAR10_C, 0.75), (CIFAR100_C, 0.75), (IMAGENET_C, 0.375)):
        records += [flat("dyn", dyn, dataset=dataset)]
        records += [flat(m, 0.5, dataset=dataset) for m in BASELINES]
    # +25, +25 and -12.5 points: +12.5 on average, but behind on ImageNet-C
    assert verdicts(records, "table1-crossmix-average") == [("replicated", "dyn-paper")]
    assert verdicts(records, "table1-crossmix-imagenet") == [("not replicated", "dyn-paper")]
    assert verdicts(records[:12], "table1-crossmix-average") == []  # CIFAR-10 alone


@pytest.mark.parametrize("dyn_low, verdict", [(0.71875, "replicated"),
                                              (0.65625, "not replicated")])
def test_wild_dyn_stays_within_a_point_while_deyo_falls(dyn_low, verdict):
    records = [flat("dyn", 0.71875, scenario="wild", delta=0.1),
               flat("dyn", dyn_low, scenario="wild", delta=0.005),
               flat("deyo", 0.5, scenario="wild", delta=0.1),
               flat("deyo", 0.4375, scenario="wild", delta=0.005)]
    assert verdicts(records, "wild-cifar10") == [(verdict, "dyn-paper")]
    report = claims_report(our_runs(records), published_rows(), [CLAIMS["wild-cifar10"]])
    assert "deyo (delta 0.005) − deyo (delta 0.1) < 0: ours -6.25 [-6.25, -6.25], paper -2.73: " \
           "holds" in report
