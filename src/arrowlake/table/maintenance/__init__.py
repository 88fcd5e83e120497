"""Table maintenance: compaction (both modes), switching modes, snapshot expiry and orphan removal,
health."""
