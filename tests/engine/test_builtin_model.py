"""The built-in model: deterministic random Llama checkpoints that Hugging Face transformers loads cleanly,
a tokenizer that agrees with transformers, the ``seawall model`` CLI, and the race-safe default cache dir."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from seawall.cli import main as cli_main
from services.common.errors import InvalidArgument
from services.engine import builtin_model as bm

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

# sha256 of model.safetensors for preset "tiny", seed 0. It pins the init scheme and proves the bytes do not
# depend on the machine; if the scheme changes on purpose, update it and bump BUILTIN_VERSION.
TINY_SEED0_SHA256 = "7a8b07a2a3ed7284ccec0e873b7357580ed18ae51a0d97d951eaacf794e10e2b"

TEXTS = [
    "Hello world",
    "Return a new list containing all items from the iterable in ascending order.",
    "  leading spaces,\ttabs\tand\n\nnewlines  ",
    "def f(x):\n    return x ** 2  # comment",
    "héllo wörld — naïve café, 日本語のテキスト, Ελληνικά, русский",
    "emoji: 🤖🚀 family 👨\u200d👩\u200d👧 flag 🇫🇷 skin 👍🏽",
    "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "",
]

OVERRIDE_CASE = {
    "hidden_size": 96,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "tie_word_embeddings": False,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
}


def _hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """These models are tiny: one thread avoids OpenMP hand-off costs that dominate on small shared CPUs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bm.init_model(tmp_path_factory.mktemp("tiny") / "model")


def _load_hf(directory: Path):
    transformers.logging.set_verbosity_error()
    model, info = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
    return model.eval(), info


# ------------------------------------------------------------------------------------------ determinism


def test_same_seed_gives_identical_bytes(tmp_path: Path, tiny_dir: Path) -> None:
    again = bm.init_model(tmp_path / "again")
    assert _hashes(again) == _hashes(tiny_dir)
    sharded_a = bm.init_model(tmp_path / "sa", num_shards=3, seed=7)
    sharded_b = bm.init_model(tmp_path / "sb", num_shards=3, seed=7)
    assert _hashes(sharded_a) == _hashes(sharded_b)


def test_weights_are_pinned_across_machines(tiny_dir: Path) -> None:
    digest = hashlib.sha256((tiny_dir / "model.safetensors").read_bytes()).hexdigest()
    assert digest == TINY_SEED0_SHA256, (
        "init scheme or sampler changed: update the hash and bump BUILTIN_VERSION"
    )


