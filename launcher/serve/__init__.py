"""`mlx-cluster serve`: the HTTP API, the ranks behind it, failover."""
