"""Benchmark history analytics on PySpark: ingest pytest-benchmark JSON, detect trends and
change points per series, render a self-contained HTML report, and gate CI on regressions.

Run as ``rmqha-trends <ingest|trends|report>`` (or ``python -m spark_bench``); see
:mod:`spark_bench.cli`.
"""
from __future__ import annotations

import warnings

# PySpark 4.3 warns on every import that pandas 3 is "not yet fully supported"; the paths
# used here (Arrow conversion, applyInPandas) are covered by our tests, so keep logs clean.
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas",
                        category=FutureWarning)

__all__ = ["__version__"]

__version__ = "0.1.0"