def test_different_seeds_differ(tmp_path: Path, tiny_dir: Path) -> None:
    other = bm.init_model(tmp_path / "seed1", seed=1)
    a, b = load_file(tiny_dir / "model.safetensors"), load_file(other / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert not torch.equal(a[name], b[name]), name
    # Everything but the weights is the same.
    assert {k: v for k, v in _hashes(other).items() if k != "model.safetensors"} == {
        k: v for k, v in _hashes(tiny_dir).items() if k != "model.safetensors"
    }


def test_layer_count_does_not_perturb_other_tensors(tmp_path: Path) -> None:
    two = load_file(bm.init_model(tmp_path / "two", overrides={"num_hidden_layers": 2}) / "model.safetensors")
    four = load_file(bm.init_model(tmp_path / "four") / "model.safetensors")
    assert set(two) < set(four)
    for name, tensor in two.items():
        assert torch.equal(tensor, four[name]), name


def test_init_statistics(tiny_dir: Path) -> None:
    weights = load_file(tiny_dir / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in weights.values())
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert abs(q.std().item() - bm.QK_GAIN / 128**0.5) < 0.01
    norm = weights["model.layers.0.input_layernorm.weight"]
    assert abs(norm.mean().item() - 1.0) < 0.05 and 0.05 < norm.std().item() < 0.15
    final = weights["model.norm.weight"] / bm.FINAL_NORM_GAIN
    assert abs(final.mean().item() - 1.0) < 0.05 and 0.05 < final.std().item() < 0.15


# ------------------------------------------------------------------------------------------ HF loading


@pytest.mark.oracle
@pytest.mark.parametrize(
    ("preset", "overrides", "num_shards"),
    [
        ("tiny", None, 1),
        ("small", {"num_hidden_layers": 2}, 1),
        ("tiny", None, 3),
        ("tiny", OVERRIDE_CASE, 1),
    ],
    ids=["tiny", "small-2-layers", "tiny-3-shards", "overrides"],
)
def test_transformers_loads_checkpoint(
    tmp_path: Path, preset: str, overrides: dict | None, num_shards: int
) -> None:
    out = bm.init_model(tmp_path / "m", preset=preset, overrides=overrides, num_shards=num_shards)
    expected = bm.resolve_config(preset, overrides)
    model, info = _load_hf(out)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert not info["error_msgs"], info

    cfg = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"):  # fmt: skip
        assert getattr(cfg, key) == expected[key], key
    rope = cfg.rope_parameters
    assert rope["rope_theta"] == expected["rope_theta"]
    if expected["rope_scaling"]:
        assert rope["rope_type"] == "llama3"
        for key, value in expected["rope_scaling"].items():
            assert rope[key] == value, key
    else:
        assert rope["rope_type"] == "default"

    # HF holds exactly our tensors (tied: lm_head is embed_tokens).
    ours = {}
    for f in sorted(out.glob("*.safetensors")):
        ours.update(load_file(f))
    theirs = model.state_dict()
    for name, tensor in ours.items():
        assert torch.equal(theirs[name], tensor), name
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied == expected["tie_word_embeddings"]
    assert ("lm_head.weight" in ours) == (not expected["tie_word_embeddings"])

    with torch.no_grad():
        logits = model(torch.arange(10, 42).unsqueeze(0)).logits
    assert logits.shape == (1, 32, expected["vocab_size"]) and torch.isfinite(logits).all()


def test_sharded_index(tmp_path: Path) -> None:
    out = bm.init_model(tmp_path / "m", num_shards=3)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert files == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert not (out / "model.safetensors").exists()
    names = [spec[0] for spec in bm._weight_specs(bm.resolve_config("tiny"))]
    assert sorted(index["weight_map"]) == sorted(names)
    assert sorted(set(index["weight_map"].values())) == files
    total = 0
    for f in files:
        tensors = load_file(out / f)
        assert tensors, f
        assert all(index["weight_map"][n] == f for n in tensors)
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    assert index["metadata"]["total_size"] == total


def test_config_and_generation_files(tiny_dir: Path) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 1, 2)
    assert (
        config["hidden_act"] == "silu" and config["attention_bias"] is False and config["mlp_bias"] is False
    )
    assert {k: config[k] for k in bm.PRESETS["tiny"]} == bm.PRESETS["tiny"]
    generation = json.loads((tiny_dir / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 0, "eos_token_id": [1, 5], "pad_token_id": 2, "do_sample": False}
    tok_config = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    assert tok_config["model_max_length"] == 4096 and tok_config["add_bos_token"] is False
    assert (tiny_dir / "tokenizer.json").read_bytes() == bm.TOKENIZER_PATH.read_bytes()


@pytest.mark.oracle
def test_greedy_decoding_is_not_degenerate(tiny_dir: Path) -> None:
    model, _ = _load_hf(tiny_dir)
    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    gaps, distinct = [], []
    for prompt in [
        "Return the number of items in a container.",
        "The quick brown fox",
        "def main():",
        "Hello",
    ]:
        ids = torch.tensor([tok.encode(prompt).ids])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=48, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True, eos_token_id=None, pad_token_id=2)  # fmt: skip
        scores = torch.stack(out.scores)[:, 0]
        top2 = scores.topk(2, dim=-1).values
        gaps.append(top2[:, 0] - top2[:, 1])
        distinct.append(len(set(out.sequences[0, ids.shape[1] :].tolist())))
    gap = torch.cat(gaps)
    print(f"\ntop1-top2 logit gap: median {gap.median():.3f}, p5 {gap.quantile(0.05):.3f}, min {gap.min():.4f}; "
          f"logit std {scores.std(-1).mean():.2f}; distinct tokens per 48 generated: {distinct}")  # fmt: skip
    assert min(distinct) >= 24, distinct
    assert gap.median() > 0.5


@pytest.mark.oracle
def test_forward_latency_tiny(tiny_dir: Path) -> None:
    model, _ = _load_hf(tiny_dir)
    ids = torch.arange(100, 132).unsqueeze(0)
    with torch.no_grad():
        model(ids)  # warm-up
        start = time.perf_counter()
        for _ in range(5):
            model(ids)
    print(
        f"\ntiny HF forward, batch 1 x 32 tokens, 1 thread: {(time.perf_counter() - start) / 5 * 1e3:.1f} ms"
    )


# ------------------------------------------------------------------------------------------ tokenizer


def test_tokenizer_facts() -> None:
    tok = Tokenizer.from_file(str(bm.TOKENIZER_PATH))
    assert tok.get_vocab_size() == 4096
    specials = [
        bm.BOS_TOKEN,
        bm.EOS_TOKEN,
        bm.PAD_TOKEN,
        bm.START_HEADER_TOKEN,
        bm.END_HEADER_TOKEN,
        bm.EOT_TOKEN,
    ]
    assert [tok.token_to_id(t) for t in specials] == [0, 1, 2, 3, 4, 5]
    assert tok.encode("Hello world").ids[0] != 0  # no bos added to plain text
    assert tok.encode("<|eot_id|>").ids == [5]  # specials are single tokens


@pytest.mark.oracle
def test_auto_tokenizer_agrees_with_tokenizers(tiny_dir: Path) -> None:
    raw = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(tiny_dir)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (0, 1, 2)
    assert len(hf) == 4096
    for text in TEXTS:
        ids = raw.encode(text).ids
        assert hf(text)["input_ids"] == ids, text
        assert hf.encode(text) == ids, text
        assert raw.decode(ids, skip_special_tokens=False) == text
        assert hf.decode(ids) == text


@pytest.mark.oracle
def test_chat_template_adds_bos_once(tiny_dir: Path) -> None:
    hf = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🤖"}]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi 🤖<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)[
        "input_ids"
    ]
    assert ids[0] == 0 and ids.count(0) == 1
    assert ids == Tokenizer.from_file(str(tiny_dir / "tokenizer.json")).encode(text).ids


