"""``seawall run-batch`` at its edges: bad lines, bad models, stop strings, preemption under a small pool."""

from __future__ import annotations

import json
import re

import pytest
from tokenizers import Tokenizer

from seawall.cli import main
from services.common.sampling_params import SamplingParams
from services.engine.config import EngineConfig
from services.scheduler.core.scheduler import SchedulerConfig


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _req(custom_id, **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


def _run(tmp_path, model_dir, rows, *flags):
    src = _write(tmp_path / "in.jsonl", rows)
    dst = tmp_path / "out.jsonl"
    code = main(["run-batch", "-i", str(src), "-o", str(dst), "--model", str(model_dir), *flags])
    return code, [json.loads(x) for x in dst.read_text().splitlines()] if dst.exists() else []


def test_bad_lines_get_400_and_the_others_still_run(tmp_path, tiny_model_dir):
    rows = [
        _req("ok", prompt="Hello there", max_tokens=4, temperature=0),
        "{not json",
        _req("temp", prompt="x", temperature="hot"),
        _req("neg", prompt="x", max_tokens=0),
        _req("topp", prompt="x", top_p=1.5),
        {"custom_id": "url", "method": "POST", "url": "/v1/embeddings", "body": {"prompt": "x"}},
        _req("long", prompt=[5] * 5000),
        _req("vocab", prompt=[1, 2, 99999]),
        _req("empty", prompt=""),
        _req("noprompt", max_tokens=3),
        _req("ok2", prompt=[10, 11, 12], max_tokens=3, temperature=0),
        _req("bias", prompt="x", logit_bias={"99999": 1}),
        _req("allowed", prompt=[10, 11, 12], max_tokens=5, temperature=0.9, allowed_token_ids=[7, 70, 700]),
        _req("cut", prompt=list(range(10, 60)), max_tokens=3, truncate_prompt_tokens=7),
        _req("badcut", prompt="x", truncate_prompt_tokens=0),
        # Only the end-of-sequence tokens, which min_tokens holds back: found when it samples, not at intake.
        _req("stuck", prompt=[10, 11, 12], max_tokens=5, temperature=0, allowed_token_ids=[1, 5], min_tokens=2),
    ]
    code, out = _run(tmp_path, tiny_model_dir, rows)
    assert code == 0
    by_id = {r["custom_id"]: r for r in out}
    assert len(out) == len(rows)
    assert by_id["cut"]["response"]["body"]["usage"]["prompt_tokens"] == 7
    for cid in ("ok", "ok2", "allowed", "cut"):
        body = by_id[cid]["response"]["body"]
        assert by_id[cid]["response"]["status_code"] == 200 and by_id[cid]["error"] is None
        assert len(body["choices"][0]["token_ids"]) == body["usage"]["completion_tokens"] > 0
    assert set(by_id["allowed"]["response"]["body"]["choices"][0]["token_ids"]) <= {7, 70, 700}
    expected = {"temp": "temperature", "neg": "max_tokens", "topp": "top_p", "url": "/v1/completions",
                "long": "context", "vocab": "vocabulary", "empty": "empty", "noprompt": "prompt",
                "bias": "logit_bias names token id 99999",
                "stuck": "no token satisfies allowed_token_ids (2 tokens) and min_tokens (2",
                "badcut": "truncate_prompt_tokens must be an integer >= 1"}
    for cid, word in expected.items():
        resp = by_id[cid]["response"]
        assert resp["status_code"] == 400, (cid, resp)
        assert word in resp["body"]["error"]["message"], (cid, resp)
    bad_json = [r for r in out if r["custom_id"] is None]
    assert bad_json and "not valid JSON" in bad_json[0]["error"]["message"]


@pytest.mark.parametrize(
    ("make_dir", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "no config.json"),
    ],
)
def test_unusable_model_dirs_give_one_clear_line(tmp_path, capsys, make_dir, message):
    src = _write(tmp_path / "in.jsonl", [_req("a", prompt="hi")])
    code = main(["run-batch", "-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--model", str(make_dir(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_unreadable_input_and_unwritable_output_give_one_clear_line_before_anything_runs(tmp_path, capsys):
    # These raised IsADirectoryError, UnicodeDecodeError or FileNotFoundError as tracebacks; an output path
    # that could not be written failed only after the whole batch had run. Refused before any model loads,
    # so no --model is needed here.
    good = _write(tmp_path / "in.jsonl", [_req("a", prompt="hi")])
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe not utf-8\n")
    cases = [([str(tmp_path), str(tmp_path / "o.jsonl")], "cannot read input file"),
             ([str(binary), str(tmp_path / "o.jsonl")], "is not UTF-8 text"),
             ([str(good), str(tmp_path)], "is a directory"),
             ([str(good), str(tmp_path / "missing" / "o.jsonl")], "does not exist")]
    for (src, dst), message in cases:
        code = main(["run-batch", "-i", src, "-o", dst, "--model", str(tmp_path / "no-model-needed")])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, err


def test_malformed_checkpoint_names_the_problem(tmp_path, capsys, tiny_model_dir):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (broken / name).write_bytes((tiny_model_dir / name).read_bytes())
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)
    src = _write(tmp_path / "in.jsonl", [_req("a", prompt="hi")])
    code = main(["run-batch", "-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--model", str(broken)])
    err = capsys.readouterr().err
    assert code == 2 and "model.safetensors" in err and "Traceback" not in err
    (broken / "config.json").write_text("{broken")
    assert main(["run-batch", "-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--model", str(broken)]) == 2
    assert "config.json is not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("decode_steps", [1, 8])
def test_stop_strings_cut_the_text(tmp_path, tiny_model_dir, decode_steps):
    from seawall.offline.engine import OfflineEngine
    from services.scheduler.core.scheduler import SchedulerConfig

    engine = OfflineEngine(EngineConfig(model=str(tiny_model_dir)), SchedulerConfig(num_decode_steps=decode_steps))
    prompt = engine.encode("The quick brown fox")
    free = engine.generate([prompt], [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)])[0]
    assert len(free.text) > 4
    # The text that output token k adds, for the first k in 3..6 whose text is new: with 8 passes per step,
    # tokens 1..8 come in one result, so the stop falls inside it.
    decode = engine.tokenizer.decode
    stop = next(added for k in range(3, 7)
                if (added := decode(free.token_ids[: k + 1])[len(decode(free.token_ids[:k])):]).strip()
                and added not in decode(free.token_ids[:k]))
    cut = engine.generate([prompt], [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True,
                                                    stop=(stop,))])[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop)]
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)]
    # It ends at the token that completed the stop string, though with 8 passes per step more were sampled.
    assert stop not in decode(cut.token_ids[:-1]) and 4 <= len(cut.token_ids) <= 7


