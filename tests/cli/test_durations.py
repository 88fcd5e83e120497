"""One duration syntax for table properties and the command line (the defects issue's items
15-17)."""

from __future__ import annotations

import argparse
from datetime import timedelta

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.cli.commands import parse_duration
from arrowlake.cli.main import build_parser
from arrowlake.table.maintenance.housekeeping import parse_duration as property_duration

SAME = [("7 d", 7 * 86400), ("30 min", 1800), ("500 ms", 0.5), ("3600", 3600), ("1w", 604800),
        ("1h30m", 5400), ("12h", 43200), ("0s", 0), ("1 d 12 h", 129600), ("2 minutes", 120)]


@pytest.mark.parametrize(("text", "seconds"), SAME)
def test_properties_and_command_line_take_the_same_durations(text: str, seconds: float) -> None:
    assert property_duration("snapshot.max-age", text) == seconds
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "soon", "1x", "1h30", "-5s", "-1", "5 5", "inf"])
def test_both_refuse_the_same_malformed_durations(text: str) -> None:
    with pytest.raises(al.ValidationError, match="snapshot.max-age"):
        property_duration("snapshot.max-age", text)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_a_negative_interval_reaches_the_duration_check(capsys: pytest.CaptureFixture) -> None:
    """``--interval -5s`` used to fail with argparse's "expected one argument"."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["maintain", "--interval", "-5s"])
    err = capsys.readouterr().err
    assert "cannot be negative" in err and "expected one argument" not in err
    args = build_parser().parse_args(["maintain", "--interval", "1h30m", "--orphans-every",
                                      "30 min"])
    assert args.interval == timedelta(minutes=90) and args.orphans_every == timedelta(minutes=30)


@pytest.mark.parametrize("interval", [-1, float("nan"), float("inf")])
def test_maintain_refuses_a_negative_interval(sqlite_lake: al.Lake, interval: float) -> None:
    with pytest.raises(al.ValidationError, match="interval"):
        sqlite_lake.maintain(interval=interval)
    with pytest.raises(al.ValidationError, match="orphans_every"):
        sqlite_lake.maintain(orphans_every=interval)


def test_retain_last_beyond_64_bits_is_refused(sqlite_lake: al.Lake) -> None:
    table = sqlite_lake.create_table("m.t", pa.schema([("k", pa.int64())]))
    with pytest.raises(al.ValidationError, match="snapshot.retain-last"):
        table.set_properties(**{"snapshot.retain-last": "99999999999999999999999"})
    table.set_properties(**{"snapshot.retain-last": str(2**63 - 1)})
    table.set_properties(**{"snapshot.max-age": "1h30m", "consumer.expiration": "7 d"})
    assert table.properties["snapshot.max-age"] == "1h30m"
