"""The site side: the ClientApp (``app.py``), the site's policy, its data (files, tables,
built-in partitions), the tasks it runs (plain and private) and the local k-means steps."""

from fedcluster.client_app.app import app
from fedcluster.client_app.data_sources import MEMORY_PREFIX, MEMORY_SITES

__all__ = ["MEMORY_PREFIX", "MEMORY_SITES", "app"]
