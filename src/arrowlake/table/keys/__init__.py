"""The key path of primary-key tables: cutting rows into sorted runs, the per-bucket key index,
looking keys up, the cache of decoded runs."""
