"""Serving precision (draftwheel.serving.engine.precision) and row-invariant attention (draftwheel.serving.engine.row_invariant).

bfloat16 is where a k+1-token verify costs about one decoding step on AMX CPUs, and where rounding
differences between a multi-row and a one-row forward flip greedy choices. The tests pin down that a
verify row is bitwise the 1-token step at that position, so greedy speculative output in bfloat16 is
token-identical to plain decoding of the same bfloat16 target, for both draft kinds.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.precision import resolve_bf16, resolve_device, resolve_dtype
from draftwheel.serving.engine.prepack import is_packed, packs_bfloat16, prepack_linears
from draftwheel.serving.engine.row_invariant import NAME, use_row_invariant_attention, use_stock_attention
from draftwheel.serving.testing import build_tokenizer, tiny_llama
from tests.serving.test_eagle import fit_draft
from tests.serving.test_engine import PROMPTS


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def gqa_llama(tokenizer, seed=0) -> LlamaForCausalLM:
    """Grouped-query attention (4 query heads, 2 KV heads), as SmolLM2 has: sdpa's one-row path packs
    the query groups, which is the path a verify row must reproduce."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(config).eval()


def rows_two_ways(model, ids, start, rows):
    """Logits of positions start..start+rows-1: one multi-row forward vs one forward per row."""
    with torch.inference_mode():
        cache = DynamicCache()
        model(ids[:, :start], past_key_values=cache, use_cache=True)
        together = model(ids[:, start:start + rows], past_key_values=cache, use_cache=True).logits[0]
        cache.crop(-rows)
        apart = torch.stack([model(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits[0, 0]
                             for i in range(start, start + rows)])
    return together, apart


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_verify_rows_are_bitwise_the_one_token_steps(tokenizer, dtype, monkeypatch):
    monkeypatch.setattr("draftwheel.serving.engine.prepack.MIN_PACKED_WEIGHT", 0)
    model = gqa_llama(tokenizer).to(dtype)
    prepack_linears(model)
    assert use_row_invariant_attention(model) and model.config._attn_implementation == NAME
    ids = torch.randint(0, len(tokenizer), (1, 120), generator=torch.Generator().manual_seed(1))
    for start, rows in [(7, 2), (40, 4), (90, 5), (100, 17), (60, 33)]:
        together, apart = rows_two_ways(model, ids, start, rows)
        if dtype == torch.bfloat16:
            assert torch.equal(together, apart), (start, rows)
        else:  # float32 linear kernels round differently by row count; only the attention is made invariant
            torch.testing.assert_close(together, apart, rtol=1e-5, atol=1e-5)
    use_stock_attention(model)
    assert model.config._attn_implementation == "sdpa"


def test_short_bfloat16_attention_computes_in_float32_on_cpu():
    """A decoding step's and a verify row's attention in bfloat16 is the float32 call on the exactly
    upcast inputs, rounded back (PyTorch's bfloat16 CPU kernel made each verify row cost ~10 % of a
    step); float32 inputs take the very call they took before."""
    import torch.nn.functional as F

    from draftwheel.serving.engine.row_invariant import sdpa_call, upcast, work_dtype

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4, 1, 16, generator=gen), torch.randn(1, 2, 30, 16, generator=gen),
               torch.randn(1, 2, 30, 16, generator=gen))
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2)
    assert torch.equal(sdpa_call(q, k, v), expected)  # float32: unchanged
    q16, k16, v16 = q.bfloat16(), k.bfloat16(), v.bfloat16()
    assert work_dtype(q16) == torch.float32 and work_dtype(q) == torch.float32
    from draftwheel.serving.engine.row_invariant import MAX_ROWS

    long_call = torch.zeros(1, 4, MAX_ROWS + 1, 16, dtype=torch.bfloat16)  # a batched prompt chunk
    assert work_dtype(long_call) == torch.bfloat16
    out = sdpa_call(q16, k16, v16)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, F.scaled_dot_product_attention(q16.float(), k16.float(), v16.float(),
                                                           enable_gqa=True).transpose(1, 2).bfloat16())
    # upcast once for a verify's rows: each row's call gives what the row's own call gives
    uq, uk, uv = upcast(q16, k16, v16)
    assert uq.dtype == torch.float32 and torch.equal(sdpa_call(uq, uk, uv, out_dtype=torch.bfloat16), out)


