"""The `eagle3` draft kind: one decoder layer over the target's own hidden states (EAGLE-3).

The draft reads, for each position j, the target's residual stream at three layers (low / mid / high:
`aux_layer_ids`, vLLM's convention: id i is the *input* of target layer i, HF `hidden_states[i]`),
fused by `fc` [3*Ht -> H], together with the embedding of the token at j+1 (the target's own
embedding table, shared, never saved). One decoder layer whose attention reads both halves
(q/k/v over 2H inputs) turns that into a hidden state that predicts the token at j+2 over a reduced
draft vocabulary. When the draft runs ahead of the target, its own output hidden state stands in for
the target features it does not have yet (training-time test teaches it to cope).

Which tokens it may propose lives in two buffers saved with the weights, never recomputed at load:
`d2t[i]` (target id = i + d2t[i]) and `t2d` (bool mask over the target vocabulary).

On disk this is the `speculators` EAGLE-3 format (vllm-project/speculators), so vLLM serves the
directory as it is: `config.json` with `speculators_model_type: "eagle3"` and `model.safetensors`.
`save_eagle3` / `load_eagle3` are the one pair that owns that contract. This module holds the model and
its format; it does not decode (draftwheel.serving.engine.eagle_decoding), train (draftwheel.training.eagle_train) or export for
other machines (draftwheel.serving.engine.eagle_export adds the target's id and embedding table).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from draftwheel.serving.engine.row_invariant import work_dtype

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SPECULATORS_TYPE = "eagle3"
SPECULATORS_VERSION = "0.3.0"  # the speculators config layout this writer follows


class Eagle3FormatError(ValueError):
    """A directory is not a valid speculators EAGLE-3 draft; the message names the field."""


@dataclass
class Eagle3Config:
    """Shapes and provenance of an EAGLE-3 draft (mirrors the speculators config fields)."""

    hidden_size: int                 # draft layer width (= the target's hidden size here)
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int                  # the target's vocabulary (embedding table rows)
    draft_vocab_size: int            # rows of the draft's LM head
    target_hidden_size: int
    aux_layer_ids: list[int]         # target layers whose inputs are fused (low, mid, high)
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    speculative_tokens: int = 4      # default k advertised to vLLM
    verifier_name: str = ""          # the target's Hugging Face id, "" if unknown (speculators_config.verifier)
    verifier_architectures: list[str] = field(default_factory=list)
    target_sha256: str = ""          # weights sha256 of the target it was trained for
    confidence_temperature: float = 1.0  # the chain cut reads softmax(logits / this): fitted by training so the
                                         # draft's top-1 probability matches how often the target agrees

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def for_target(cls, target_config: Any, draft_vocab_size: int, aux_layer_ids: list[int] | None = None,
                   **extra: Any) -> "Eagle3Config":
        """A config sized for a HF target config; default aux layers are EAGLE-3's (2, L/2, L-3)
        (for targets under 6 layers: first, middle, last)."""
        aux = aux_layer_ids or default_aux_layer_ids(target_config.num_hidden_layers)
        rope = getattr(target_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") or getattr(target_config, "rope_theta", None) or 10000.0
        return cls(hidden_size=target_config.hidden_size, num_attention_heads=target_config.num_attention_heads,
                   num_key_value_heads=target_config.num_key_value_heads,
                   intermediate_size=target_config.intermediate_size, vocab_size=target_config.vocab_size,
                   draft_vocab_size=draft_vocab_size, target_hidden_size=target_config.hidden_size,
                   aux_layer_ids=list(aux), rms_norm_eps=target_config.rms_norm_eps, rope_theta=float(theta),
                   max_position_embeddings=target_config.max_position_embeddings,
                   verifier_architectures=list(getattr(target_config, "architectures", None) or []), **extra)


def default_aux_layer_ids(layers: int) -> list[int]:
    """EAGLE-3's target layers for a target of `layers` layers: (2, L/2, L-3); under 6: first, middle, last."""
    return [2, layers // 2, layers - 3] if layers >= 6 else [0, layers // 2, layers - 1]


@functools.lru_cache(maxsize=16)
def _rotary_table(d: int, theta: float, length: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, d] for positions 0..length-1, computed once: a draft step is a handful of tiny
    ops, and recomputing the table cost about a fifth of each one."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))  # [d/2]
    angles = torch.arange(length, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]  # [L, d/2]
    angles = torch.cat([angles, angles], -1)  # [L, d]
    return angles.cos(), angles.sin()


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (Llama's rotate-half form): x[..., T, d], positions[T] -> same shape."""
    d = x.shape[-1]
    length = 1 << int(positions.max()).bit_length()  # a power of two above every position: few distinct tables
    cos, sin = _rotary_table(d, float(theta), length, str(x.device))
    cos, sin = cos[positions], sin[positions]  # [T, d]
    half = d // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention whose q/k/v read 2H inputs (embedding half + feature half)."""

    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.c = c
        d = c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * d, c.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x[B, T, 2H], positions[T] -> q[B, nh, T, d], k[B, nkv, T, d], v[B, nkv, T, d] (rotary applied)."""
        b, t, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        return rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta), v

    def project_out(self, heads: torch.Tensor) -> torch.Tensor:
        """Per-head attention outputs[B, nh, T, d] -> o_proj over the concatenated heads, [B, T, H]."""
        b, _, t, _ = heads.shape
        return self.o_proj(heads.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3Layer(nn.Module):
    """The EAGLE-3 first (and only) decoder layer: normed [embedding, feature] in, the residual
    stream carries the feature half. Parameter names match speculators' `layers.0.*`."""

    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.mlp = MLP(c)

    def qkv(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """embeds[B, T, H], hidden[B, T, H] -> q, k, v for `Attention.attend`."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], -1)  # [B, T, 2H]
        return self.self_attn.qkv(x, positions)

    def finish(self, attn_out: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Residual + MLP: attention output[B, T, H] and the input feature half[B, T, H] -> hidden[B, T, H]."""
        h = hidden + attn_out
        return h + self.mlp(self.post_attention_layernorm(h))


class DraftKV:
    """The draft's own KV cache for one request: k/v[1, nkv, S, d], grown by `append`, cut by `crop`."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], 2)
        self.v = v if self.v is None else torch.cat([self.v, v], 2)
        return self.k, self.v

    def crop(self, length: int) -> None:
        """Keep the first `length` positions."""
        if self.k is not None and length < self.length:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]


@dataclass(eq=False)
class DraftCall:
    """One request's draft forward, as a decoding loop asks for it: append the slots `token_ids[T]` with
    `features` to `kv` -- the target's aux features [T, 3*Ht], projected by `fc` first when `project`,
    or the draft's own earlier hidden states [T, H] -- and read the last slot's hidden state and draft
    logits."""
    token_ids: torch.Tensor
    features: torch.Tensor
    kv: DraftKV
    project: bool = False


class Eagle3Draft(nn.Module):
    """fc + one decoder layer + norm + draft-vocabulary head; the embedding table is the target's."""

    def __init__(self, config: Eagle3Config, d2t: torch.Tensor | None = None, t2d: torch.Tensor | None = None):
        super().__init__()
        c = self.c = config
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(c)])
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        if d2t is None:  # identity mapping onto the first draft_vocab_size target ids
            d2t = torch.zeros(c.draft_vocab_size, dtype=torch.long)
        if t2d is None:
            t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
            t2d[torch.arange(c.draft_vocab_size) + d2t] = True
        self.register_buffer("d2t", d2t.long(), persistent=True)
        self.register_buffer("t2d", t2d.bool(), persistent=True)
        self.embed_tokens: nn.Module | None = None  # the target's, attached by `attach_target`
        # What check_compatible and the engine read off any draft model.
        self.config = _PublicConfig(vocab_size=c.vocab_size, max_position_embeddings=c.max_position_embeddings)

    @property
    def draft_to_target(self) -> torch.Tensor:
        """draft id -> target id, [Vd] long."""
        return torch.arange(self.c.draft_vocab_size, device=self.d2t.device) + self.d2t

    def attach_target(self, target_model: nn.Module) -> "Eagle3Draft":
        """Share the target's (frozen) input embedding table; check the shapes agree."""
        tc = target_model.config
        if tc.hidden_size != self.c.target_hidden_size or tc.vocab_size != self.c.vocab_size:
            raise ValueError(f"eagle3 draft was built for hidden {self.c.target_hidden_size} / vocab "
                             f"{self.c.vocab_size}, the target has {tc.hidden_size} / {tc.vocab_size}")
        if max(self.c.aux_layer_ids) >= tc.num_hidden_layers:
            raise ValueError(f"eagle3 aux layers {self.c.aux_layer_ids} exceed the target's "
                             f"{tc.num_hidden_layers} layers")
        # Plain attribute (not a registered submodule): the table belongs to the target and is never saved.
        object.__setattr__(self, "embed_tokens", target_model.get_input_embeddings())
        return self

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.embed_tokens(token_ids)

    @torch.inference_mode()
    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """Fuse target features: aux[T, 3*Ht] -> [T, H]."""
        return self.fc(aux.to(self.fc.weight.dtype))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden[..., H] -> draft-vocabulary logits[..., Vd]."""
        return self.lm_head(self.norm(hidden))

    def extend(self, token_ids: torch.Tensor, features: torch.Tensor, kv: DraftKV) -> torch.Tensor:
        """Append T slots to the request's cache and return their hidden states [T, H].

        token_ids[T]: the token at each slot's j+1; features[T, H]: fc-projected target features or the
        draft's own earlier outputs. Slot j sits at rotary position j+1 (the token's position), as in
        speculators' training layout.
        """
        return self._slots([DraftCall(token_ids, features, kv)])[0]

    def extend_many(self, calls: list[DraftCall]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Run several requests' `DraftCall`s in one forward: (hidden[H] of each call's last slot, its
        draft logits[Vd] in float32), in call order. One call alone is the decoding loop's step one
        request at a time."""
        out, sizes = self._slots(calls)
        last = out[torch.tensor(sizes).cumsum(0) - 1]  # [B, H]
        with torch.inference_mode():
            logits = self.logits(last).float()  # [B, Vd]
        return list(zip(last.unbind(0), logits.unbind(0)))

    @torch.inference_mode()
    def _slots(self, calls: list[DraftCall]) -> tuple[torch.Tensor, list[int]]:
        """The hidden states [N, H] of every slot of every call (as `extend` describes a call's), and
        each call's slot count. Every slot goes through the linear layers (fc, q/k/v, o, MLP) together;
        attention runs per call over its own cache."""
        layer = self.layers[0]
        sizes = [call.token_ids.shape[0] for call in calls]
        projected = [i for i, call in enumerate(calls) if call.project]
        features = [call.features for call in calls]
        if projected:  # one fc over every call's target features
            fused = self.project(torch.cat([calls[i].features for i in projected])).split(
                [sizes[i] for i in projected])
            for i, part in zip(projected, fused):
                features[i] = part
        hidden = torch.cat(features).unsqueeze(0)  # [1, N, H]
        positions = torch.cat([torch.arange(call.kv.length + 1, call.kv.length + t + 1)
                               for call, t in zip(calls, sizes)])
        q, k, v = layer.qkv(self.embed(torch.cat([call.token_ids for call in calls])).unsqueeze(0), hidden, positions)
        heads, offset = [], 0
        for call, t in zip(calls, sizes):
            rows = slice(offset, offset + t)
            start = call.kv.length
            k_all, v_all = call.kv.append(k[:, :, rows], v[:, :, rows])
            # slot i may see every cached slot and the new slots up to itself
            mask = torch.ones(t, start + t, dtype=torch.bool).tril(diagonal=start) if t > 1 else None
            # A drafted token is one query row, where PyTorch's bfloat16 CPU kernel costs ~4x float32's
            # (`work_dtype`); masked calls of several rows measured faster in bfloat16 and stay in it.
            query = q[:, :, rows]
            work = work_dtype(query) if t == 1 else query.dtype
            out = F.scaled_dot_product_attention(query.to(work), k_all.to(work), v_all.to(work),
                                                 attn_mask=mask, enable_gqa=True)
            heads.append(out.to(q.dtype))
            offset += t
        return layer.finish(layer.self_attn.project_out(torch.cat(heads, 2)), hidden)[0], sizes