@pytest.mark.parametrize("structured", [None, ("regex", "[a-z]{200}")])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_under_a_small_pool_keeps_outputs(tiny_model_dir, mode, structured):
    """With structured output too: after a recompute the worker's new matcher catches up on the tokens so far."""
    from seawall.offline.engine import OfflineEngine

    prompts = [[(13 * i + j) % 3000 + 20 for j in range(40 + 9 * i)] for i in range(8)]
    params = [SamplingParams(max_tokens=30, temperature=0, ignore_eos=structured is None,
                             structured_output=structured)] * len(prompts)
    roomy = OfflineEngine(EngineConfig(model=str(tiny_model_dir)), SchedulerConfig(chunk_size=32))
    expected = [c.token_ids for c in roomy.generate(prompts, params)]
    assert sum(roomy.scheduler.preemptions.values()) == 0
    block_bytes = roomy.runner.layout.bytes_per_block
    tight = OfflineEngine(
        EngineConfig(model=str(tiny_model_dir), kv_cache_bytes=24 * block_bytes, swap_bytes=64 * block_bytes),
        SchedulerConfig(chunk_size=32, preemption_mode=mode),
    )
    got = tight.generate(prompts, params)
    assert tight.scheduler.preemptions[mode] > 0, f"the pool was meant to force {mode} preemptions"
    assert [c.token_ids for c in got] == expected
    assert tight.blocks.num_free == tight.blocks.num_blocks
    if structured is not None:  # 30 tokens into 200 letters: letters only, every one
        assert all(re.fullmatch("[a-z]+", c.text) and c.finish_reason == "length" for c in got)


def test_a_request_a_whole_prompt_policy_could_never_fit_in_a_step_is_refused_up_front(tmp_path, tiny_model_dir):
    # Before, the 70-token prompt waited forever behind a 64-token step (the mesh never answered; here it ended
    # with an error blaming the KV pool).
    rows = [_req("long", prompt=[7] * 70, max_tokens=4), _req("fits", prompt=[7] * 40, max_tokens=24, ignore_eos=True)]
    code, out = _run(tmp_path, tiny_model_dir, rows, "--policy", "vllm", "--max-num-batched-tokens", "64")
    assert code == 0
    long, fits = out
    assert long["response"]["status_code"] == 400
    assert "may need 74 tokens in one step" in long["error"]["message"]
    assert fits["response"]["status_code"] == 200
    assert len(fits["response"]["body"]["choices"][0]["token_ids"]) == 24