def test_prefill_and_long_calls_match_stock_sdpa(tokenizer):
    stock = gqa_llama(tokenizer).to(torch.bfloat16)
    invariant = gqa_llama(tokenizer).to(torch.bfloat16)
    use_row_invariant_attention(invariant)
    ids = torch.randint(0, len(tokenizer), (1, 80), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert torch.equal(stock(ids).logits, invariant(ids).logits)  # 80 rows > MAX_ROWS: stock path
        # A short prompt's prefill (no cache) is the stock call too: the same in every mode, and as fast as HF's.
        assert torch.equal(stock(ids[:, :40]).logits, invariant(ids[:, :40]).logits)
    from draftwheel.serving.engine.row_invariant import MAX_ROWS
    from draftwheel.serving.engine.suffix import SuffixConfig

    SuffixConfig(max_spec_tokens=MAX_ROWS - 1)  # the longest suffix verify still fits
    with pytest.raises(ValueError, match="max_spec_tokens"):
        SuffixConfig(max_spec_tokens=MAX_ROWS)


def test_models_without_sdpa_are_left_alone(tokenizer):
    model = gqa_llama(tokenizer)
    model.set_attn_implementation("eager")
    assert not use_row_invariant_attention(model)
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("kind", ["lm", "eagle3"])
def test_bfloat16_engine_greedy_equals_plain_decoding(tokenizer, kind, monkeypatch):
    monkeypatch.setattr("draftwheel.serving.engine.prepack.MIN_PACKED_WEIGHT", 0)
    target = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    if kind == "eagle3":
        draft = fit_draft(target, tokenizer, steps=100)
    else:
        draft = tiny_llama(tokenizer, n_layers=1, seed=1, tie_embeddings=False)
    engine = Engine(from_objects(target, tokenizer, "target"), from_objects(draft, tokenizer, "draft"),
                    dtype=torch.bfloat16)
    assert engine.dtype == torch.bfloat16
    assert is_packed(engine.target.model) == packs_bfloat16()  # an AVX2-only CPU has no oneDNN bfloat16 path
    assert next(engine.draft.model.parameters()).dtype == torch.bfloat16  # the draft follows the target
    params = SamplingParams(max_new_tokens=40, k=4)
    accepted = 0
    for prompt in PROMPTS:
        plain = engine.generate([prompt], params, mode="autoregressive")[0]
        spec = engine.generate([prompt], params, mode="draft")[0]
        assert spec.token_ids == plain.token_ids, prompt
        accepted += spec.record.accepted_tokens
    assert accepted > 0  # the multi-row verify path really ran with accepted tokens


def test_bfloat16_suffix_proposals_of_16_tokens_stay_identical(tokenizer, monkeypatch):
    """Suffix proposals run up to max_spec_tokens (16), so verifies of 17 rows happen (the reference
    benchmark diverged on 4 of 8 prompts while only 16 rows were row-invariant). On this tiny model the
    rounding rarely flips a token, so the bitwise row test above (17 and 33 rows) is what catches a too
    small MAX_ROWS; this one runs the whole path end to end."""
    from draftwheel.serving.engine.suffix import SuffixIndex, target_key

    monkeypatch.setattr("draftwheel.serving.engine.prepack.MIN_PACKED_WEIGHT", 0)
    target = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    loaded = from_objects(target, tokenizer, "target")
    engine = Engine(loaded, dtype=torch.bfloat16, suffix_index=SuffixIndex(target_key(loaded.model_id)))
    params = SamplingParams(max_new_tokens=60)
    plain = engine.generate(PROMPTS, params, mode="autoregressive")  # indexed as they finish
    again = engine.generate(PROMPTS, params, mode="suffix")
    assert [c.token_ids for c in again] == [c.token_ids for c in plain]
    assert max(s.k for c in again for s in c.record.steps) == 16
    assert all(c.record.steps[0].k == 0 for c in again)  # the prompt is prefilled alone, as plain decoding does


def test_swapped_in_draft_takes_the_engine_dtype(tokenizer):
    target = tiny_llama(tokenizer, n_layers=2, seed=0)
    engine = Engine(from_objects(target, tokenizer, "target"), dtype=torch.bfloat16)
    engine.swap_draft(from_objects(tiny_llama(tokenizer, n_layers=1, seed=1), tokenizer, "draft"))
    assert next(engine.draft.model.parameters()).dtype == torch.bfloat16


def test_resolve_dtype_names_the_field():
    assert resolve_dtype("float32") == torch.float32
    assert resolve_dtype("bfloat16") == torch.bfloat16
    assert resolve_dtype("auto") in (torch.float32, torch.bfloat16)
    assert resolve_dtype("auto", device="cuda") == torch.float32
    with pytest.raises(ValueError, match="dtype: 'fp8' is not one of auto, float32, bfloat16"):
        resolve_dtype("fp8")


def test_device_auto_is_cuda_when_present_and_dtype_auto_follows_it(monkeypatch):
    """`device: auto` (serve's default) picks a CUDA GPU when there is one, else the CPU; `dtype: auto` then
    picks bfloat16 on a GPU that supports it, as the trainers' `bf16: auto` does."""
    from draftwheel.serving.server.serve_config import ServeConfig

    assert ServeConfig().device == "auto"
    for present in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda present=present: present)
        assert resolve_device("auto") == ("cuda" if present else "cpu")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert resolve_dtype("auto", device="cuda") == torch.bfloat16
    assert resolve_dtype("auto", device="cuda:1") == torch.bfloat16
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda:1") == "cuda:1"
    for bad in ("tpu", "cuda:x", "CPU"):
        with pytest.raises(ValueError, match=f"device: '{bad}' is not one of auto, cpu, cuda"):
            resolve_device(bad)
        with pytest.raises(ValueError, match="device"):
            ServeConfig(device=bad)


def test_configs_refuse_an_unknown_dtype_naming_the_field():
    from draftwheel.flows.demo import DemoConfig
    from draftwheel.evaluation.gate import ShadowConfig
    from draftwheel.serving.server.serve_config import ServeConfig

    for config in (ServeConfig, ShadowConfig, DemoConfig):
        with pytest.raises(ValueError, match="dtype: 'fp8' is not one of auto, float32, bfloat16"):
            config(dtype="fp8")


def test_resolve_bf16_auto_follows_the_cpu(monkeypatch):
    """`bf16: auto` trains in bfloat16 only where it is fast: on an AVX2-only CPU bfloat16 autocast
    was 7-37x slower than float32; with AMX or AVX-512 BF16 faster."""
    assert resolve_bf16(True) is True and resolve_bf16(False) is False
    assert resolve_bf16("true") is True and resolve_bf16("False") is False
    for has_amx in (True, False):
        monkeypatch.setattr("draftwheel.serving.engine.precision.cpu_has_bf16_matmul", lambda has_amx=has_amx: has_amx)
        assert resolve_bf16("auto") is has_amx
        assert resolve_bf16("auto", device="auto") is has_amx  # no CUDA here: the CPU decides
    for bad in ("fp16", 1, None):
        with pytest.raises(ValueError, match="bf16"):
            resolve_bf16(bad)
