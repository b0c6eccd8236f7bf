"""Model distribution: the launching host serves the model's files to its ranks."""