def test_a_request_the_pool_can_never_hold_is_refused_up_front(tmp_path, tiny_model_dir):
    from seawall.offline.engine import OfflineEngine

    block_bytes = OfflineEngine(EngineConfig(model=str(tiny_model_dir))).runner.layout.bytes_per_block
    rows = [_req("big", prompt=[7] * 40, max_tokens=200), _req("fits", prompt=[7] * 40, max_tokens=20)]
    code, out = _run(tmp_path, tiny_model_dir, rows, "--kv-cache-bytes", str(8 * block_bytes))
    assert code == 0
    big, fits = out
    assert big["response"]["status_code"] == 429 and "lower max_tokens" in big["error"]["message"]
    assert fits["response"]["status_code"] == 200
    assert len(fits["response"]["body"]["choices"][0]["token_ids"]) == 20


def test_max_model_len_bounds_prompt_and_output(tmp_path, tiny_model_dir, capsys):
    rows = [_req("long", prompt=[7] * 64, max_tokens=1), _req("capped", prompt=[7] * 40, max_tokens=100, ignore_eos=True)]
    code, out = _run(tmp_path, tiny_model_dir, rows, "--max-model-len", "64")
    assert code == 0
    long, capped = out
    assert long["response"]["status_code"] == 400 and "the model's context is 64" in long["error"]["message"]
    choice = capped["response"]["body"]["choices"][0]
    assert len(choice["token_ids"]) == 24 and choice["finish_reason"] == "length"
    (tmp_path / "too-long").mkdir()
    code, out = _run(tmp_path / "too-long", tiny_model_dir, rows, "--max-model-len", "1000000")
    assert code == 2 and out == []
    assert "max_model_len 1000000 must be between 1 and the model's max_position_embeddings" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [(["--decode-steps", "0"], "--decode-steps must be >= 1"),
                                                (["--chunk-size", "0"], "--chunk-size must be >= 1"),
                                                (["--speculative-tokens", "2", "--decode-steps", "8"],
                                                 "exclude each other")])
def test_a_bad_scheduling_flag_is_named_as_typed(tmp_path, tiny_model_dir, capsys, flags, message):
    code, out = _run(tmp_path, tiny_model_dir, [_req("a", prompt="hi", max_tokens=1)], *flags)
    assert code == 2 and out == []
    assert message in capsys.readouterr().err


def test_n_choices_and_an_echo_scored_as_transformers_scores_it(tmp_path, tiny_model_dir):
    transformers = pytest.importorskip("transformers")
    import torch

    prompt = [(13 * i + 5) % 4000 + 10 for i in range(40)]
    rows = [_req("n", prompt="Once upon a time", n=3, max_tokens=6, temperature=1.0, seed=5),
            _req("echo", prompt=prompt, echo=True, logprobs=2, max_tokens=3, temperature=0),
            _req("echo-text", prompt="Hello there", echo=True, max_tokens=2),
            _req("bad-n", prompt="x", n=0),
            _req("scored", prompt=prompt, prompt_logprobs=0, max_tokens=1, temperature=0),
            _req("echo-ids", prompt=prompt, echo=True, logprobs=2, max_tokens=3, temperature=0,
                 return_tokens_as_token_ids=True)]
    code, out = _run(tmp_path, tiny_model_dir, rows, "--chunk-size", "16")  # the prompt scored in 3 chunks
    assert code == 0
    by_id = {r["custom_id"]: r["response"] for r in out}
    choices = by_id["n"]["body"]["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2] and len({tuple(c["token_ids"]) for c in choices}) == 3
    usage = by_id["n"]["body"]["usage"]
    n_prompt = len(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).encode("Once upon a time").ids)
    assert usage["prompt_tokens"] == n_prompt  # once, though three choices ran it
    assert usage["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)
    echo = by_id["echo"]["body"]["choices"][0]
    ids, lp = echo["token_ids"], echo["logprobs"]
    assert len(lp["tokens"]) == len(prompt) + len(ids) and lp["token_logprobs"][0] is None
    named = by_id["echo-ids"]["body"]["choices"][0]["logprobs"]  # vLLM's return_tokens_as_token_ids
    assert named["tokens"] == [f"token_id:{t}" for t in prompt + ids] and named["text_offset"] == lp["text_offset"]
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    everything = prompt + ids
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([everything])).logits[0].float(), -1)
    want = ref[torch.arange(len(everything) - 1), torch.tensor(everything[1:])]
    torch.testing.assert_close(torch.tensor(lp["token_logprobs"][1:]), want, atol=1e-4, rtol=0)
    assert by_id["echo-text"]["body"]["choices"][0]["text"].startswith("Hello there")
    scored = by_id["scored"]["body"]["choices"][0]["prompt_logprobs"]
    assert scored[0] is None and [list(e) for e in scored[1:]] == [[str(t)] for t in prompt[1:]]
    torch.testing.assert_close(torch.tensor([scored[p][str(prompt[p])]["logprob"] for p in range(1, len(prompt))]),
                               want[: len(prompt) - 1], atol=1e-4, rtol=0)
    assert by_id["bad-n"]["status_code"] == 400 and "n must be an integer" in by_id["bad-n"]["body"]["error"]["message"]


