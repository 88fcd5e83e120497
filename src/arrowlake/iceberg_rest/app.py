"""The Iceberg REST catalog as an ASGI application (Starlette).

Routes follow Iceberg's REST catalog OpenAPI spec, with and without the ``{prefix}`` segment
(``/v1/namespaces`` and ``/v1/<name>/namespaces``). Reads answer from the lake; every write
answers 403 in Iceberg's error model with a message saying how to write, before reading its
body, so none is ever half applied. Handlers are plain functions: Starlette runs them on its
thread pool, since they wait on the metastore and storage.
"""

from __future__ import annotations

import hmac
import json
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from arrowlake.errors import ArrowlakeError, NotFound, ValidationError, require
from arrowlake.iceberg_rest import catalog
from arrowlake.iceberg_rest.catalog import CatalogSettings, RestError
from arrowlake.lake import Lake

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

EXTRA = "iceberg-rest"
FEATURE = "arrowlake iceberg-rest (the Iceberg REST catalog)"

Handler = Callable[["Request"], "Response"]


def _responses() -> Any:
    return require("starlette.responses", EXTRA, FEATURE)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    return _responses().Response(data, status_code=status, headers=headers,
                                 media_type="application/json")


def error_response(error: RestError, headers: dict[str, str] | None = None) -> Response:
    return _json(error.body(), error.code, headers)


