"""Changelogs of primary-key tables: changelog files, the lookup producer, the producers' choices,
deletion-vector changelogs, net changes."""
