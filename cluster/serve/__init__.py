"""The rank's serving loop (serve mode)."""
