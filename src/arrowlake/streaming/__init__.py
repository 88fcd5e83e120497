"""Streaming consumers (not built yet: see docs/architecture.md)."""
