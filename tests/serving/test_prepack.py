"""oneDNN weight prepacking (draftwheel.serving.engine.prepack): same results as the stock model, never stale, and
greedy decoding through the packed engine equals HF generate on an unpacked copy."""

import copy
import pickle

import pytest
import torch
from torch import nn

from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.prepack import PackedLinear, is_packed, prepack_linears, unpacked_copy
from draftwheel.serving.testing import build_tokenizer, tiny_llama

PROMPTS = ["The quick brown", "Hello! How can", "import os\n", "def add(a, b):"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(autouse=True)
def pack_tiny_layers(monkeypatch):
    """The test models are tiny: pack every layer, not only those big enough to gain from it."""
    monkeypatch.setattr("draftwheel.serving.engine.prepack.MIN_PACKED_WEIGHT", 0)


def logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_packed_model_matches_stock_and_keeps_its_parameters(tokenizer):
    stock = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=True)
    packed = copy.deepcopy(stock)
    keys = set(stock.state_dict())
    linears = sum(type(m) is nn.Linear for m in stock.modules())
    assert prepack_linears(packed) == linears > 0
    assert prepack_linears(packed) == 0  # already packed: nothing left to swap
    assert not any(type(m) is nn.Linear for m in packed.modules())
    assert set(packed.state_dict()) == keys
    assert packed.lm_head.weight is packed.model.embed_tokens.weight  # tying survives
    ids = torch.tensor([[5, 17, 42, 7, 99]])
    torch.testing.assert_close(logits(packed, ids), logits(stock, ids), rtol=1e-4, atol=1e-4)


def test_unpacked_copy_is_the_stock_model_again(tokenizer):
    stock = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=True)
    packed = copy.deepcopy(stock)
    prepack_linears(packed)
    clone = unpacked_copy(packed)
    assert is_packed(packed) and not is_packed(clone)
    assert sum(type(m) is nn.Linear for m in clone.modules()) == sum(type(m) is nn.Linear for m in stock.modules())
    assert clone.lm_head.weight is clone.model.embed_tokens.weight  # tying survives the copy
    assert clone.lm_head.weight is not packed.lm_head.weight  # a copy: the packed model is untouched
    ids = torch.tensor([[5, 17, 42, 7, 99]])
    torch.testing.assert_close(logits(clone, ids), logits(stock, ids), rtol=0, atol=0)


def test_weights_changed_in_place_are_repacked(tokenizer):
    model = tiny_llama(tokenizer, n_layers=1, seed=1)
    prepack_linears(model)
    ids = torch.tensor([[3, 4, 5]])
    before = logits(model, ids)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(3.0)  # like an optimizer step
    after = logits(model, ids)
    assert not torch.allclose(before, after)
    with torch.no_grad():
        expected = model(input_ids=ids).logits  # grad mode off but not inference: still packed path
    torch.testing.assert_close(after, expected)
    stock = copy.deepcopy(model)
    for module in stock.modules():  # reference: the stock op on the same weights
        if isinstance(module, PackedLinear):
            module.forward = lambda x, m=module: nn.functional.linear(x, m.weight, m.bias)
    torch.testing.assert_close(after, logits(stock, ids), rtol=1e-4, atol=1e-4)


def test_training_through_a_packed_model_gets_gradients(tokenizer):
    model = tiny_llama(tokenizer, n_layers=1, seed=2)
    prepack_linears(model)
    loss = model(input_ids=torch.tensor([[3, 4, 5, 6]]), labels=torch.tensor([[3, 4, 5, 6]])).loss
    loss.backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_copies_and_pickles_pack_again(tokenizer):
    model = tiny_llama(tokenizer, n_layers=1, seed=3)
    prepack_linears(model)
    ids = torch.tensor([[8, 9, 10]])
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone.lm_head._packed is None
        torch.testing.assert_close(logits(clone, ids), logits(model, ids))
        assert clone.lm_head._packed is not None


def test_unpackable_dtype_and_small_layers_are_left_alone(tokenizer):
    model = tiny_llama(tokenizer, n_layers=1, seed=4).to(torch.float16)
    assert prepack_linears(model) == 0
    assert any(type(m) is nn.Linear for m in model.modules())
    model = tiny_llama(tokenizer, n_layers=1, hidden=64, seed=4)
    # Attention projections hold 64x64 = 4096 weights; the MLP's three 8192 and the head 384x64.
    assert prepack_linears(model, min_weight=8192) == 4
    layer = model.model.layers[0]
    assert type(layer.self_attn.q_proj) is nn.Linear and isinstance(layer.mlp.up_proj, PackedLinear)


@pytest.mark.parametrize("k", [1, 4])
def test_packed_engine_greedy_equals_hf_generate_on_stock_copy(tokenizer, k):
    target = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    draft = tiny_llama(tokenizer, n_layers=1, seed=5, tie_embeddings=False)
    stock = copy.deepcopy(target)
    engine = Engine(from_objects(target, tokenizer, "t"), from_objects(draft, tokenizer, "d"))
    assert isinstance(target.lm_head, PackedLinear) and isinstance(draft.lm_head, PackedLinear)
    for completion in engine.generate(PROMPTS, SamplingParams(max_new_tokens=24, k=k)):
        ids = torch.tensor([completion.prompt_token_ids])
        with torch.inference_mode():
            expected = stock.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24)
        assert completion.token_ids == expected[0, ids.shape[1]:].tolist()


def test_engine_prepack_can_be_turned_off(tokenizer):
    target = tiny_llama(tokenizer, n_layers=1, seed=0)
    Engine(from_objects(target, tokenizer, "t"), prepack=False)
    assert type(target.lm_head) is nn.Linear


@pytest.mark.ci_may_skip(reason="an AVX2-only CPU has no oneDNN bfloat16 path to pack with")
@pytest.mark.parametrize("as_two", [True, False])
def test_a_single_bfloat16_row_is_bitwise_its_row_among_others(as_two, monkeypatch):
    """Computed as two rows, a single bfloat16 row is bitwise its row in a multi-row call (so a plain
    step equals its row in a verify forward) on any CPU. Computed alone it is too, except on a CPU that
    reduces a lone row in another order (bfloat16 without AMX tiles), where some rows must differ:
    that is the CPU `one_row_reduces_apart` names, and where PackedLinear computes rows as two."""
    import draftwheel.serving.engine.prepack as prepack

    if not prepack.packs_bfloat16():
        pytest.skip("oneDNN has no bfloat16 path on this CPU")
    differs_here = prepack.one_row_reduces_apart(torch.bfloat16)
    assert not prepack.one_row_reduces_apart(torch.float32)
    monkeypatch.setattr(prepack, "stock_wins_one_row", lambda *shape: False)
    monkeypatch.setattr(prepack, "one_row_reduces_apart", lambda dtype: as_two)
    torch.manual_seed(0)
    layer = PackedLinear(nn.Linear(1536, 576, bias=False).to(torch.bfloat16))  # SmolLM2's MLP down projection
    assert layer.one_row_as_two is as_two and not layer.one_row_stock
    same = 0
    with torch.no_grad():
        for _ in range(20):
            rows = torch.randn(5, 1536, dtype=torch.bfloat16)
            alone = torch.cat([layer(rows[i]).unsqueeze(0) for i in range(5)])  # a 1-D row keeps its shape
            assert alone.shape == (5, 576)
            same += torch.equal(alone, layer(rows))
    assert same == 20 if as_two or not differs_here else same < 20, same
