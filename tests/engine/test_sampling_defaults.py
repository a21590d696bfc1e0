"""Where requests' default sampling comes from (vLLM's --generation-config): the checkpoint's
generation_config.json, none, or another directory's (services/engine/checkpoint.py ``sampling_defaults``)."""

from __future__ import annotations

import json
import shutil

import pytest

from services.common.errors import InvalidArgument, ModelLoadError
from services.engine.checkpoint import generation_override, load_checkpoint_meta, sampling_defaults


def test_auto_reads_the_checkpoints_vllm_none_and_a_directory_its_own(tmp_path, tiny_model_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.7, "top_p": 0.8}))
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"top_k": 5, "max_new_tokens": 64}))
    checkpoint = load_checkpoint_meta(model)
    assert sampling_defaults(checkpoint) == {"temperature": 0.7, "top_p": 0.8}
    assert sampling_defaults(checkpoint, "vllm") == {}
    assert sampling_defaults(checkpoint, str(other)) == {"top_k": 5, "max_tokens": 64}
    assert sampling_defaults(load_checkpoint_meta(tiny_model_dir)) == {}  # the built-in model recommends none
    with pytest.raises(ModelLoadError, match="no .*generation_config.json; give auto"):
        sampling_defaults(checkpoint, str(tmp_path / "missing"))
    (other / "generation_config.json").write_text(json.dumps({"temperature": -1}))
    with pytest.raises(InvalidArgument, match="generation_config.json: temperature must be >= 0"):
        sampling_defaults(checkpoint, str(other))


def test_an_override_goes_over_whichever_config_is_read(tmp_path, tiny_model_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.7, "top_p": 0.8}))
    checkpoint = load_checkpoint_meta(model)
    override = generation_override('{"temperature": 0.2, "max_new_tokens": 9}')
    assert sampling_defaults(checkpoint, "auto", override) == {"temperature": 0.2, "top_p": 0.8, "max_tokens": 9}
    assert sampling_defaults(checkpoint, "vllm", override) == {"temperature": 0.2, "max_tokens": 9}
    for text, message in (('{"temprature": 1}', "got temprature"), ("[1]", "takes an object of"),
                          ("{temperature: 1}", "is not JSON")):
        with pytest.raises(ValueError, match=message):
            generation_override(text)
