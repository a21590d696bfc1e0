"""LoRA adapters for tests, written by ``peft`` itself (the format users bring), and ``peft``'s greedy output,
the oracle for the engine's adapters."""

from __future__ import annotations

from pathlib import Path

import torch

# Two adapters unlike each other: every projection at rank 8, and q/k/v/up at rank 4 with rsLoRA's scaling.
ADAPTERS = {
    "alpha": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"]},
    "beta": {"r": 4, "lora_alpha": 8, "use_rslora": True, "target_modules": ["q_proj", "k_proj", "v_proj",
                                                                             "up_proj"]},
}


def causal_lm(model_dir):
    """The checkpoint's transformers causal LM in fp32: the auto class's, else the one its config names (Mistral 4,
    which transformers 5.25 maps for pretraining only)."""
    import json

    import transformers

    try:
        return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    except ValueError:
        name = json.loads((Path(model_dir) / "config.json").read_text())["architectures"][0]
        return getattr(transformers, name).from_pretrained(model_dir, dtype=torch.float32)


def make_adapter(model_dir, out_dir, seed: int, **config) -> Path:
    """A random (non-zero) adapter for ``model_dir`` saved by peft into ``out_dir``."""
    import peft

    model = causal_lm(model_dir)
    torch.manual_seed(seed)
    peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, **config)).save_pretrained(out_dir)
    return Path(out_dir)


def make_classifier_adapter(model_dir, out_dir, seed: int) -> Path:
    """A random adapter for the sequence classifier in ``model_dir`` as PEFT's task_type SEQ_CLS saves one: LoRA
    weights and the classifier head saved whole, here unlike the base model's (as training leaves it)."""
    import peft
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    tuned = peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, init_lora_weights=False,
                                                       target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        tuned.base_model.model.score.modules_to_save["default"].weight.normal_(0.0, 0.3)
    tuned.save_pretrained(out_dir)
    return Path(out_dir)


def peft_classifier(model_dir, adapter_dir):
    """The sequence classifier in ``model_dir`` with the adapter, as ``peft`` runs it (fp32, eval)."""
    import peft
    import transformers

    base = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    return peft.PeftModel.from_pretrained(base, adapter_dir).eval()


def peft_greedy(model_dir, adapter_dir, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy continuations of up to ``max_tokens`` tokens, each ending at its first end-of-sequence token (the
    checkpoint's generation config names them), with the adapter, or with the base model when ``adapter_dir``
    is None."""
    import peft

    model = causal_lm(model_dir)
    if adapter_dir is not None:
        model = peft.PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    with torch.no_grad():
        return [model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                               pad_token_id=0)[0, len(p):].tolist() for p in prompts]