def test_speculative_tokens_give_the_same_greedy_output(tmp_path, looping_model_dir, capsys):
    # Multi-step decoding is on by default and excludes speculation: --speculative-tokens alone turns it off.
    rows = [_req(f"r{i}", prompt=[(31 * i + 7 * j) % 4000 + 10 for j in range(5 + 9 * i)], max_tokens=90,
                 temperature=0) for i in range(4)]
    outputs = []
    for flags in ([], ["--speculative-tokens", "4"]):
        code, out = _run(tmp_path, looping_model_dir, rows, *flags)
        assert code == 0
        outputs.append([r["response"]["body"]["choices"][0]["token_ids"] for r in out])
    assert outputs[0] == outputs[1] and all(len(ids) == 90 for ids in outputs[0])
    kept = re.search(r"speculative decoding: (\d+) of (\d+) draft tokens kept", capsys.readouterr().err)
    assert kept and int(kept[1]) > 90  # of 360 tokens, a quarter or more came as kept drafts (once loops formed)


def test_lines_select_lora_adapters_by_model(tmp_path, tiny_model_dir, lora_dirs):
    from tests.lora_adapters import peft_greedy

    prompt = [9, 40, 300, 22, 7, 81, 15]
    rows = [_req("alpha", prompt=prompt, max_tokens=12, temperature=0, model="alpha"),
            _req("base", prompt=prompt, max_tokens=12, temperature=0, model=tiny_model_dir.name),
            _req("unknown", prompt=prompt, max_tokens=12, model="gamma")]
    code, out = _run(tmp_path, tiny_model_dir, rows, "--lora-modules", f"alpha={lora_dirs['alpha']}")
    assert code == 0
    by_id = {o["custom_id"]: o["response"] for o in out}
    alpha = by_id["alpha"]["body"]
    assert alpha["model"] == "alpha"
    assert alpha["choices"][0]["token_ids"] == peft_greedy(tiny_model_dir, lora_dirs["alpha"], [prompt], 12)[0]
    assert by_id["base"]["body"]["choices"][0]["token_ids"] == peft_greedy(tiny_model_dir, None, [prompt], 12)[0]
    assert by_id["unknown"]["status_code"] == 404
    assert "'gamma' does not exist" in by_id["unknown"]["body"]["error"]["message"]


def test_chat_lines_are_rendered_by_the_chat_template_and_answered_as_chat_completions(tmp_path, tiny_model_dir):
    from services.engine.checkpoint import load_checkpoint_meta
    from services.scheduler.chat_prompt import ChatPrompt

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why bursts?"}]
    meta = load_checkpoint_meta(tiny_model_dir)
    encode = lambda text, special: meta.tokenizer.encode(text, add_special_tokens=special).ids  # noqa: E731
    rendered = ChatPrompt(tiny_model_dir, encode).render({"messages": messages})
    chat = {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": messages, "max_completion_tokens": 6, "temperature": 0, "logprobs": True,
                     "top_logprobs": 2, "n": 2}}
    rows = [chat, _req("same", prompt=rendered, max_tokens=6, temperature=0),
            {**chat, "custom_id": "tools", "body": {**chat["body"], "tools": [{"type": "function",
                                                                              "function": {"name": "f"}}]}},
            {**chat, "custom_id": "stream", "body": {**chat["body"], "stream": True}},
            {**chat, "custom_id": "ids", "body": {**chat["body"], "return_tokens_as_token_ids": True}}]
    code, out = _run(tmp_path, tiny_model_dir, rows)
    by_id = {line["custom_id"]: line for line in out}
    body = by_id["chat"]["response"]["body"]
    same = by_id["same"]["response"]["body"]["choices"][0]
    assert code == 0 and body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for choice in body["choices"]:  # greedy: both choices are the completion of the rendered prompt
        assert choice["message"] == {"role": "assistant", "content": same["text"]}
        assert choice["token_ids"] == same["token_ids"] and choice["finish_reason"] == same["finish_reason"]
        assert [t["token"] for t in choice["logprobs"]["content"]] and len(choice["logprobs"]["content"][0]["top_logprobs"]) == 2
    assert body["usage"]["prompt_tokens"] == len(rendered)
    named = by_id["ids"]["response"]["body"]["choices"][0]
    assert [t["token"] for t in named["logprobs"]["content"]] == [f"token_id:{t}" for t in named["token_ids"]]
    assert by_id["tools"]["response"]["status_code"] == 400 and "tools" in by_id["tools"]["error"]["message"]
    assert by_id["stream"]["response"]["status_code"] == 400


