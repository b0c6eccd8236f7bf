"""What runs inside a rank: MLX init, shard loading, decoding, serving, benchmarking."""
