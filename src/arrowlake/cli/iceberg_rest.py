"""``arrowlake iceberg-rest``: serve the lake as an Iceberg REST catalog until SIGTERM."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from arrowlake.cli.commands import Output, parse_duration
from arrowlake.errors import ValidationError
from arrowlake.flight import read_tokens
from arrowlake.lake import Lake
from arrowlake.lazy import lazy_module

if TYPE_CHECKING:
    from arrowlake import iceberg_rest as rest
else:
    # Imported when the command runs: the other commands need neither it nor arrowlake.iceberg.
    rest = lazy_module("arrowlake.iceberg_rest")

#: Kept here so that ``--help`` needs no import of the server.
DEFAULT_PORT = 8181

Command = Callable[[argparse.Namespace, Lake, Output], int]

#: Names that, as a path prefix, would read as the protocol's own segments.
_RESERVED = frozenset({"config", "oauth", "namespaces", "tables", "transactions"})


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"ports go from 0 to 65535, got {value}")
    return value


def add_parser(add: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    """Register ``iceberg-rest`` with main's ``add(name, func, help)``."""
    p = add("iceberg-rest", cmd_iceberg_rest,
            "serve the lake as an Iceberg REST catalog (read-only) until SIGTERM or Ctrl-C; "
            "prints the URL clients use as uri first")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default: 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT,
                   help=f"the port (default: {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--token-file", metavar="FILE",
                   help="require 'Authorization: Bearer <token>' with a token from FILE (one "
                        "per line); clients pass it as token=")
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--name", default="arrowlake",
                   help="the catalog's name: the warehouse clients may ask for (DuckDB's "
                        "ATTACH '<name>') and the optional path prefix (default: arrowlake)")
    p.add_argument("--vend-s3-credentials", action="store_true",
                   help="send the lake's S3 access key (and session token) to every client "
                        "in each table's config (default: only endpoint, region and path "
                        "style; clients bring their own credentials)")
    p.add_argument("--shutdown-timeout", type=parse_duration, default=parse_duration("30s"),
                   metavar="DURATION",
                   help="after SIGTERM/Ctrl-C, how long requests in flight may take before "
                        "the process exits (default: 30s; a second signal exits at once)")


def cmd_iceberg_rest(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    tokens = read_tokens(args.token_file) if args.token_file else None
    if not args.name or "/" in args.name or args.name in _RESERVED:
        raise ValidationError(f"Invalid --name {args.name!r}: a non-empty name without '/', "
                              f"and none of {', '.join(sorted(_RESERVED))} (path segments of "
                              "the protocol)")
    table_config = {}
    if lake.warehouse.startswith(("s3://", "s3a://")):
        table_config = rest.s3_table_config(lake.storage_options,
                                            credentials=args.vend_s3_credentials)
    settings = rest.CatalogSettings(name=args.name, table_config=table_config)
    rest.serve(lake, args.host, args.port, tokens=tokens, tls_cert=args.tls_cert,
               tls_key=args.tls_key, settings=settings, out=out.stdout,
               shutdown_timeout=args.shutdown_timeout.total_seconds())
    return 0
