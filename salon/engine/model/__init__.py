"""The engine's model: GGUF files of the gemma3 and llama architectures, int8 and float32, their tokenizers
and chat templates.

    load(name, precision) -> LoadedModel(model, tokenizer, chat, source, sampling) (loader.py)
    model.forward(token_ids, positions, attn) -> hidden;  model.logits(hidden) -> logits
    chat.render(messages) -> RenderedChat (token ids, per-message segments);  chat.stop_token_ids
"""

from salon.engine.model.attention import AttentionBackend, DenseAttention
from salon.engine.model.config import LayerSpec, ModelConfig, synthetic_config
from salon.engine.model.convert import convert, main_convert
from salon.engine.model.loader import LoadedModel, ModelFile, config_for, load, load_model, open_model_file
from salon.engine.model.model import CausalLM
from salon.engine.model.tokenizer import IncrementalDetokenizer, Tokenizer

__all__ = [
    "AttentionBackend",
    "CausalLM",
    "DenseAttention",
    "IncrementalDetokenizer",
    "LayerSpec",
    "LoadedModel",
    "ModelConfig",
    "ModelFile",
    "Tokenizer",
    "config_for",
    "convert",
    "load",
    "load_model",
    "main_convert",
    "open_model_file",
    "synthetic_config",
]
