"""Token trees: building the chain-plus-branch tree, walking it greedily, and the target's tree forward.

The forward must give every node the logits a one-token decoding step gives along that node's own
branch, bitwise, in float32 and bfloat16 (the lossless core), and keeping the accepted path must leave
the cache a plain decode would have left. Engine-level identity lives in test_eagle.py.
"""

from __future__ import annotations

import pytest
import torch

from draftwheel.serving.engine.adaptive import branch_length
from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.prepack import prepack_linears
from draftwheel.serving.engine.row_invariant import tree_layout, use_row_invariant_attention
from draftwheel.serving.engine.acceptance import common_prefix
from draftwheel.serving.engine.tree import Tree, chain_with_branch, verify_tree_greedy
from draftwheel.serving.testing import build_tokenizer, tiny_llama
from tests.serving.test_precision import gqa_llama


def test_chain_with_branch_shares_the_common_prefix():
    tree = chain_with_branch(9, [1, 2, 3], [1, 5, 6])
    assert tree.tokens == [9, 1, 2, 3, 5, 6]
    assert tree.parents == [-1, 0, 1, 2, 1, 4]  # 5 leaves the chain after the shared 1
    assert tree.depths == [0, 1, 2, 3, 2, 3]
    assert tree.visible()[5] == [0, 1, 4, 5] and not tree.is_chain
    fork_at_root = chain_with_branch(9, [1, 2], [7])
    assert fork_at_root.parents == [-1, 0, 1, 0]
    assert chain_with_branch(9, [1, 2, 3], [1, 2]).tokens == [9, 1, 2, 3]  # nothing to add
    longer = chain_with_branch(9, [1, 2], [1, 2, 4])
    assert longer.tokens == [9, 1, 2, 4] and longer.is_chain


def logits_choosing(choices: list[int], vocab: int = 10) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(choices), vocab).float()


def test_greedy_walk_follows_the_targets_choice_into_either_branch():
    tree = chain_with_branch(9, [1, 2, 3], [1, 5, 6])  # nodes: 9, 1, 2, 3, 5, 6
    # the target takes 1, then 5 (the branch), then 6, then says 8
    emitted, path = verify_tree_greedy(tree, logits_choosing([1, 5, 0, 0, 6, 8]))
    assert emitted.tolist() == [1, 5, 6, 8] and path == [0, 1, 4, 5]
    # the chain all the way, then the bonus token
    emitted, path = verify_tree_greedy(tree, logits_choosing([1, 2, 3, 7, 0, 0]))
    assert emitted.tolist() == [1, 2, 3, 7] and path == [0, 1, 2, 3]
    # nothing matches at the root: only the target's own token
    emitted, path = verify_tree_greedy(tree, logits_choosing([4, 0, 0, 0, 0, 0]))
    assert emitted.tolist() == [4] and path == [0]
    assert common_prefix([1, 2, 3], [1, 5, 6, 8]) == 1 and common_prefix([1, 5, 6], [1, 5, 6, 8]) == 3


def test_branch_length_keeps_tokens_worth_their_rows():
    assert branch_length([0.9, 0.5, 0.2, 0.08], ratio=1.0, row_slope=0.05, rate=2.0) == 3  # 0.08 < 0.05 * 2
    assert branch_length([0.9, 0.5], ratio=0.1, row_slope=0.05, rate=1.5) == 1  # a request whose index over-promises
    assert branch_length([], ratio=1.0, row_slope=0.05, rate=1.0) == 0
    # beside a draft that is right 80 % of the time, a branch token adds a token a fifth as often
    assert branch_length([0.9, 0.5, 0.2, 0.08], ratio=1.0, row_slope=0.05, rate=2.0, a=0.8) == 1


def decode_along(model, prompt: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """The logits a one-token decoding step gives after each of `tokens`, fed one at a time."""
    lm = CachedLM(model)
    lm.forward(prompt)
    return torch.cat([lm.forward(torch.tensor([t]), keep=1) for t in tokens])


def same(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    """bfloat16, as served on AMX: bitwise. float32: the linear kernels round by row count (as for any
    verify, tests/serving/test_precision.py); the attention itself is what the tree layout decides."""
    return torch.equal(a, b) if dtype == torch.bfloat16 else torch.allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_forward_is_bitwise_a_decoding_step_along_each_branch(dtype, monkeypatch):
    monkeypatch.setattr("draftwheel.serving.engine.prepack.MIN_PACKED_WEIGHT", 0)
    model = gqa_llama(build_tokenizer()).to(dtype)  # grouped-query heads, as the reference target has
    prepack_linears(model)
    assert use_row_invariant_attention(model)
    prompt = torch.arange(5, 40)
    tree = chain_with_branch(17, [21, 22, 23, 24], [21, 31, 32])  # forks after the shared 21
    lm = CachedLM(model)
    lm.forward(prompt)
    logits = lm.forward(torch.tensor(tree.tokens), tree=tree)  # [6, V]
    for node, seen in enumerate(tree.visible()):
        along = decode_along(model, prompt, [tree.tokens[i] for i in seen])
        assert same(logits[node], along[-1], dtype), f"node {node} differs from decoding along {seen}"
    # keep the branch's path: the next step is the decoding step after that path
    path = [0, 1, 5, 6]
    lm.keep_path(len(tree), path)
    assert lm.length == prompt.shape[0] + len(path)
    following = [tree.tokens[i] for i in path] + [40]
    assert same(lm.forward(torch.tensor([40]), keep=1)[0], decode_along(model, prompt, following)[-1], dtype)
    # a wrong layout is caught: the branch's node read as if it followed the whole chain differs
    chained = CachedLM(model)
    chained.forward(prompt)
    as_chain = chained.forward(torch.tensor(tree.tokens))
    assert not torch.equal(as_chain[5], logits[5])


def test_tree_layout_refuses_what_it_cannot_keep_invariant():
    model = tiny_llama(build_tokenizer(), n_layers=1, seed=0)
    use_row_invariant_attention(model)
    lm = CachedLM(model)
    tree = Tree([1, 2, 3], [-1, 0, 0])
    with pytest.raises(ValueError, match="needs batch 1, a cache"):
        lm.forward(torch.tensor(tree.tokens), tree=tree)  # nothing cached: a prefill has no tree layout
    with pytest.raises(ValueError, match="at most"):
        with tree_layout([[0]] * 65):
            pass


def test_an_uncertain_index_proposal_is_verified_beside_a_draft():
    from draftwheel.serving.engine.adaptive import tree_beats_index

    # a long, likely proposal: the index alone (a draft's rows and tokens would add cost for little)
    assert not tree_beats_index(score=6.0, first_prob=0.95, a=0.6, k=4, n_index=8, c=0.05, row_cost=lambda n: 1 + 0.04 * (n - 1))
    # a short proposal whose first token is a coin toss, beside a draft that pays: both
    assert tree_beats_index(score=0.6, first_prob=0.5, a=0.7, k=4, n_index=2, c=0.05, row_cost=lambda n: 1 + 0.04 * (n - 1))
