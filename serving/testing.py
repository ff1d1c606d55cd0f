"""Small constructed models for tests and benchmarks: built in seconds, offline, deterministic.

- `build_tokenizer()`: a byte-level BPE tokenizer trained on a fixed corpus, with a chat template and
  an EOS token, so tests exercise the same tokenizer code paths as a real model.
- `tiny_llama()`: a randomly initialised Llama causal LM of any depth/width.
- `tiny_qwen2()`: a second architecture, Qwen2-style: tied embeddings, grouped-query attention, biased
  q/k/v projections, an odd layer count: what "your own target" looks like next to the reference.
- `zero_extended_target()`: a deep target whose extra layers contribute nothing (their output
  projections are zeroed), stacked on a shallow draft's layers with the same embeddings and head. The
  pair has acceptance exactly 1, so a benchmark on it measures engine overhead against theory.

Nothing here is used in production paths.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\n\nfor line in sys.stdin:\n    print(line.strip())\n",
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
    "To be, or not to be, that is the question.",
    "Please write a short poem about the sea and the sky.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "Hello! How can I help you today? Here is a list of things to do: 1. read 2. write 3. test.",
] * 20


def build_tokenizer(vocab_size: int = 384) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (vocab <= `vocab_size`) with `<|im_start|>`/`<|im_end|>` specials."""
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", bos_token="<|im_start|>",
        pad_token="<|endoftext|>", unk_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama(
    tokenizer: PreTrainedTokenizerFast, n_layers: int = 2, hidden: int = 64, heads: int = 4,
    seed: int = 0, tie_embeddings: bool = True,
) -> LlamaForCausalLM:
    """A randomly initialised Llama causal LM sized for CPU tests."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=n_layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=1024, tie_word_embeddings=tie_embeddings,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    # Random init gives near-uniform logits; a larger output scale makes greedy choices decisive
    # and sampled distributions peaked, like a trained model.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0) if not tie_embeddings else model.model.embed_tokens.weight.mul_(8.0)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def tiny_qwen2(tokenizer: PreTrainedTokenizerFast, n_layers: int = 5, hidden: int = 64, heads: int = 4,
               kv_heads: int = 2, seed: int = 0) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM with tied input/output embeddings. Weights drawn wider than
    transformers' default (std 0.1): with tied embeddings a default-initialised model echoes its last input
    token forever, here greedy outputs cycle through a few tokens, like a small trained model's loops."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=n_layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=1024,
        tie_word_embeddings=True, initializer_range=0.1, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def zero_extended_target(draft: LlamaForCausalLM, n_layers: int) -> LlamaForCausalLM:
    """A `n_layers`-deep target computing exactly the draft's function.

    Layers beyond the draft's are copies whose attention `o_proj` and MLP `down_proj` are zero, so they
    add nothing to the residual stream; embeddings, final norm and head are the draft's. Cost grows
    with depth while outputs stay identical, so acceptance is exactly 1.
    """
    draft_layers = draft.config.num_hidden_layers
    if n_layers <= draft_layers:
        raise ValueError(f"n_layers ({n_layers}) must exceed the draft's {draft_layers} layers")
    config = copy.deepcopy(draft.config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[0]] * n_layers
    target = LlamaForCausalLM(config).eval()
    target_state = target.state_dict()
    for name, tensor in draft.state_dict().items():
        target_state[name] = tensor.clone()
    target.load_state_dict(target_state)
    with torch.no_grad():
        for layer in target.model.layers[draft_layers:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    target.generation_config = copy.deepcopy(draft.generation_config)
    return target


def save_model(model: LlamaForCausalLM | Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, path: str | Path) -> Path:
    """Save model + tokenizer as a safetensors model dir that `from_pretrained` (and the Engine) loads."""
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_pair(
    root: str | Path, target_layers: int = 2, draft_layers: int = 1, hidden: int = 64, seed: int = 0,
) -> tuple[Path, Path]:
    """Save an independent random target and draft (same tokenizer) under `root`; return their dirs."""
    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=target_layers, hidden=hidden, seed=seed)
    draft = tiny_llama(tokenizer, n_layers=draft_layers, hidden=hidden, seed=seed + 1)
    root = Path(root)
    return save_model(target, tokenizer, root / "target"), save_model(draft, tokenizer, root / "draft")
