"""The native-core tests need the extension: it is built by `pip install -e .`, and a build that
failed must fail these tests, not skip them."""

from __future__ import annotations

import pytest

from arrowlake import native


@pytest.fixture(autouse=True, scope="session")
def _extension_built() -> None:
    assert native.available(), (
        "arrowlake._native is not built: run `pip install -e .` (needs Rust and cargo)")
