"""One module per architecture (`general.architecture` of the GGUF), built from the shared layers.

Each module provides:
    config_from_gguf(f, model_id, sha256, vocab) -> ModelConfig   the model description from the metadata
    read_weights(f, config) -> dict[str, Tensor]                  float32 weights under the builder's names
    build_layer(config, i, weights, kernel_ops) -> decoder layer   layer(x, positions, attn) -> x
    LAYER_NORMS, KEY_SMOOTHING, INT8_SMOOTH, INT8_ACTIVATION_TERMS, INT8_RECIPE  the int8 recipe (quantize.py,
    linear.py, checkpoint.py)
    INT8_CHECKPOINT_FORMAT                                        the checkpoint's format tag (checkpoint.py)
    INT8_GROUP32_RECIPE                                           the Linears with group32 activations (builder.py)
    INT8_GROUP32_RESCORED                                         the group32 recipe's rescored Linears (builder.py)
"""

from __future__ import annotations

from types import ModuleType

from salon.engine.model.models import gemma3, llama

ARCHITECTURES: dict[str, ModuleType] = {"gemma3": gemma3, "llama": llama}


class UnsupportedArchitecture(ValueError):
    pass


def architecture(name: str) -> ModuleType:
    module = ARCHITECTURES.get(name)
    if module is None:
        raise UnsupportedArchitecture(
            f"architecture {name!r} is not supported (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    return module
