"""Deterministic raw events for examples/spark_pipeline.py: orders as CSV, customers as JSON lines.

Every event has ``seq`` (global order) and ``op`` (``insert``, ``update``, ``delete``); an event
carries the whole row as it is after the event (a delete: as it was). :func:`final_state`
replays events with pandas, which is what the pipeline's tables must end up holding.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd

ORDER_COLUMNS = ["seq", "op", "order_id", "customer_id", "day", "amount"]
CUSTOMER_COLUMNS = ["seq", "op", "customer_id", "name", "region"]
REGIONS = ["eu", "us", "apac"]


class EventGenerator:
    """Rounds of events; the same seed gives the same events."""

    def __init__(self, seed: int = 7, customers: int = 20) -> None:
        self.rng = random.Random(seed)
        self.seq = 0
        self.n_customers = customers
        self.orders: dict[int, dict] = {}
        self.customers: dict[int, dict] = {}
        self.next_order = 1

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def round(self, n_orders: int) -> tuple[list[dict], list[dict]]:
        """``n_orders`` order events (inserts, then updates and deletes of earlier orders) and
        a few customer events."""
        rng = self.rng
        customer_events = []
        for cid in rng.sample(range(1, self.n_customers + 1), k=min(5, self.n_customers)):
            op = "update" if cid in self.customers else "insert"
            row = {"customer_id": cid, "name": f"customer-{cid}-{self.seq}",
                   "region": rng.choice(REGIONS)}
            self.customers[cid] = row
            customer_events.append({"seq": self._next(), "op": op, **row})
        order_events = []
        for _ in range(n_orders):
            live = sorted(self.orders)
            pick = rng.random()
            if live and pick < 0.2:
                oid = rng.choice(live)
                row = {**self.orders[oid], "amount": rng.randint(1, 500)}
                self.orders[oid] = row
                order_events.append({"seq": self._next(), "op": "update", **row})
            elif live and pick < 0.3:
                oid = rng.choice(live)
                row = self.orders.pop(oid)
                order_events.append({"seq": self._next(), "op": "delete", **row})
            else:
                oid = self.next_order
                self.next_order += 1
                row = {"order_id": oid, "customer_id": rng.randint(1, self.n_customers),
                       "day": f"2026-11-{rng.randint(1, 5):02d}", "amount": rng.randint(1, 500)}
                self.orders[oid] = row
                order_events.append({"seq": self._next(), "op": "insert", **row})
        return order_events, customer_events


def write_round(root: Path, number: int, order_events: list[dict],
                customer_events: list[dict]) -> None:
    """One file per kind and round: ``orders/round-N.csv`` and ``customers/round-N.jsonl``."""
    (root / "orders").mkdir(parents=True, exist_ok=True)
    (root / "customers").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(order_events, columns=ORDER_COLUMNS).to_csv(
        root / "orders" / f"round-{number:03d}.csv", index=False)
    with open(root / "customers" / f"round-{number:03d}.jsonl", "w") as out:
        for event in customer_events:
            out.write(json.dumps(event) + "\n")


def read_events(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    orders = pd.concat([pd.read_csv(p) for p in sorted((root / "orders").glob("*.csv"))])
    customers = pd.concat([pd.read_json(p, lines=True)
                           for p in sorted((root / "customers").glob("*.jsonl"))])
    return orders, customers


def final_state(events: pd.DataFrame, key: str) -> pd.DataFrame:
    """The rows left after replaying ``events`` in ``seq`` order: the last event per key,
    unless it is a delete."""
    last = events.sort_values("seq").groupby(key).tail(1)
    return last[last["op"] != "delete"].drop(columns=["seq", "op"])


def expected_gold(root: Path) -> pd.DataFrame:
    """The gold table computed with pandas from the raw events: per day, the total amount and
    the number of live orders."""
    orders, _ = read_events(root)
    live = final_state(orders, "order_id")
    out = live.groupby("day").agg(total=("amount", "sum"), orders=("order_id", "count"))
    return out.reset_index().sort_values("day").reset_index(drop=True)


def check_gold(gold: pd.DataFrame, root: Path, where: object) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A gold table as read back (days without live orders left out) and the pandas result over
    the raw events under ``root``, both in the same column types; prints them and whether they
    are equal. ``where`` names the lake or work folder in the output."""
    got = gold[gold["orders"] > 0].sort_values("day").reset_index(drop=True)
    types = {"day": str, "total": "int64", "orders": "int64"}
    got = got.astype(types)
    want = expected_gold(root).astype(types)
    print(f"lake: {where}")
    print(got.to_string(index=False))
    print("gold equals pandas over the raw events:", got.equals(want))
    return got, want