def test_special_tokens_are_added_as_the_http_api_adds_them(tmp_path, tiny_model_dir):
    # A tokenizer adding a BOS (Llama's): a text prompt gets it unless add_special_tokens is false, a chat
    # prompt only the one its template writes.
    import shutil

    from tests.bos_tokenizer import add_bos_to_every_text

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    add_bos_to_every_text(model)
    messages = [{"role": "user", "content": "Why bursts?"}]
    rows = [_req("text", prompt="Why bursts?", max_tokens=1), _req("bare", prompt="Why bursts?", max_tokens=1,
                                                                  add_special_tokens=False),
            {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": messages, "max_tokens": 1}}]
    code, out = _run(tmp_path, model, rows)
    used = {line["custom_id"]: line["response"]["body"]["usage"]["prompt_tokens"] for line in out}
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    want = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert code == 0 and used == {"text": len(tokenizer("Why bursts?").input_ids),
                                  "bare": len(tokenizer("Why bursts?").input_ids) - 1, "chat": len(want)}


def test_chat_lines_are_rendered_by_the_template_given_on_the_command_line(tmp_path, tiny_model_dir):
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:")
    chat = {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "Why bursts?"}], "max_tokens": 1}}
    code, out = _run(tmp_path, tiny_model_dir, [chat], "--chat-template", str(template))
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    want = tokenizer.encode("user: Why bursts?\nassistant:", add_special_tokens=False).ids
    assert code == 0 and out[0]["response"]["body"]["usage"]["prompt_tokens"] == len(want)
    assert main(["run-batch", "-i", "-", "-o", "-", "--chat-template", str(tmp_path / "none.jinja")]) != 0


def test_lines_that_leave_sampling_out_take_the_models_generation_config(tmp_path, tiny_model_dir):
    # vLLM's --generation-config auto: top_k 1 makes sampling greedy, max_new_tokens is max_tokens' default.
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "top_k": 1, "max_new_tokens": 5}))
    prompt = list(range(40, 70))
    rows = [_req("defaults", prompt=prompt, ignore_eos=True, seed=3),
            _req("own", prompt=prompt, ignore_eos=True, seed=3, top_k=-1, max_tokens=7),
            _req("greedy", prompt=prompt, ignore_eos=True, temperature=0, max_tokens=7)]
    code, out = _run(tmp_path, model, rows)
    got = {line["custom_id"]: line["response"]["body"]["choices"][0]["token_ids"] for line in out}
    assert code == 0 and got["defaults"] == got["greedy"][:5] and len(got["own"]) == 7
    assert got["own"] != got["greedy"]  # its own top_k: sampled (seeded) from the whole vocabulary
    code, out = _run(tmp_path, model, rows[:1], "--generation-config", "vllm")
    assert code == 0 and len(out[0]["response"]["body"]["choices"][0]["token_ids"]) == 16  # the API's default
    code, out = _run(tmp_path, model, rows[:1], "--override-generation-config", '{"max_new_tokens": 3}')
    assert code == 0 and out[0]["response"]["body"]["choices"][0]["token_ids"] == got["greedy"][:3]


def test_a_chat_line_without_a_limit_generates_to_the_end_of_the_context(tmp_path, tiny_model_dir):
    # OpenAI's chat sets no default max_tokens; vLLM's is what the context leaves (completions keep 16).
    messages = [{"role": "user", "content": "Why bursts?"}]
    rows = [{"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": messages, "ignore_eos": True}},
            _req("text", prompt="Why bursts?", ignore_eos=True)]
    code, out = _run(tmp_path, tiny_model_dir, rows, "--max-model-len", "64")
    usage = {line["custom_id"]: line["response"]["body"]["usage"] for line in out}
    assert code == 0 and usage["chat"]["prompt_tokens"] + usage["chat"]["completion_tokens"] == 64
    assert usage["text"]["completion_tokens"] == 16
