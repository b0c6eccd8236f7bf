"""The `mlx-cluster` CLI and everything that touches hosts: probing, files, ranks, discovery."""
