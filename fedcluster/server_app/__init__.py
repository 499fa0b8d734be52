"""The server side: the ServerApp (``app.py``), its round loop (``workflow.py``), results
and outputs, checkpoints, choose-k and the SecAgg+ fit workflow."""

from fedcluster.server_app.app import app, main
from fedcluster.server_app.workflow import INITIAL_CENTROIDS, RESULT

__all__ = ["INITIAL_CENTROIDS", "RESULT", "app", "main"]
