"""From checked hosts and a model to a plan: strategy, shards, memory, speed, hostfiles."""
