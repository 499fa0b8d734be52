"""fedcluster: federated k-means on Flower, with Numba-compiled site kernels."""

from __future__ import annotations

import importlib

__all__ = ["Model", "SimulationResult", "choose_k", "simulate"]
__version__ = "0.1.0"

# Imported lazily: deployment starts a fresh ClientApp process for every round, and the
# ClientApp must not pay for the server side (Flower's server, scikit-learn) it never uses.
_LAZY = {
    "Model": "fedcluster.common.model",
    "SimulationResult": "fedcluster.simulation",
    "simulate": "fedcluster.simulation",
    "choose_k": "fedcluster.simulation",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fedcluster' has no attribute {name!r}")
