"""A model's default sampling: the GGUF's general.sampling.* keys, else the known model's card, else neutral."""

from __future__ import annotations

import gguf
import pytest

from salon.engine.model.gguf_file import GGUFMetadataError, open_gguf
from salon.engine.model.loader import open_model_file
from salon.engine.model.sampling_defaults import NEUTRAL, SamplingDefaults, sampling_defaults
from salon.engine.model.sources import resolve_source
from tests.model.gguf_files import write_llama_gguf


def write_sampling_gguf(path, **keys) -> None:
    """A GGUF holding only metadata: general.architecture and the given general.sampling.* keys."""
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in keys.items():
        name = f"general.sampling.{key}"
        if isinstance(value, int):
            w.add_int32(name, value)
        else:
            w.add_float32(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_the_gguf_keys_win_and_the_card_fills_what_they_leave_out(tmp_path):
    path = tmp_path / "m.gguf"
    write_sampling_gguf(path, temp=0.5, top_k=40, penalty_repeat=1.25)
    card = {"temperature": 0.2, "top_p": 0.9, "min_p": 0.05}
    assert sampling_defaults(open_gguf(path), card) == SamplingDefaults(
        temperature=0.5, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.25
    )
    assert sampling_defaults(open_gguf(path), None) == SamplingDefaults(
        temperature=0.5, top_k=40, top_p=1.0, min_p=0.0, repetition_penalty=1.25
    )


def test_every_key_is_read_by_llama_cpps_name(tmp_path):
    path = tmp_path / "m.gguf"
    write_sampling_gguf(path, temp=0.0, top_k=7, top_p=0.75, min_p=0.125, penalty_repeat=1.5)
    assert sampling_defaults(open_gguf(path), None) == SamplingDefaults(0.0, 7, 0.75, 0.125, 1.5)


@pytest.mark.parametrize(("key", "value"), [("temp", -1.0), ("top_p", 0.0), ("penalty_repeat", 0.0), ("min_p", 2.0)])
def test_a_value_no_request_could_set_is_refused_naming_the_key(tmp_path, key, value):
    path = tmp_path / "m.gguf"
    write_sampling_gguf(path, **{key: value})
    with pytest.raises(GGUFMetadataError, match=rf"general\.sampling\.{key} = "):
        sampling_defaults(open_gguf(path), None)


def test_smollm2_takes_its_known_models_entry():
    """The shipped file has no general.sampling.* keys: the known-models table gives the card's temperature and
    top-p and the repetition penalty bench/chat_openings.py chose."""
    mf = open_model_file("smollm2-135m-instruct")
    assert not [k for k in mf.gguf.fields if k.startswith("general.sampling.")]
    assert mf.sampling == SamplingDefaults(temperature=0.2, top_k=0, top_p=0.9, min_p=0.0, repetition_penalty=1.1)
    # The same file by path is not the known model: no card, so neutral.
    by_path = open_model_file(str(resolve_source("smollm2-135m-instruct").path))
    assert by_path.sampling == NEUTRAL == SamplingDefaults(1.0, 0, 1.0, 0.0, 1.0)


def test_a_model_file_without_keys_or_card_is_neutral(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path)
    assert open_model_file(str(path)).sampling == NEUTRAL
