"""Test-time adaptation methods behind one interface (:class:`Method`) and a registry.

Importing this package registers every built-in method.
"""

from dyntta.methods import alpha_bn, datta, dyn, eata, iabn, sar, source, tbn, tent  # noqa: F401
from dyntta.methods import deyo, dyn_adaptive, note, rotta, unmix_tns, vida  # noqa: F401
from dyntta.methods.base import Method, check_batch
from dyntta.methods.registry import adapt, available_methods, method_class, register

__all__ = ["Method", "adapt", "available_methods", "check_batch", "method_class", "register"]
