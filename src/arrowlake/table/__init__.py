"""Tables: the facade, writes, merge-on-read of primary keys, schema evolution, maintenance."""
