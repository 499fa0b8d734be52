"""``python -m fedcluster.cli``: the ``fedcluster`` command."""

import sys

from fedcluster.cli import main

sys.exit(main())
