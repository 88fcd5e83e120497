"""Writes planned and committed: inputs, plain tables' appends, overwrites and deletes, primary-key
writes (merge on read and on write), MERGE INTO."""
