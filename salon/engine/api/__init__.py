"""The engine's gRPC edge: the service bootstrap, the servicer, request validation and prompt rendering."""
