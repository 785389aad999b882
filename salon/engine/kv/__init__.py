"""KV data: the paged cache tensors and their layout, the device prefix cache, the kvstore link and payload format."""
