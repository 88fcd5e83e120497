"""``arrowlake``: look into and maintain a lake from the shell.

    arrowlake --lake ./lake tables
    arrowlake --lake ./lake import orders.csv shop.orders --create --partition-by day
    arrowlake --lake ./lake head shop.orders -n 5 --filter "amount > 10"
    arrowlake --lake ./lake --json snapshots shop.orders
    arrowlake --lake ./lake serve --port 8815 --token-file tokens.txt
    arrowlake --lake ./lake iceberg-rest --port 8181 --token-file tokens.txt

User errors (a missing table, a bad filter, a file that is not there) print ``error: ...`` on
stderr and exit with status 2; stdout only ever carries the command's result.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from arrowlake.cli import commands, iceberg, iceberg_rest, maintain, tail
from arrowlake.cli.commands import Output, parse_duration, split_list
from arrowlake.cli.formats import FORMATS
from arrowlake.errors import ArrowlakeError, NotFound
from arrowlake.flight import DEFAULT_PORT
from arrowlake.io.storage import normalize_location
from arrowlake.lake import LAKE_ENV, Lake, lake_address
from arrowlake.units import DURATION_HELP

#: Exit status for errors the user can fix (argparse uses 2 for bad usage as well).
USER_ERROR = 2

Command = Callable[[argparse.Namespace, Lake, Output], int]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse takes ``-5s`` for an option (only plain negative numbers are values), so
    ``--interval -5s`` failed with "expected one argument". No option of ours starts with a
    digit, so a dash followed by one is always a value here, and its own check refuses it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="arrowlake",
        description="Inspect, load, export and maintain arrowlake tables.",
        epilog=f"The lake defaults to ${LAKE_ENV}. Durations: {DURATION_HELP}.",
    )
    parser.add_argument(
        "--lake", metavar="PATH|URI",
        help="the lake: a directory (SQLite metastore inside) or a metastore URL such as "
             f"postgresql://user@host/db (default: ${LAKE_ENV})")
    parser.add_argument("--warehouse", metavar="W",
                        help="where table files live; required with a metastore URL")
    parser.add_argument("--json", action="store_true",
                        help="print machine-readable JSON on stdout instead of text tables")
    # ``--json`` is accepted after the command too; SUPPRESS keeps the global value otherwise.
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON on stdout")

    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=_Parser)

    def add(name: str, func: Command, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, parents=[common])
        p.set_defaults(func=func)
        return p

    p = add("tables", commands.cmd_tables, "list the tables of the lake or of one namespace")
    p.add_argument("namespace", nargs="?", metavar="NAMESPACE")

    p = add("show", commands.cmd_show,
            "show a table: schema, partitioning, keys, properties and latest snapshot")
    p.add_argument("table", metavar="TABLE", help="namespace.table (or table in 'default')")

    p = add("snapshots", commands.cmd_snapshots, "list a table's snapshots, oldest first")
    p.add_argument("table", metavar="TABLE")

    p = add("files", commands.cmd_files, "list a table's live data files")
    p.add_argument("table", metavar="TABLE")

    p = add("head", commands.cmd_head, "print the first rows of a table")
    p.add_argument("table", metavar="TABLE")
    p.add_argument("-n", type=_positive_int, default=10, metavar="N",
                   help="number of rows (default: 10)")
    p.add_argument("--filter", metavar="EXPR", help="a filter such as \"amount > 10 and "
                   "day >= '2024-01-01'\"")
    p.add_argument("--columns", type=split_list, metavar="A,B", help="columns to show")

    p = add("import", commands.cmd_import,
            "append CSV, Parquet or JSON-lines files to a table in one commit")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="files or directories of files (.csv, .tsv, .parquet, .jsonl; "
                        ".gz/.bz2/.zst compressed text is read too)")
    p.add_argument("table", metavar="TABLE")
    p.add_argument("--format", choices=FORMATS,
                   help="the input format (default: from each file's extension)")
    p.add_argument("--create", action="store_true",
                   help="create the table from the first file's schema if it does not exist")
    p.add_argument("--partition-by", metavar="A,B",
                   help="partition columns of the table --create creates")
    p.add_argument("--delimiter", metavar="CHAR",
                   help="CSV field delimiter (default: ',' or tab for .tsv)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar on stderr (default: when stderr is a terminal)")

    p = add("export", commands.cmd_export, "write a table's rows to a Parquet, CSV or JSON-lines "
            "file")
    p.add_argument("table", metavar="TABLE")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--format", choices=FORMATS,
                   help="the output format (default: from the file's extension)")
    p.add_argument("--filter", metavar="EXPR", help="export only the rows matching EXPR")
    p.add_argument("--columns", type=split_list, metavar="A,B", help="columns to export")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar on stderr (default: when stderr is a terminal)")

    p = add("expire", maintain.cmd_expire,
            "remove old snapshots and the files only they referenced")
    p.add_argument("table", metavar="TABLE")
    p.add_argument("--older-than", type=parse_duration, metavar="DURATION",
                   help="expire only snapshots older than this (default: any age)")
    p.add_argument("--retain-last", type=_positive_int, default=1, metavar="N",
                   help="always keep the N newest snapshots (default: 1)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar on stderr (default: when stderr is a terminal)")

    tail.add_parser(add)

    p = add("orphans", maintain.cmd_orphans,
            "find (and with --delete remove) files under a table no snapshot references")
    p.add_argument("table", metavar="TABLE")
    p.add_argument("--older-than", type=parse_duration, default=parse_duration("1d"),
                   metavar="DURATION",
                   help="only files older than this; younger ones may belong to a write in "
                        "progress (default: 1d)")
    p.add_argument("--delete", action="store_true",
                   help="delete the orphan files (default: only list them)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar on stderr (default: when stderr is a terminal)")

    maintain.add_parsers(add)
    iceberg.add_parser(add)
    iceberg_rest.add_parser(add)

    p = add("serve", commands.cmd_serve,
            "serve the lake's tables over Arrow Flight until SIGTERM or Ctrl-C (prints the "
            "location clients connect to first)")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default: 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=_positive_int, default=DEFAULT_PORT,
                   help=f"the port (default: {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--token-file", metavar="FILE",
                   help="require 'Authorization: Bearer <token>' with a token from FILE (one "
                        "per line)")
    p.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--shutdown-timeout", type=parse_duration, default=parse_duration("30s"),
                   metavar="DURATION",
                   help="after SIGTERM/Ctrl-C, how long running calls may take before they "
                        "are cancelled (default: 30s; a second signal exits at once)")
    return parser


def open_lake(args: argparse.Namespace) -> Lake:
    # --lake, or else $ARROWLAKE_LAKE (with $ARROWLAKE_WAREHOUSE, $ARROWLAKE_STORAGE_OPTIONS)
    where = lake_address(args.lake or None, warehouse=args.warehouse,
                         given_by="--lake PATH|URI")
    text = where.uri
    if "://" not in text or text.startswith("file://"):
        path = normalize_location(text)
        creating = args.command == "import" and args.create
        # connect() creates a lake wherever it is pointed; a typo should not leave one behind.
        if not creating and not os.path.exists(os.path.join(path, "arrowlake.db")):
            raise NotFound(f"No lake at {text!r} (no arrowlake.db there); check --lake, or "
                           "create one with 'arrowlake --lake PATH import FILE TABLE --create'")
    return where.connect()


def _error(stderr: TextIO, message: str) -> int:
    stderr.write(f"error: {message}\n")
    stderr.flush()
    return USER_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    stdout, stderr = sys.stdout, sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else USER_ERROR
    out = Output(stdout, stderr, json=args.json)
    try:
        with open_lake(args) as lake:
            return int(args.func(args, lake, out))
    except ArrowlakeError as exc:
        return _error(stderr, str(exc))
    except FileNotFoundError as exc:
        return _error(stderr, f"No such file or directory: {exc.filename or exc}")
    except (IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        return _error(stderr, f"{exc.strerror}: {exc.filename}")
    except BrokenPipeError:
        commands.stdout_is_closed_pipe()
        return 0
    except KeyboardInterrupt:
        stderr.write("\ninterrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
