"""bench_speculative.py's parts: the servers of each group, the workloads, one request's
figures, the report."""
