"""salon: an LLM serving stack for long-running chat (gateway, engine, kvstore); see README.md."""
