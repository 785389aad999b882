"""The engine's model: config, tokenizer, CausalLM (float32 reference and int8 paths), loading."""

from services.engine.model.attention import AttentionBackend, DenseAttention
from services.engine.model.checkpoint import convert, load_model, main_convert
from services.engine.model.config import LayerSpec, ModelConfig, gemma3_270m_config, synthetic_config
from services.engine.model.model import CausalLM
from services.engine.model.tokenizer import IncrementalDetokenizer, Tokenizer

__all__ = [
    "AttentionBackend", "CausalLM", "DenseAttention", "IncrementalDetokenizer", "LayerSpec", "ModelConfig",
    "Tokenizer", "convert", "gemma3_270m_config", "load_model", "main_convert", "synthetic_config",
]
