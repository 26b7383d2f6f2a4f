"""Running grids of (dataset x scenario x method x seed), storing and reporting results.

``run(grid, model=...)`` runs a grid on any model from Python (:mod:`dyntta.bench.api`)."""

from dyntta.bench.api import BenchRun, run

__all__ = ["BenchRun", "run"]
