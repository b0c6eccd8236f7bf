"""`topology setup`: what it takes to make the wiring ready (pure planning; no I/O here)."""
