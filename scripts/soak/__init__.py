"""The pieces of scripts/soak.py, a long mixed-load run of `mlx-cluster serve`.

serve (start serve, find its ranks, read their memory), kinds (the good requests, one function a
kind), hostile (bodies that must get a 4xx), load (client loops and the hostile trickle), sampler
(memory, /metrics and /health every few seconds), killer (the failover soak's rank kills),
verdict and replans (the criteria) and main (one soak, end to end).
"""
