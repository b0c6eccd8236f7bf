"""A model's architecture and what its weights weigh, from config.json alone."""
