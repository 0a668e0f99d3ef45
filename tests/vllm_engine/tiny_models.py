"""Tiny random-weight checkpoints for the real-engine tests, written with transformers.

No hub: each builder writes ``config.json`` and safetensors weights into a folder. Weights
are seeded, in bfloat16, with ``initializer_range`` 0.2 so that greedy outputs depend on
the KV cache (with the default 0.02 a random model often repeats one token whatever its
context, and a wrong restore would go unnoticed).

* ``llama``: full attention only (one KV-cache group);
* ``gemma3``: one sliding-window layer and one full layer (two KV-cache groups);
* ``eagle_draft``: a one-layer ``EagleLlamaForCausalLM`` draft for a ``llama`` target
  (no ``lm_head``: the draft shares the target's);
* ``mimo``: a MiMo-style model (Qwen2 body plus one MTP module, ``model.mtp_layers.0``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

VOCAB = 1024
_COMMON: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
    "max_position_embeddings": 8192, "initializer_range": 0.2, "tie_word_embeddings": False,
}


def _save(model: Any, folder: Path) -> Path:
    model.to(torch.bfloat16).save_pretrained(folder)
    return folder


def llama(folder: Path, **overrides: Any) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return _save(LlamaForCausalLM(LlamaConfig(**{**_COMMON, **overrides})), folder)


def gemma3(folder: Path, sliding_window: int = 256) -> Path:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(1)
    config = Gemma3TextConfig(**_COMMON, head_dim=32, sliding_window=sliding_window,
                              layer_types=["sliding_attention", "full_attention"])
    return _save(Gemma3ForCausalLM(config), folder)


def eagle_draft(folder: Path) -> Path:
    """A one-layer EAGLE draft: a Llama layer (without its input norm, which the draft
    skips) and ``fc``, which mixes the token embedding with the target's hidden state."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    config = LlamaConfig(**{**_COMMON, "num_hidden_layers": 1})
    body = LlamaForCausalLM(config).state_dict()
    skip = ("lm_head.", "model.norm.", "model.layers.0.input_layernorm.")
    weights = {name.removeprefix("model."): w for name, w in body.items()
               if not name.startswith(skip)}
    hidden = config.hidden_size
    weights["fc.weight"] = torch.randn(hidden, 2 * hidden) * config.initializer_range
    config.architectures = ["EagleLlamaForCausalLM"]
    return _save_weights(config, weights, folder)


def mimo(folder: Path) -> Path:
    """A MiMo-style target with one MTP module (vLLM's ``mtp`` speculative method)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    config = Qwen2Config(**_COMMON)
    weights = dict(Qwen2ForCausalLM(config).state_dict())
    module = Qwen2ForCausalLM(Qwen2Config(**{**_COMMON, "num_hidden_layers": 1})).state_dict()
    prefix = "model.mtp_layers.0."
    for name, w in module.items():
        if name.startswith("model.layers.0."):
            weights[prefix + name.removeprefix("model.layers.0.")] = w
    hidden = config.hidden_size
    for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        weights[f"{prefix}{norm}.weight"] = torch.ones(hidden)
    weights[f"{prefix}input_proj.weight"] = torch.randn(hidden, 2 * hidden) * 0.2
    config.architectures = ["MiMoForCausalLM"]
    config.num_nextn_predict_layers = 1
    return _save_weights(config, weights, folder)


def _save_weights(config: Any, weights: dict[str, torch.Tensor], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config.torch_dtype = "bfloat16"
    config.save_pretrained(folder)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in weights.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def qwen3next(folder: Path) -> Path:
    """A Qwen3-Next-class hybrid: gated-delta-net linear attention and full attention,
    alternating (two KV-cache groups in vLLM: a Mamba-kind state group and full attention).
    Linear head dims are 128: the CPU GDN kernel refuses smaller ones."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(4)
    config = Qwen3NextConfig(
        **{**_COMMON, "num_hidden_layers": 4}, head_dim=32, linear_num_value_heads=4,
        linear_num_key_heads=2, linear_key_head_dim=128, linear_value_head_dim=128,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        layer_types=["linear_attention", "full_attention"] * 2)
    return _save(Qwen3NextForCausalLM(config), folder)
