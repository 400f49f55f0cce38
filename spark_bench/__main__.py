"""``python -m spark_bench``: the command line of :mod:`spark_bench.cli`."""
from __future__ import annotations

import sys

from spark_bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