@pytest.mark.slow
def test_committed_tokenizer_matches_training() -> None:
    script = REPO / "scripts" / "train_tokenizer.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert (bm.BUILTIN_DIR / "corpus.txt").stat().st_size <= 1_500_000


# ------------------------------------------------------------------------------------------ validation


def test_unknown_preset_names_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"unknown preset 'huge'; valid presets: small, tiny"):
        bm.init_model(tmp_path / "m", preset="huge")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"overrides": {"hiden_size": 64}}, r"unknown override field\(s\) \['hiden_size'\]"),
        ({"overrides": {"num_key_value_heads": 3}}, "must be a multiple of num_key_value_heads"),
        ({"overrides": {"hidden_size": 0}}, "hidden_size must be a positive integer"),
        ({"overrides": {"num_hidden_layers": True}}, "num_hidden_layers must be a positive integer"),
        ({"overrides": {"vocab_size": 100}}, "vocab_size must be at least the tokenizer's 4096"),
        ({"overrides": {"torch_dtype": "int8"}}, "torch_dtype must be one of"),
        (
            {"overrides": {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}},
            "rope_scaling must be null or",
        ),
        ({"overrides": "hidden_size=64"}, "overrides must be a dict"),
        ({"num_shards": 0}, "num_shards must be an integer from 1 to 38"),
        ({"num_shards": 39}, "num_shards must be an integer from 1 to 38"),
        ({"seed": -1}, "seed must be a non-negative integer"),
    ],
)
def test_bad_arguments_raise_invalid_argument(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        bm.init_model(tmp_path / "m", **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_bfloat16_override(tmp_path: Path) -> None:
    out = bm.init_model(tmp_path / "m", overrides={"torch_dtype": "bfloat16", "num_hidden_layers": 1})
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}


# ------------------------------------------------------------------------------------------ atomic writes


def test_refuses_non_empty_dir_and_overwrites_only_models(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(InvalidArgument, match="already exists and is not empty"):
        bm.init_model(target)
    with pytest.raises(InvalidArgument, match="holds no config.json"):
        bm.init_model(target, overwrite=True)
    assert (target / "notes.txt").read_text() == "keep me"

    model = bm.init_model(tmp_path / "model", num_shards=2)
    bm.init_model(model, seed=3, overwrite=True)
    assert sorted(p.name for p in model.glob("*.safetensors")) == ["model.safetensors"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_empty_existing_dir_is_filled(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    assert bm.is_complete(bm.init_model(tmp_path / "m"))


def test_failed_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(bm, "_write_checkpoint", boom)
    with pytest.raises(OSError, match="disk full"):
        bm.init_model(tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_default_model_dir_and_ensure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    monkeypatch.setenv("SEAWALL_CACHE_DIR", str(tmp_path / "cache"))
    expected = tmp_path / "cache" / "models" / "builtin-tiny-v1"
    assert bm.default_model_dir() == expected
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda _: bm.ensure_default_model(), range(6)))
    assert results == [expected] * 6
    assert _hashes(expected) == _hashes(tiny_dir)
    assert sorted(p.name for p in expected.parent.iterdir()) == ["builtin-tiny-v1"]  # no temp dirs left

    mtime = (expected / "model.safetensors").stat().st_mtime_ns
    assert bm.ensure_default_model() == expected
    assert (expected / "model.safetensors").stat().st_mtime_ns == mtime  # idempotent: not rebuilt

    (expected / "model.safetensors").unlink()  # a damaged cache entry is rebuilt
    assert bm.ensure_default_model() == expected
    assert _hashes(expected) == _hashes(tiny_dir)


def test_default_cache_dir_falls_back_to_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SEAWALL_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert bm.default_model_dir() == tmp_path / ".cache" / "seawall" / "models" / "builtin-tiny-v1"


# ------------------------------------------------------------------------------------------ CLI


def test_cli_model_init(tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_dir: Path) -> None:
    target = tmp_path / "cli"
    assert cli_main(["model", "init", str(target)]) == 0
    assert capsys.readouterr().out.strip() == str(target)
    assert _hashes(target) == _hashes(tiny_dir)

    assert cli_main(["model", "init", str(target), "--seed", "5"]) == 2
    err = capsys.readouterr().err
    assert "already exists and is not empty; pass --force" in err and "Traceback" not in err
    assert _hashes(target) == _hashes(tiny_dir)

    assert cli_main(["model", "init", str(target), "--seed", "5", "--shards", "2", "--force"]) == 0
    assert (target / "model.safetensors.index.json").is_file() and not (target / "model.safetensors").exists()

    assert cli_main(["model", "init", str(tmp_path / "bad"), "--shards", "0"]) == 2
    assert "num_shards must be an integer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["model", "init", str(tmp_path / "bad"), "--preset", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_cli_model_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SEAWALL_CACHE_DIR", str(tmp_path))
    assert cli_main(["model", "path"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == tmp_path / "models" / "builtin-tiny-v1"
    assert bm.is_complete(printed)
