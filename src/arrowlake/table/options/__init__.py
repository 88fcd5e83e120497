"""Table properties and options, checked when set: primary keys, merge engines and changelog
producers, compaction, maintenance policy."""
