"""Fixtures of the Iceberg tests: the environment of the clients that read published metadata
(pyiceberg 0.12, DuckDB 1.5.5 with its Iceberg extension), without arrowlake installed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.client_envs import ClientEnvError, client_python


@pytest.fixture(scope="session")
def iceberg_clients() -> Path:
    """The Python of the environment holding pyiceberg 0.12 and DuckDB 1.5.5 with its Iceberg
    extension (built once, cached outside the clone)."""
    try:
        return client_python("iceberg-clients")
    except ClientEnvError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"The Iceberg clients' environment could not be built here: {exc}")
