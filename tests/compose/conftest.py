"""Kafka and Cassandra for the compose topology (the local ones stand in for the compose images)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from infra.processes import LOCAL
from tests.stack.conftest import _running


@pytest.fixture(scope="session")
def stores() -> Iterator[None]:
    started_here = [s for s in ("kafka.sh", "cassandra.sh") if not _running(s)]
    for script in started_here:
        subprocess.run(["bash", str(LOCAL / script), "start"], check=True)
    try:
        yield
    finally:
        for script in started_here:  # leave a `make up` stack as we found it
            subprocess.run(["bash", str(LOCAL / script), "stop"], check=False)
