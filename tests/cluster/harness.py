"""A standalone Spark cluster on 127.0.0.1 for tests: a master and two workers, each its own
JVM started from the PySpark wheel (``spark-class ...Master`` / ``...Worker``), and one driver
process connected to it.

A Python process holds one SparkContext, and the test processes already hold a local one
(tests/spark/conftest.py), so the cluster's driver is a process of its own (spawned, with its
JVM's output in a log file). Tests hand it jobs: functions of :mod:`tests.cluster.jobs`,
called there with the driver's SparkSession and arguments; results come back pickled, errors
as the driver's traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyspark

import arrowlake
from arrowlake.spark.s3a import s3a_package
from tests.services import LOCALHOST, ServiceStartError, _port_open, free_port

SPARK_HOME = Path(pyspark.__file__).parent
SRC = str(Path(arrowlake.__file__).resolve().parent.parent)
ROOT = str(Path(__file__).resolve().parent.parent.parent)
#: Python path of the driver, the executors' Python workers: arrowlake under test, and this
#: repository (executors import tests.cluster.jobs for functions shipped by reference).
PYTHONPATH = os.pathsep.join([SRC, ROOT])
#: Every JVM of the cluster runs tiny jobs: compiling only with C1 and one GC thread spends less
#: of the machine's two cores on warming up than the default JIT and GC do.
JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"


def _die_with_parent() -> None:
    """Linux: this process gets SIGTERM when the one that started it dies (a killed test run
    leaves no JVM behind; spark-class execs java, which keeps the setting)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _no_proxy() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Cluster:
    """The master and worker JVMs (stopped together). The workers start while the caller
    goes on (starting a driver, say): :meth:`wait_for_workers` waits for them.

    Each worker offers two cores and 1 GB: the driver of the tests takes one 512 MB executor
    on each, which leaves room for a second application (a pipeline's) beside it."""

    def __init__(self, base: Path, workers: int = 2) -> None:
        self.base = base
        self.logs = base / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://{LOCALHOST}:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.work_dirs: list[Path] = []
        env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": LOCALHOST,
               "SPARK_MASTER_HOST": LOCALHOST, "SPARK_DAEMON_MEMORY": "256m",
               "SPARK_DAEMON_JAVA_OPTS": JAVA_OPTS,
               "SPARK_LOG_DIR": str(self.logs), "SPARK_NO_DAEMONIZE": "1",
               "PYTHONPATH": PYTHONPATH, "PYSPARK_PYTHON": sys.executable}
        self._start("master", env, "org.apache.spark.deploy.master.Master", "--host", LOCALHOST,
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        deadline = time.monotonic() + 90
        while not _port_open(LOCALHOST, self.port):  # a driver registers once it listens
            if time.monotonic() > deadline or self.procs[0].poll() is not None:
                self.stop()
                raise ServiceStartError(f"The Spark master did not start; logs in {self.logs}")
            time.sleep(0.1)
        for i in range(workers):
            work = base / f"worker-{i}"
            work.mkdir()
            self.work_dirs.append(work)
            self._start(f"worker-{i}", env, "org.apache.spark.deploy.worker.Worker",
                        "--host", LOCALHOST, "--port", str(free_port()),
                        "--webui-port", str(free_port()), "--cores", "2", "--memory", "1g",
                        "--work-dir", str(work), self.url)

    def _start(self, name: str, env: dict[str, str], cls: str, *args: str) -> None:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - the JVM writes to it
        self.procs.append(subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), cls, *args], stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True, preexec_fn=_die_with_parent))
        log.close()

    def wait_for_workers(self, count: int = 2, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        alive = 0
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            try:
                with _no_proxy().open(f"http://{LOCALHOST}:{self.ui_port}/json/",
                                      timeout=2) as resp:
                    state = json.loads(resp.read())
                alive = sum(w.get("state") == "ALIVE" for w in state.get("workers", []))
                if alive >= count:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise ServiceStartError(f"The Spark cluster did not come up ({alive} of {count} workers)"
                                f"; logs in {self.logs}")

    def log_texts(self) -> dict[str, str]:
        """Every log the cluster wrote: the master's and workers', and each executor's stdout
        and stderr (in the workers' work directories)."""
        out = {p.name: p.read_text(errors="replace") for p in self.logs.glob("*.log")}
        for work in self.work_dirs:
            for path in work.rglob("std*"):
                if path.is_file():
                    out[str(path)] = path.read_text(errors="replace")
        return out

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for work in self.work_dirs:  # the executors' copies of the jars: 700 MB each
            shutil.rmtree(work, ignore_errors=True)


def _serve(conn: Any, master: str, base: str) -> None:
    """The driver process: a SparkSession on the cluster, calling the jobs it is sent."""
    _die_with_parent()
    log = os.open(os.path.join(base, "driver.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(SPARK_LOCAL_IP=LOCALHOST, PYSPARK_PYTHON=sys.executable,
                      PYSPARK_DRIVER_PYTHON=sys.executable, PYTHONPATH=PYTHONPATH)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    events = os.path.join(base, "events")
    os.makedirs(events, exist_ok=True)
    # hadoop-aws and the AWS SDK bundle (700 MB) from spark.jars.packages (resolved when the
    # JVM starts). Executors copy them from where Ivy put them (they are on this machine)
    # instead of fetching them from the driver as jars and again as Python files.
    SparkContext._ensure_initialized(conf=SparkConf().set("spark.jars.packages", s3a_package())
                                     .set("spark.driver.extraJavaOptions", JAVA_OPTS))
    jvm = SparkContext._jvm
    assert jvm is not None
    jars = ",".join("local:" + j.removeprefix("file:")
                    for j in str(jvm.java.lang.System.getProperty("spark.jars")).split(","))
    spark = (SparkSession.builder.master(master).appName("arrowlake-cluster-tests")
             .config("spark.jars", jars)
             .config("spark.submit.pyFiles", "")
             .config("spark.files", "")
             .config("spark.driver.host", LOCALHOST)
             .config("spark.driver.bindAddress", LOCALHOST)
             .config("spark.driver.memory", "512m")
             .config("spark.executor.memory", "512m")
             .config("spark.executor.extraJavaOptions", JAVA_OPTS)
             .config("spark.executor.cores", "1")
             .config("spark.cores.max", "2")
             .config("spark.executorEnv.PYTHONPATH", PYTHONPATH)
             .config("spark.pyspark.python", sys.executable)
             .config("spark.python.worker.reuse", "true")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.default.parallelism", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.port", str(free_port()))
             .config("spark.eventLog.enabled", "true")
             .config("spark.eventLog.compress", "false")
             .config("spark.eventLog.dir", "file://" + events)
             .getOrCreate())
    conn.send(("ready", spark.sparkContext.uiWebUrl))
    while True:
        request = conn.recv()
        if request is None:
            break
        func, args = request
        try:
            conn.send(("ok", func(spark, *args)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    spark.stop()
    conn.close()


class Driver:
    """The driver process of the cluster's tests."""

    def __init__(self, cluster: Cluster, timeout: float = 180) -> None:
        self.base = cluster.base
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, cluster.url, str(self.base)),
                                       daemon=True)
        self.process.start()
        child.close()
        try:
            if not self._conn.poll(timeout):
                raise EOFError
            status, self.ui_url = self._conn.recv()
        except EOFError:  # no answer, or the process died (Maven Central out of reach, ...)
            self.stop()
            raise ServiceStartError(
                f"The cluster's driver did not start; its log {self.base}/driver.log ends:\n"
                + "\n".join(self.log().splitlines()[-15:])) from None
        assert status == "ready"

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(spark, *args)`` in the driver (``func`` a module-level function)."""
        self._conn.send((func, args))
        status, value = self._conn.recv()
        if status == "error":
            raise AssertionError(f"{func.__name__} failed in the cluster's driver:\n{value}")
        return value

    def wait_for_executors(self, count: int, timeout: float = 120) -> None:
        from tests.cluster.jobs import executors

        deadline = time.monotonic() + timeout
        while len(self.call(executors)) < count:
            if time.monotonic() > deadline:
                raise ServiceStartError(f"The cluster gave the driver fewer than {count} "
                                        f"executors; logs in {self.base}")
            time.sleep(0.2)

    def event_log(self) -> str:
        return "\n".join(p.read_text(errors="replace")
                         for p in (self.base / "events").rglob("*") if p.is_file())

    def log(self) -> str:
        return (self.base / "driver.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
