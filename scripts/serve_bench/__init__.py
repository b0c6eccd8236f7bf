"""The pieces of scripts/bench_serve.py: `mlx-cluster serve` next to mlx-lm's own server.

procs (processes we start and stop), servers (the two servers under test), client (streamed
requests and rounds through the openai client), stats (per request and per round figures),
prompts (fresh text), workloads/ (one module a kind of work), runner (the schedule), report
(summary, table, notes, JSON) and main (one run, end to end).
"""