@dataclass
class _PublicConfig:
    vocab_size: int
    max_position_embeddings: int


def _layer_config(c: Eagle3Config) -> dict[str, Any]:
    """speculators' `transformer_layer_config`: a one-layer Llama config."""
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden_size,
            "num_hidden_layers": 1, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
            "intermediate_size": c.intermediate_size, "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta, "max_position_embeddings": c.max_position_embeddings,
            "vocab_size": c.vocab_size, "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": False}


def config_json(c: Eagle3Config) -> dict[str, Any]:
    """The speculators EAGLE-3 config.json for `c`."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": SPECULATORS_TYPE,
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": _layer_config(c),
        "draft_vocab_size": c.draft_vocab_size,
        "norm_before_residual": False,
        "target_hidden_size": c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(c.aux_layer_ids),
        "speculators_config": {
            "algorithm": SPECULATORS_TYPE,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": c.speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": c.verifier_name, "architectures": list(c.verifier_architectures)},
        },
        # Ours, ignored by speculators/vLLM: which target weights the draft was trained for, and the
        # temperature that calibrates its confidence for the chain cut.
        "draftwheel": {"draft_kind": SPECULATORS_TYPE, "target_sha256": c.target_sha256,
                       "confidence_temperature": c.confidence_temperature},
    }


def _field(data: dict, key: str, where: str) -> Any:
    if key not in data:
        raise Eagle3FormatError(f"{where}: missing field {key!r}")
    return data[key]


def parse_config(data: dict[str, Any]) -> Eagle3Config:
    """config.json -> Eagle3Config; raises Eagle3FormatError naming the missing or wrong field."""
    if data.get("speculators_model_type") != SPECULATORS_TYPE:
        raise Eagle3FormatError(f"speculators_model_type: expected {SPECULATORS_TYPE!r}, "
                                f"got {data.get('speculators_model_type')!r}")
    layer = _field(data, "transformer_layer_config", "config.json")
    if _field(layer, "num_hidden_layers", "transformer_layer_config") != 1:
        raise Eagle3FormatError("transformer_layer_config.num_hidden_layers: only 1 is supported")
    spec = _field(data, "speculators_config", "config.json")
    verifier = _field(spec, "verifier", "speculators_config")
    methods = _field(spec, "proposal_methods", "speculators_config")
    ours = data.get("draftwheel", {})
    hidden = _field(layer, "hidden_size", "transformer_layer_config")
    return Eagle3Config(
        hidden_size=hidden, num_attention_heads=_field(layer, "num_attention_heads", "transformer_layer_config"),
        num_key_value_heads=_field(layer, "num_key_value_heads", "transformer_layer_config"),
        intermediate_size=_field(layer, "intermediate_size", "transformer_layer_config"),
        vocab_size=_field(layer, "vocab_size", "transformer_layer_config"),
        draft_vocab_size=_field(data, "draft_vocab_size", "config.json"),
        target_hidden_size=data.get("target_hidden_size") or hidden,
        aux_layer_ids=list(_field(data, "eagle_aux_hidden_state_layer_ids", "config.json")),
        rms_norm_eps=layer.get("rms_norm_eps", 1e-5), rope_theta=layer.get("rope_theta", 10000.0),
        max_position_embeddings=layer.get("max_position_embeddings", 8192),
        speculative_tokens=methods[0].get("speculative_tokens", 4) if methods else 4,
        verifier_name=verifier.get("name_or_path") or "", verifier_architectures=verifier.get("architectures") or [],
        target_sha256=ours.get("target_sha256", ""), confidence_temperature=_temperature(ours),
    )


def _temperature(ours: dict[str, Any]) -> float:
    value = ours.get("confidence_temperature", 1.0)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise Eagle3FormatError(f"draftwheel.confidence_temperature: must be a number > 0, got {value!r}")
    return float(value)


def save_eagle3(draft: Eagle3Draft, path: str | Path, tokenizer: Any = None) -> Path:
    """Write `path/config.json` + `path/model.safetensors` (+ the tokenizer, for our loaders)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in draft.state_dict().items()}
    save_file(state, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    (path / CONFIG_FILE).write_text(json.dumps(config_json(draft.c), indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def load_eagle3(path: str | Path) -> Eagle3Draft:
    """Load a draft written by `save_eagle3` (or any speculators EAGLE-3 dir of this layout)."""
    path = Path(path)
    config = parse_config(json.loads((path / CONFIG_FILE).read_text()))
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"eagle3 draft {path}: {WEIGHTS_FILE} is missing")
    state = load_file(str(weights))
    for key in ("d2t", "t2d"):
        if key not in state:
            raise Eagle3FormatError(f"{weights}: missing tensor {key!r}")
    draft = Eagle3Draft(config, d2t=state["d2t"], t2d=state["t2d"])
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if missing:
        raise Eagle3FormatError(f"{weights}: missing tensors {sorted(missing)}")
    return draft.eval()


def is_eagle3_dir(path: str | Path) -> bool:
    config = Path(path) / CONFIG_FILE
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("speculators_model_type") == SPECULATORS_TYPE
    except (ValueError, OSError):
        return False


def vocab_from_counts(counts: torch.Tensor, size: int, always: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FR-Spec's draft vocabulary: the `size` most frequent target ids (plus `always`, e.g. EOS).

    counts[Vt] -> (d2t[size] long offsets, t2d[Vt] bool); draft ids are sorted by target id.
    """
    size = min(size, counts.shape[0])
    scores = counts.double().clone()
    for token in always or []:
        scores[token] = math.inf
    chosen = torch.topk(scores, size).indices.sort().values  # [size] target ids, ascending
    t2d = torch.zeros(counts.shape[0], dtype=torch.bool)
    t2d[chosen] = True
    return chosen - torch.arange(size), t2d


REQUIRED_TENSORS = ("fc.weight", "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
                    "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
                    "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
                    "layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight",
                    "layers.0.post_attention_layernorm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")


def check_export(path: str | Path) -> Eagle3Config:
    """Check a directory against the speculators EAGLE-3 contract vLLM reads; raise Eagle3FormatError
    naming the first problem, return the parsed config."""
    path = Path(path)
    config = parse_config(json.loads((path / CONFIG_FILE).read_text()))
    state = load_file(str(path / WEIGHTS_FILE))
    missing = [k for k in REQUIRED_TENSORS if k not in state]
    if missing:
        raise Eagle3FormatError(f"{path / WEIGHTS_FILE}: missing tensors {missing}")
    d2t, t2d = state["d2t"], state["t2d"]
    if d2t.dtype != torch.int64 or t2d.dtype != torch.bool:
        raise Eagle3FormatError(f"d2t/t2d: expected int64/bool, got {d2t.dtype}/{t2d.dtype}")
    if d2t.shape != (config.draft_vocab_size,) or t2d.shape != (config.vocab_size,):
        raise Eagle3FormatError(f"d2t/t2d: shapes {tuple(d2t.shape)}/{tuple(t2d.shape)} do not match "
                                f"draft_vocab_size {config.draft_vocab_size} / vocab_size {config.vocab_size}")
    targets = torch.arange(config.draft_vocab_size) + d2t
    if int(targets.min()) < 0 or int(targets.max()) >= config.vocab_size or not bool(t2d[targets].all()) \
            or int(t2d.sum()) != config.draft_vocab_size:
        raise Eagle3FormatError("d2t/t2d: the draft-to-target map and the target mask disagree")
    expected = {"fc.weight": (config.hidden_size, 3 * config.target_hidden_size),
                "lm_head.weight": (config.draft_vocab_size, config.hidden_size),
                "layers.0.self_attn.q_proj.weight": (config.num_attention_heads * config.head_dim,
                                                     2 * config.hidden_size)}
    for key, shape in expected.items():
        if tuple(state[key].shape) != shape:
            raise Eagle3FormatError(f"{key}: shape {tuple(state[key].shape)}, expected {shape}")
    return config
