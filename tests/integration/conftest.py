"""Fixtures of the tests that start real processes."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A :class:`cluster.Cluster` in the test's temp dir; everything it started is stopped."""
    with Cluster(tmp_path) as c:
        yield c
