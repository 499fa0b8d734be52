"""fedcluster: federated k-means on Flower, with Numba-compiled site kernels."""

from fedcluster.common.model import Model
from fedcluster.simulation import SimulationResult, simulate

__all__ = ["Model", "SimulationResult", "simulate"]
__version__ = "0.1.0"
