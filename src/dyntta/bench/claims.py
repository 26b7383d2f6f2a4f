"""The DYN paper's checkable claims and their verdicts on our runs.

``published/dyn_claims.toml`` lists the claims, each with where the paper makes it and how it is
read as conditions on accuracy differences: ``a - b > bound`` (``above``) or ``< bound``
(``below``), in points, each side a method on a stream, averaged over the claim's dataset
families. ``best = "dyn"`` stands for ``dyn - m > 0`` for every baseline ``m``.

On our runs of one protocol a condition gets a 95% percentile bootstrap interval of its
difference (test batches resampled, the same draws for two methods on the same stream); it
holds when the interval lies beyond the bound, fails when it lies wholly on the wrong side, and
is undecided otherwise. A claim is *replicated* when all its conditions hold, *not replicated*
when one fails, and *inconclusive* otherwise; it is evaluated only where our runs cover every
one of its conditions.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from dyntta.bench.paper import STREAM, Ours, common_seed_runs
from dyntta.bench.protocols import FAMILIES, PROTOCOLS
from dyntta.bench.report import batches, has_batches, same_streams
from dyntta.bench.stats import percentile_interval, resampled_means

CLAIMS = Path(__file__).parent / "published" / "dyn_claims.toml"
STREAM_DEFAULTS = {"scenario": "crossmix", "batch_size": 64, "n_domains": 15, "delta": None,
                   "rounds": 1}


@dataclasses.dataclass(frozen=True)
class Side:
    method: str
    stream: tuple  # values of paper.STREAM


@dataclasses.dataclass(frozen=True)
class Condition:
    a: Side
    b: Side
    bound: float
    above: bool  # a - b > bound (else a - b < bound)

    def __str__(self) -> str:
        differ = [i for i, (x, y) in enumerate(zip(self.a.stream, self.b.stream)) if x != y]

        def side(s: Side) -> str:
            return s.method + "".join(f" ({STREAM[i]} {s.stream[i]})" for i in differ)
        return f"{side(self.a)} − {side(self.b)} {'>' if self.above else '<'} {self.bound:g}"

    def verdict(self, low: float, high: float) -> str:
        """holds / fails / undecided for the interval [low, high] of a - b."""
        if np.isnan(low):
            return "undecided"
        beyond, short = (low > self.bound, high < self.bound) if self.above else \
            (high < self.bound, low > self.bound)
        return "holds" if beyond else "fails" if short else "undecided"


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    source: str
    reading: str
    families: tuple[str, ...]
    conditions: tuple[Condition, ...]


def _side(spec: dict[str, Any], base: dict[str, Any], where: str) -> Side:
    unknown = set(spec) - {"method", *STREAM}
    if unknown or "method" not in spec:
        raise ValueError(f"{where}: a side is a method and stream fields ({', '.join(STREAM)}); "
                         f"got {sorted(spec)}")
    fields = {**STREAM_DEFAULTS, **base, **spec}
    return Side(spec["method"], tuple(fields[k] for k in STREAM))


def load_claims(path: str | Path = CLAIMS) -> list[Claim]:
    """The claims of a claims file (see the module docstring); ``ValueError`` names a bad one."""
    raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    baselines = raw.get("baselines", [])
    claims = []
    for i, c in enumerate(raw.get("claim", [])):
        where = f"{path}: claim {c.get('id', i)}"
        missing = {"id", "paper", "source", "reading", "families"} - set(c)
        if missing or not ("best" in c or "compare" in c):
            raise ValueError(f"{where}: needs id, paper, source, reading, families and best or "
                             f"compare (missing: {', '.join(sorted(missing)) or 'best/compare'})")
        if set(c["families"]) - set(FAMILIES):
            raise ValueError(f"{where}: families must be among {', '.join(FAMILIES)}")
        base = c.get("stream", {})
        conditions = []
        if "best" in c:
            winner = _side({"method": c["best"]}, base, where)
            conditions += [Condition(winner, _side({"method": m}, base, where), 0.0, True)
                           for m in baselines if m != c["best"]]
        for comp in c.get("compare", []):
            if ("above" in comp) == ("below" in comp):
                raise ValueError(f"{where}: each compare needs exactly one of above, below")
            a, b = _side(comp["a"], base, where), _side(comp["b"], base, where)
            conditions.append(Condition(a, b, float(comp.get("above", comp.get("below"))),
                                        "above" in comp))
        claims.append(Claim(c["id"], c["paper"], c["source"], c["reading"],
                            tuple(c["families"]), tuple(conditions)))
    return claims


def paper_difference(condition: Condition, families: tuple[str, ...],
                     rows: list[dict[str, Any]]) -> float | None:
    """The condition's difference in the paper's own cells (mean over ``families``), or None
    where the paper prints no such cells (the batch-size figure)."""
    cells: dict[tuple, float] = {}
    for r in rows:  # where two tables print a cell (Table 1, the ResNet-26 table): the first
        cells.setdefault((r["family"], r["method"], tuple(r[k] for k in STREAM)), r["accuracy"])
    try:
        return float(np.mean([cells[(f, condition.a.method, condition.a.stream)]
                              - cells[(f, condition.b.method, condition.b.stream)]
                              for f in families]))
    except KeyError:
        return None


def our_difference(condition: Condition, groups: tuple[Ours, ...]
                   ) -> tuple[float, float, float] | None:
    """``(difference, low, high)`` in points of the condition on our runs, one group per family
    (mean over families; per family, mean over the seeds both sides ran), or None where a side
    is missing."""
    points, draws = [], []
    for f, group in enumerate(groups):
        a = group.runs.get((*condition.a.stream, condition.a.method))
        b = group.runs.get((*condition.b.stream, condition.b.method))
        if not a or not b:
            return None
        runs = common_seed_runs({"a": [a[s] for s in sorted(a)], "b": [b[s] for s in sorted(b)]})
        if not runs["a"]:
            return None
        points.append(np.mean([r["accuracy"] for r in runs["a"]])
                      - np.mean([r["accuracy"] for r in runs["b"]]))
        if all(has_batches(v) for v in runs.values()):
            paired = same_streams(runs["a"], runs["b"])
            draws.append(resampled_means(*batches(runs["a"]), seed=2 * f)
                         - resampled_means(*batches(runs["b"]), seed=2 * f + (not paired)))
    point = 100 * float(np.mean(points))
    if len(draws) < len(groups):
        return point, float("nan"), float("nan")
    low, high = percentile_interval(100 * np.mean(draws, axis=0))
    return point, low, high


def verdict(outcomes: list[str]) -> str:
    if all(o == "holds" for o in outcomes):
        return "replicated"
    return "not replicated" if "fails" in outcomes else "inconclusive"


def evaluate(claim: Claim, groups: list[Ours], rows: list[dict[str, Any]]) -> list[str]:
    """Markdown items: the claim's verdict for each protocol and choice of our data that cover
    it, with each condition's difference, interval and the paper's own difference."""
    items = []
    for protocol in PROTOCOLS:
        candidates = [[g for g in groups if g.protocol == protocol and g.family == f]
                      for f in claim.families]
        for choice in itertools.product(*candidates):
            found = [our_difference(c, choice) for c in claim.conditions]
            if any(d is None for d in found):
                continue
            lines, outcomes = [], []
            for condition, (point, low, high) in zip(claim.conditions, found):
                outcome = condition.verdict(low, high)
                outcomes.append(outcome)
                paper = paper_difference(condition, claim.families, rows)
                theirs = "not printed" if paper is None else f"{paper:+.2f}"
                lines.append(f"  - {condition}: ours {point:+.2f} [{low:+.2f}, {high:+.2f}], "
                             f"paper {theirs}: {outcome}")
            data = "; ".join(g.label for g in choice)
            items.append(f"- **{verdict(outcomes)}**: `{claim.id}`: {claim.paper} ({claim.source}; "
                         f"read as: {claim.reading}) — protocol {protocol}, ours: {data}\n"
                         + "\n".join(lines))
    return items


def claims_report(groups: list[Ours], rows: list[dict[str, Any]],
                  claims: list[Claim] | None = None) -> str:
    """The verdicts of the claims our runs cover, and the ids of those they do not."""
    claims = load_claims() if claims is None else claims
    items, uncovered = [], []
    for claim in claims:
        found = evaluate(claim, groups, rows)
        items += found
        if not found:
            uncovered.append(f"`{claim.id}`")
    text = "## The paper's claims\n\nDifferences in points, 95% bootstrap intervals over test " \
           "batches.\n\n" + ("\n".join(items) if items else "none is covered by these runs")
    if uncovered:
        text += "\n\nnot covered by these runs (see each claim's datasets and streams in " \
                f"{CLAIMS.name}): " + ", ".join(uncovered)
    return text + "\n"
