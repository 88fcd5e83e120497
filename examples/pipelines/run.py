"""Run examples/pipelines (a Spark Declarative Pipeline) on fresh raw events; check gold.

    python examples/pipelines/run.py [--work DIR] [--rounds 2] [--orders 200]

Writes the raw events (examples/pipeline_events.py), creates the lake, runs
``spark-pipelines run`` with ``ARROWLAKE_LAKE`` and ``PIPELINE_RAW`` set, then reads
``default.gold_daily_totals`` with pandas and compares it with pandas over the raw events.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pipeline_events import EventGenerator, check_gold, write_round  # noqa: E402

import arrowlake as al  # noqa: E402


#: The datasets of each layer, refreshed in this order.
LAYERS = [("bronze_orders", "bronze_customers"), ("silver_orders", "silver_customers")]


def spark_pipelines() -> str:
    """The ``spark-pipelines`` command of the PySpark next to this interpreter."""
    beside = Path(sys.executable).parent / "spark-pipelines"
    return str(beside) if beside.exists() else shutil.which("spark-pipelines") or \
        "spark-pipelines"


def run_pipeline(work: Path, *args: str) -> subprocess.CompletedProcess:
    """``spark-pipelines run`` of a copy of this folder in ``work`` (its storage there)."""
    project = work / "pipeline"
    if not project.exists():
        shutil.copytree(HERE, project, ignore=shutil.ignore_patterns("__pycache__", "run.py"))
        spec = project / "spark-pipeline.yml"
        # The storage root (checkpoints) must be an absolute URI: this run's own folder.
        spec.write_text("\n".join(
            f"storage: {(work / 'storage').as_uri()}" if line.startswith("storage:") else line
            for line in spec.read_text().splitlines()) + "\n")
    env = {**os.environ, "ARROWLAKE_LAKE": str(work / "lake"), "PIPELINE_RAW": str(work / "raw"),
           "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return subprocess.run([spark_pipelines(), "run", "--spec",
                           str(project / "spark-pipeline.yml"), *args],
                          cwd=project, env=env, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> tuple[object, object]:
    """Run the pipeline once; returns (gold read with pandas, the pandas computation)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", help="working directory (default: a new temporary one)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of raw events")
    parser.add_argument("--orders", type=int, default=200, help="order events per round")
    args = parser.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="arrowlake-sdp-"))
    events = EventGenerator()
    for n in range(args.rounds):
        write_round(work / "raw", n, *events.round(args.orders))
    al.connect(work / "lake").close()
    # A flow reads an arrowlake dataset with format("arrowlake").load(...): Spark does not see
    # that as a dependency (and a read of the dataset by name hands the reader no name), so
    # the flows of one run start together. One run per layer, each incremental.
    # The last run refreshes everything (a sink's flow runs only in a run of every flow).
    for layer in [*LAYERS, ()]:
        done = run_pipeline(work, *(("--refresh", ",".join(layer)) if layer else ()))
        if done.returncode != 0:
            raise RuntimeError(f"spark-pipelines run --refresh {','.join(layer)} failed "
                               f"({done.returncode}):\n{done.stdout[-4000:]}\n"
                               f"{done.stderr[-8000:]}")
    lake = al.connect(work / "lake")
    return check_gold(lake.table("default.gold_daily_totals").to_pandas(), work / "raw", work)


if __name__ == "__main__":
    gold_df, expected_df = main()
    sys.exit(0 if gold_df.equals(expected_df) else 1)
