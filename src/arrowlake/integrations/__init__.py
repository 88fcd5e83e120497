"""Adapters between arrowlake and other engines (pandas, Polars, DuckDB, Spark, ...)."""
