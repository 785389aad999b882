"""KV data: the paged cache tensors, their layout and block bookkeeping, the kvstore payload format."""
