"""Constrained decoding: a request's constraint compiled to a grammar (xgrammar), and per request a matcher
that fills the token bitmask of its next sampled row and advances over the tokens the request keeps."""
