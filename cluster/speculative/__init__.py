"""Speculative decoding inside the batch: drafts (prompt lookup, a client's prediction), one
forward that checks every sequence's drafts, and each sequence's KV cache rewound to its own
length."""
