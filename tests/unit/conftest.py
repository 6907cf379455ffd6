"""Unit tests encode and decode events with the registry's own rules kept in memory (registry.store.InProcess):
the same ids and compatibility checks as the service, without one."""

import pytest

from registry.store import InProcess
from topics import codec


@pytest.fixture(autouse=True, scope="session")
def schema_registry():
    return codec.use(codec.Schemas(InProcess()))
