"""The engine core: the scheduler, the output states, the step loop and its thread."""
