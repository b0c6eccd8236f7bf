"""How a rank gets its model files: serving, fetching, manifests, digests, the cache folder."""
