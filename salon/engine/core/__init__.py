"""The engine core: requests, the scheduler, KV block accounting, the step loop and its thread."""
