"""Configs of real models, read from their GGUF files: for tests that plan layouts from a real geometry."""

from __future__ import annotations

from salon.engine.model.config import ModelConfig
from salon.engine.model.loader import config_for


def gemma3_270m_config() -> ModelConfig:
    """Gemma 3 270M's config, read from its GGUF (18 layers, MQA, every 6th layer global, 512-token windows)."""
    return config_for("gemma-3-270m")