def _as_rest_error(exc: BaseException) -> RestError:
    if isinstance(exc, RestError):
        return exc
    if isinstance(exc, ValidationError):
        return catalog.bad_request(str(exc))
    if isinstance(exc, NotFound):
        return RestError(404, "NotFoundException", str(exc))
    if not isinstance(exc, ArrowlakeError):
        sys.stderr.write("arrowlake iceberg-rest: internal error\n" + "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)))
        sys.stderr.flush()
    return catalog.internal_error(exc)


class InFlight:
    """How many handlers are running: a shutdown that must cut some off says so."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def __enter__(self) -> None:
        with self._lock:
            self.count += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.count -= 1


def _answering(handler: Handler) -> Handler:
    """Every failure leaves as Iceberg's error model, never as a traceback or HTML."""

    def answer(request: Request) -> Response:
        with request.app.state.in_flight:
            try:
                catalog.check_prefix(_settings(request), request.path_params.get("prefix"))
                return handler(request)
            except Exception as exc:
                return error_response(_as_rest_error(exc))

    answer.__name__ = handler.__name__
    return answer


def _lake(request: Request) -> Lake:
    lake: Lake = request.app.state.lake
    return lake


def _settings(request: Request) -> CatalogSettings:
    settings: CatalogSettings = request.app.state.settings
    return settings


# -- reads ---------------------------------------------------------------------------------------


def get_config(request: Request) -> Response:
    return _json(catalog.config(_settings(request), _lake(request),
                                request.query_params.get("warehouse")))


def list_namespaces(request: Request) -> Response:
    q = request.query_params
    return _json(catalog.list_namespaces(_lake(request), q.get("parent"), q.get("pageToken"),
                                         q.get("pageSize")))


def namespace(request: Request) -> Response:
    body = catalog.load_namespace(_lake(request), request.path_params["namespace"])
    if request.method == "HEAD":
        return _responses().Response(status_code=204)
    return _json(body)


def list_tables(request: Request) -> Response:
    q = request.query_params
    return _json(catalog.list_tables(_lake(request), request.path_params["namespace"],
                                     q.get("pageToken"), q.get("pageSize")))


def table(request: Request) -> Response:
    lake, params = _lake(request), request.path_params
    if request.method == "HEAD":
        catalog.table_of(lake, params["namespace"], params["table"])
        return _responses().Response(status_code=204)
    loaded = catalog.load_table(_settings(request), lake, params["namespace"], params["table"],
                                request.query_params.get("snapshots"),
                                request.headers.get("if-none-match"))
    if loaded.body is None:
        return _responses().Response(status_code=304, headers={"ETag": loaded.etag})
    return _json(loaded.body, headers={"ETag": loaded.etag})


def report_metrics(request: Request) -> Response:
    # Clients report scan metrics after reading; accepted and not kept.
    return _responses().Response(status_code=204)


# -- writes: refused -----------------------------------------------------------------------------


def _refuse(what: str) -> Handler:
    def refuse(request: Request) -> Response:
        raise catalog.refused_write(what)

    refuse.__name__ = f"refuse {what}"
    return refuse


def oauth_tokens(request: Request) -> Response:
    # The OAuth2 error form (RFC 6749), as clients expect from this endpoint.
    return _json({"error": "unsupported_grant_type",
                  "error_description": "This catalog issues no tokens: configure the client "
                                       "with token=<one of the server's tokens> (the lines of "
                                       "its --token-file)"}, 400)


# -- the application -----------------------------------------------------------------------------


class BearerTokens:
    """Refuses requests without ``Authorization: Bearer <one of the tokens>`` (401, Iceberg's
    error model). The OAuth2 token endpoint stays open: it only says that it issues none."""

    def __init__(self, app: Any, tokens: Sequence[str]) -> None:
        self.app = app
        self.tokens = [t.encode() for t in tokens]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] == "/v1/oauth/tokens" \
                or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        error = RestError(401, "NotAuthorizedException",
                          "A valid bearer token is required: configure the client with "
                          "token=<one of the server's tokens> (it sends 'Authorization: Bearer "
                          "<token>')")
        response = error_response(error, {"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

    def _allowed(self, scope: Any) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                token = token.strip()
                if scheme.lower() == b"bearer" and token:
                    # Compare with every token, so timing does not tell which one matched.
                    matches = [hmac.compare_digest(token, t) for t in self.tokens]
                    return any(matches)
        return False


def _not_found(request: Request, exc: Exception) -> Response:
    return error_response(RestError(
        404, "NotFoundException",
        f"No such endpoint: {request.method} {request.url.path} (this server follows "
        "Iceberg's REST catalog spec: /v1/config, /v1/namespaces, "
        "/v1/namespaces/<namespace>/tables/<table>, ...)"))


def _not_allowed(request: Request, exc: Exception) -> Response:
    return error_response(RestError(
        405, "UnsupportedOperationException",
        f"{request.method} is not allowed on {request.url.path}"))


def build_app(lake: Lake, settings: CatalogSettings | None = None,
              tokens: Sequence[str] | None = None) -> Starlette:
    """The catalog over ``lake`` as an ASGI application."""
    require("starlette", EXTRA, FEATURE)
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    def route(path: str, handler: Handler, methods: list[str]) -> Route:
        return Route(path, _answering(handler), methods=methods)

    routes = [route("/v1/config", get_config, ["GET"]),
              Route("/v1/oauth/tokens", oauth_tokens, methods=["POST"])]
    # Without a prefix first: /v1/namespaces/<ns> must not be read as prefix <namespaces>.
    for base in ("/v1", "/v1/{prefix}"):
        ns = base + "/namespaces/{namespace}"
        routes += [
            route(base + "/namespaces", list_namespaces, ["GET"]),
            route(base + "/namespaces", _refuse("create a namespace"), ["POST"]),
            route(ns, namespace, ["GET", "HEAD"]),
            route(ns, _refuse("drop a namespace"), ["DELETE"]),
            route(ns + "/properties", _refuse("change a namespace's properties"), ["POST"]),
            route(ns + "/tables", list_tables, ["GET"]),
            route(ns + "/tables", _refuse("create a table"), ["POST"]),
            route(ns + "/register", _refuse("register a table"), ["POST"]),
            route(ns + "/tables/{table}", table, ["GET", "HEAD"]),
            route(ns + "/tables/{table}", _refuse("commit to a table"), ["POST"]),
            route(ns + "/tables/{table}", _refuse("drop a table"), ["DELETE"]),
            route(ns + "/tables/{table}/metrics", report_metrics, ["POST"]),
            route(base + "/tables/rename", _refuse("rename a table"), ["POST"]),
            route(base + "/transactions/commit", _refuse("commit a transaction"), ["POST"]),
        ]
    middleware = [Middleware(BearerTokens, tokens=list(tokens))] if tokens else []
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={404: _not_found, 405: _not_allowed})
    app.state.lake = lake
    app.state.settings = settings or CatalogSettings()
    app.state.in_flight = InFlight()
    return app
