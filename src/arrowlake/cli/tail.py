"""``arrowlake tail``: print a table's changes as they are committed, until Ctrl-C."""

from __future__ import annotations

import argparse
from datetime import UTC

from arrowlake.cli.commands import Output
from arrowlake.cli.output import MAX_CELL_WIDTH, dumps, format_table
from arrowlake.errors import ValidationError
from arrowlake.lake import Lake
from arrowlake.streaming import Change


def start_of(text: str) -> str | int:
    """``--from``: earliest, latest, full or a snapshot id."""
    if text in ("earliest", "latest", "full"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected earliest, latest, full or a snapshot id, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"snapshot ids start at 1, got {value}")
    return value


def add_parser(add: object) -> None:
    """Register ``tail`` with main's ``add(name, func, help)``."""
    p = add("tail", cmd_tail,  # type: ignore[operator]
            "print a table's changes as they are committed, until Ctrl-C")
    p.add_argument("table", metavar="TABLE")
    p.add_argument("--consumer", metavar="ID",
                   help="resume from, and record progress under, this consumer id")
    p.add_argument("--from", dest="start", type=start_of, default="latest",
                   metavar="earliest|latest|full|N",
                   help="where to start without recorded progress (default: latest)")
    p.add_argument("--row-kind", action="store_true",
                   help="show each row's change kind (+I, -U, +U, -D)")
    p.add_argument("--poll-interval", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between polls while caught up (default: 1)")
    p.add_argument("--stop-at-latest", action="store_true",
                   help="exit once caught up instead of waiting for new commits")


def cmd_tail(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    if args.poll_interval < 0:
        raise ValidationError(f"--poll-interval must be 0 or more, got {args.poll_interval}")
    table = lake.table(args.table)
    stream = table.stream(consumer=args.consumer, start=args.start,
                          poll_interval=args.poll_interval, include_row_kind=args.row_kind,
                          stop_at_latest=args.stop_at_latest)
    try:
        with stream:
            for change in stream:
                _print(change, out)
                if args.consumer:
                    stream.commit(change.snapshot_id)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how tail ends; progress up to the last printed change is committed
    return 0


def _print(change: Change, out: Output) -> None:
    """One change: with --json a JSON line per row, else a header line and a text table."""
    rows = change.to_arrow().to_pylist()
    snapshot = change.snapshot_id
    if out.json:
        for row in rows:
            out.stdout.write(dumps({"_snapshot_id": snapshot, **row}) + "\n")
    else:
        when = change.committed_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
        out.stdout.write(
            f"-- snapshot {snapshot} ({change.kind}, {when} UTC): {len(rows)} rows\n")
        if rows:
            out.stdout.write(format_table(rows, list(rows[0]), max_width=MAX_CELL_WIDTH)
                             .rstrip("\n") + "\n")
    out.stdout.flush()
