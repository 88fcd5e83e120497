"""Quantities written for people: byte counts in binary units."""

from __future__ import annotations


def human_size(n: float) -> str:
    """A byte count for people: ``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


__all__ = ["human_size"]
