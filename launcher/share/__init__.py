"""Model distribution: what the launching host offers its ranks, and which host serves what."""
