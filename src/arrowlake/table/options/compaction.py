"""The compaction properties of a primary-key table, checked when set (see
:mod:`arrowlake.table.maintenance.compaction` for what they do)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from arrowlake.errors import ValidationError


@dataclass(frozen=True)
class CompactionOptions:
    """The compaction knobs of a primary-key table (table properties, see the module doc).

    The defaults trade reads for writes as measured by the long run of ``bench/pk.py``: a
    full read merging 10 runs a bucket is about as fast as reading the same rows from one
    Parquet file, and compacting at 10 runs with a ratio of 1 rewrites about a third fewer
    bytes than at 5 runs with 1.5 (a ratio over 1 lets bigger, older runs join merges)."""

    max_runs: int = 10  # compaction.max-runs: a commit compacts touched buckets with more runs
    size_ratio: float = 1.0  # compaction.size-ratio: older run <= ratio x newer picked runs
    max_size_amplification_percent: int = 200  # compaction.max-size-amplification-percent
    write_budget: float = 5.0  # compaction.write-budget: bytes compacted per byte written


def _property(props: Mapping[str, str], name: str, default: float, *, integer: bool,
              minimum: float, above: bool, meaning: str) -> float:
    value = props.get(name)
    if value is None or value == "":
        return default
    try:
        number: float | None = int(value) if integer else float(value)
    except ValueError:
        number = None
    if number is not None and (number != number or number in (float("inf"), float("-inf"))):
        number = None
    if number is None or number < minimum or (above and number == minimum):
        kind = "an integer" if integer else "a number"
        bound = f"{'>' if above else '>='} {minimum:g}"
        raise ValidationError(
            f"Table property '{name}' must be {kind} {bound} ({meaning}), not {value!r}")
    return number


def compaction_options(props: Mapping[str, str]) -> CompactionOptions:
    """The compaction knobs in ``props``, defaults for those not set; a malformed one raises
    :class:`~arrowlake.errors.ValidationError` naming the property."""
    d = CompactionOptions()
    return CompactionOptions(
        max_runs=int(_property(
            props, "compaction.max-runs", d.max_runs, integer=True, minimum=1, above=False,
            meaning="a commit compacts a bucket holding more runs than this")),
        size_ratio=_property(
            props, "compaction.size-ratio", d.size_ratio, integer=False, minimum=1,
            above=False, meaning="an older run joins a compaction when it is at most this many "
                                 "times the newer runs picked"),
        max_size_amplification_percent=int(_property(
            props, "compaction.max-size-amplification-percent",
            d.max_size_amplification_percent, integer=True, minimum=0, above=False,
            meaning="a bucket is compacted whole when its newer runs exceed this percent of "
                    "its oldest")),
        write_budget=_property(
            props, "compaction.write-budget", d.write_budget, integer=False, minimum=0,
            above=True, meaning="a commit compacts at most this many times the bytes it "
                                "wrote"),
    )
