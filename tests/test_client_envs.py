"""The test environments of other engines' clients (tests/client_envs.py) do not pile up: a
build deletes those of the same name for other requirements once they go unused."""

from __future__ import annotations

import os
from pathlib import Path

from tests.client_envs import STALE_SECONDS, prune_stale


def _env(root: Path, name: str, used: float) -> Path:
    env = root / name
    (env / "bin").mkdir(parents=True)
    (env / ".complete").write_text("pyspark\n")
    os.utime(env / ".complete", (used, used))
    (root / f"{name}.lock").write_text("")
    return env


def test_stale_environments_of_the_same_name_go_and_the_rest_stay(tmp_path):
    now = 1_000_000_000.0
    old = now - STALE_SECONDS - 60
    current = _env(tmp_path, "spark41-aaaaaaaaaaaa", now)
    stale = _env(tmp_path, "spark41-bbbbbbbbbbbb", old)
    recent = _env(tmp_path, "spark41-cccccccccccc", now - 60)  # another clone may use it
    other_name = _env(tmp_path, "iceberg-clients-httpfs-dddddddddddd", old)
    prefix_alike = _env(tmp_path, "iceberg-clients-eeeeeeeeeeee", old)
    assert prune_stale(tmp_path, "spark41", keep=current, now=now) == [stale]
    assert not stale.exists() and not (tmp_path / "spark41-bbbbbbbbbbbb.lock").exists()
    assert current.exists() and recent.exists() and other_name.exists()
    # "iceberg-clients" does not take "iceberg-clients-httpfs-...": names match whole.
    assert prune_stale(tmp_path, "iceberg-clients", keep=tmp_path / "none", now=now) == \
        [prefix_alike]
    assert other_name.exists()
