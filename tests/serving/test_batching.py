"""The batch engine on tiny random Llama models (seconds on CPU): the paged forward against a request's own
cache, token identity with one-at-a-time decoding in every mode, the sampled law at batch 8, overload,
cancellation and refusals.

The draft is test_engine's noisy copy of the target (acceptance roughly 0.3-0.8), so verification's
accept and rollback paths both run inside the batch.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftwheel.serving.engine.adaptive import ALL, INDEX, PLAIN, ModelledTime
from draftwheel.serving.engine.batch_kv import KVPool, PagedRunner, RowCall
from draftwheel.serving.engine.batching import BatchConfig, BatchEngine, QueueFullError
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.row_invariant import use_row_invariant_attention
from draftwheel.serving.engine.suffix import ReadOnlyIndex, SuffixIndex, target_key
from tests.serving.law import chi_square, window_law
from tests.serving.test_engine import PROMPTS, TWO_TOKEN_PROMPT, pair  # noqa: F401 - a fixture
from tests.serving.test_suffix_engine import corrupted

MODES = ["autoregressive", "draft", "suffix", "hybrid"]


class Records:
    """A sink that keeps the records it is given."""

    def __init__(self):
        self.records = []

    def write(self, record):
        self.records.append(record)
        return True


def make_engine(pair, sink=None):
    tokenizer, target, draft = pair
    loaded = from_objects(target, tokenizer, "target")
    engine = Engine(loaded, from_objects(draft, tokenizer, "draft"), sink=sink,
                    suffix_index=SuffixIndex(target_key(loaded.model_id)))
    for prompt in PROMPTS[:3]:  # proposals for some prompts, partly wrong
        ids = tokenizer(prompt)["input_ids"]
        engine.suffix_index.add(ids + corrupted(engine.generate([prompt], SamplingParams(max_new_tokens=40),
                                                                mode="autoregressive")[0].token_ids))
    return engine


@pytest.fixture(scope="module")
def engine(pair):
    return make_engine(pair)


def gqa_llama(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(config).eval()


def test_a_paged_row_is_bitwise_the_request_alone_whatever_its_blocks():
    """A prefill, a decoding step, a verify and a long chunk after a past, one row per forward: each equals
    `CachedLM`'s forward bitwise, whether its blocks are consecutive (read in place) or scattered (gathered)."""
    model = gqa_llama()
    use_row_invariant_attention(model)  # as the engine runs its target
    ids = torch.randint(0, 300, (120,), generator=torch.Generator().manual_seed(0))
    pieces = [ids[:10], ids[10:11], ids[11:15], ids[15:100]]  # prefill, step, verify (4 rows), chunk of 85
    alone = CachedLM(model)
    expected = [alone.forward(p) for p in pieces]
    runner = PagedRunner(model, KVPool(model.config, 32, 8, torch.float32))
    for table in (list(range(13)), [30, 2, 17, 5, 9, 21, 0, 11, 28, 3, 14, 25, 7]):
        past = 0
        for piece, want in zip(pieces, expected):
            got, = runner.forward([RowCall(piece, past, table)])
            assert torch.equal(got, want), (past, len(piece))
            past += len(piece)


def test_a_paged_tree_is_the_requests_own_tree_alone_and_in_a_batch():
    """A token tree (the chain and a branch forking after its first token) as a paged row: alone in its
    forward, bitwise the tree `CachedLM` verifies; after keeping the branch's path (scattered blocks, so
    the path's keys are copied between blocks), the next step is bitwise the one after that path. Beside
    other rows in one forward, its logits are its own (to float summation order), and a tree split into
    chunks is refused."""
    from draftwheel.serving.engine.tree import chain_with_branch

    model = gqa_llama()
    use_row_invariant_attention(model)
    prompt = torch.randint(0, 300, (13,), generator=torch.Generator().manual_seed(0))
    tree = chain_with_branch(17, [21, 22, 23], [21, 31, 32])  # nodes 17, 21, 22, 23, 31, 32
    path = [0, 1, 4, 5]  # the branch won
    alone = CachedLM(model)
    alone.forward(prompt)
    want_tree = alone.forward(torch.tensor(tree.tokens), tree=tree)
    alone.keep_path(len(tree), path)
    want_next = alone.forward(torch.tensor([40]), keep=1)
    pool = KVPool(model.config, 16, 4, torch.float32)
    runner = PagedRunner(model, pool)
    table = [9, 2, 14, 5, 11]  # scattered: the path's nodes move from block 5 to blocks 14 and 5
    runner.forward([RowCall(prompt, 0, table)])
    got_tree, = runner.forward([RowCall(torch.tensor(tree.tokens), len(prompt), table, tree=tree)])
    assert torch.equal(got_tree, want_tree)
    pool.keep_path(table, len(prompt), path)
    got_next, = runner.forward([RowCall(torch.tensor([40]), len(prompt) + len(path), table, keep=1)])
    assert torch.equal(got_next, want_next)
    # in a batch: another request's rows beside it
    runner.forward([RowCall(prompt, 0, table), RowCall(prompt[:7], 0, [0, 1])])
    batched = runner.forward([RowCall(torch.tensor(tree.tokens), len(prompt), table, tree=tree),
                              RowCall(torch.tensor([3, 4]), 7, [0, 1, 3])])
    torch.testing.assert_close(batched[0], want_tree, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="never split"):
        runner.forward([RowCall(torch.tensor(tree.tokens[:3]), len(prompt), table, tree=tree)])


def test_rows_of_one_forward_do_not_see_each_other(pair):
    """Three requests at different depths in one forward: each row's logits are its own request's
    (equal to its forward alone up to float summation order), never another's."""
    _, target, _ = pair
    runner = PagedRunner(target, KVPool(target.config, 64, 4, torch.float32))
    seqs = [torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(n)) for n in (7, 19, 33)]
    tables = [list(range(i * 10, i * 10 + 10)) for i in range(3)]
    runner.forward([RowCall(s[:-3], 0, t) for s, t in zip(seqs, tables)])
    got = runner.forward([RowCall(s[-3:], len(s) - 3, t) for s, t in zip(seqs, tables)])
    for s, logits in zip(seqs, got):
        torch.testing.assert_close(logits, CachedLM(target).forward(s)[-3:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_batch_of_one_is_token_identical_to_one_at_a_time(engine, mode):
    """The same tokens and the same steps. Every mode's choices read step times (the suffix tier's stretch
    prices verify rows, the hybrid's pace prices drafting), so both engines read one fixed cost model:
    their choices are then a function of the prompts alone, and a timing on a busy machine cannot move them."""
    def frozen():  # the index must not learn between the two runs (it learns from finished requests)
        return Engine(engine.target, engine.draft, suffix_index=ReadOnlyIndex(engine.suffix_index),
                      modelled_time=ModelledTime(row_slope=0.05, draft_c=0.3))
    params = SamplingParams(max_new_tokens=40, k=3)
    expected = frozen().generate(PROMPTS, params, mode=mode)
    with BatchEngine(frozen(), BatchConfig(max_batch=1)) as batch:
        got = batch.generate(PROMPTS, params, mode=mode)
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert [c.record.steps for c in got] == [c.record.steps for c in expected]


@pytest.mark.parametrize("mode", MODES)
def test_batched_greedy_equals_one_at_a_time(engine, mode):
    """All prompts in one batch, with a small token budget so prompts are read in chunks beside decoding rows."""
    params = SamplingParams(max_new_tokens=40, k=3)
    expected = engine.generate(PROMPTS * 2, params, mode=mode)
    with BatchEngine(engine, BatchConfig(max_batch=8, max_batch_tokens=8)) as batch:
        got = batch.generate(PROMPTS * 2, params, mode=mode)
        assert batch.stats()["free_blocks"] == batch.config.kv_blocks
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]


@pytest.mark.parametrize("mode", ["draft", "suffix"])
def test_sampled_tokens_follow_the_target_law_at_batch_8(pair, mode):
    """test_engine's two-token law: 1000 seeded requests decoded 8 at a time; their first two tokens must
    follow p(a) p(b | a) of the target (chi-square, tests/serving/law.py), and not the draft's."""
    tokenizer, target, draft = pair
    engine = make_engine(pair)
    params = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=3, k=2)
    with BatchEngine(engine, BatchConfig(max_batch=8, max_waiting=1000)) as batch:
        handles = [batch.submit(TWO_TOKEN_PROMPT, SamplingParams(**{**params.__dict__, "seed": seed}), mode=mode)
                   for seed in range(1000)]
        completions = [list(h.results())[-1] for h in handles]
    assert max(batch.rows_per_step) == 8
    samples = [tuple(c.token_ids[:2]) for c in completions]
    prompt_ids = tokenizer(TWO_TOKEN_PROMPT)["input_ids"]
    result = chi_square(samples, window_law(target, prompt_ids, params, 0, 2))
    assert result.outside_support == 0 and result.pvalue > 1e-3, result
    assert chi_square(samples, window_law(draft, prompt_ids, params, 0, 2)).pvalue < 1e-6


def test_more_requests_than_blocks_queue_and_all_finish(engine):
    """A pool for two requests at a time and eight requests: they queue, none is lost, all are right."""
    sink = Records()
    engine_with_sink = make_engine_like(engine, sink)
    params = SamplingParams(max_new_tokens=30)
    expected = engine.generate(PROMPTS + PROMPTS[:3], params, mode="autoregressive")
    need = engine.target.tokenizer(PROMPTS[0])["input_ids"]
    with BatchEngine(engine_with_sink, BatchConfig(kv_blocks=2 * ((len(need) + 30) // 4 + 3), kv_block_size=4)) as batch:
        got = batch.generate(PROMPTS + PROMPTS[:3], params, mode="autoregressive")
        assert max(batch.rows_per_step) == 2
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert len(sink.records) == 8 and {r.request_id for r in sink.records} == {c.request_id for c in got}


def make_engine_like(engine, sink):
    return Engine(engine.target, engine.draft, sink=sink, suffix_index=engine.suffix_index)


def test_cancelling_frees_the_request_and_writes_no_record(engine):
    sink = Records()
    with BatchEngine(make_engine_like(engine, sink)) as batch:
        handle = batch.submit(PROMPTS[0], SamplingParams(max_new_tokens=500), mode="autoregressive")
        first = next(handle.results(poll_s=0.01))
        assert isinstance(first, str)
        handle.cancel()
        deadline = time.monotonic() + 10
        while batch.stats()["free_blocks"] < batch.config.kv_blocks and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = batch.stats()
        assert (stats["running"], stats["waiting"], stats["free_blocks"]) == (0, 0, batch.config.kv_blocks)
        cancel = threading.Event()
        items = batch.stream(PROMPTS[1], SamplingParams(max_new_tokens=500), mode="autoregressive", cancel=cancel)
        next(items)
        cancel.set()
        assert all(isinstance(item, str) for item in items)  # ends without a Completion
    assert sink.records == []


def test_refusals(engine):
    with BatchEngine(engine, BatchConfig(max_batch=1, max_waiting=1, kv_blocks=128, kv_block_size=4)) as batch:
        with pytest.raises(ValueError, match="KV blocks of 4 positions; the pool has 128"):
            batch.submit(PROMPTS[0], SamplingParams(max_new_tokens=600))
        with pytest.raises(ValueError, match="mode"):
            batch.submit(PROMPTS[0], SamplingParams(max_new_tokens=4), mode="beam")
        running = batch.submit(PROMPTS[0], SamplingParams(max_new_tokens=100), mode="autoregressive")
        deadline = time.monotonic() + 10
        while batch.stats()["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        waiting = batch.submit(PROMPTS[1], SamplingParams(max_new_tokens=8))
        with pytest.raises(QueueFullError, match="already waiting"):
            batch.submit(PROMPTS[2], SamplingParams(max_new_tokens=8))
        assert list(running.results())[-1].token_ids and list(waiting.results())[-1].token_ids


@pytest.fixture(scope="module")
def eagle_engine(pair):
    from tests.serving.test_eagle import fit_draft

    tokenizer, target, _ = pair
    loaded = from_objects(target, tokenizer, "target")
    engine = Engine(loaded, from_objects(fit_draft(target, tokenizer), tokenizer, "eagle"),
                    suffix_index=SuffixIndex(target_key(loaded.model_id)))
    ids = tokenizer(PROMPTS[0])["input_ids"]
    engine.suffix_index.add(ids + corrupted(engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=40),
                                                            mode="autoregressive")[0].token_ids))
    return engine


@pytest.mark.parametrize("mode", ["draft", "hybrid"])
def test_eagle3_chains_in_the_batch_are_lossless(eagle_engine, mode):
    """eagle3 drafts (the draft reads the target's features from the batched verify) and the eagle3 hybrid:
    greedy output one at a time, at batch 1 and at batch 10."""
    params = SamplingParams(max_new_tokens=40, k=4)
    expected = eagle_engine.generate(PROMPTS * 2, params, mode=mode)
    for max_batch in (1, 10):
        with BatchEngine(eagle_engine, BatchConfig(max_batch=max_batch)) as batch:
            got = batch.generate(PROMPTS * 2, params, mode=mode)
        assert [c.token_ids for c in got] == [c.token_ids for c in expected]
        if mode == "draft":  # (the hybrid drafts where its pace says drafting pays: timings decide)
            assert any(s.source == "eagle3" and s.accepted for c in got for s in c.record.steps)
            # one draft forward serves every row waiting on it: at batch 10, forwards of several rows
            assert max(batch.rows_per_draft_forward) == 1 if max_batch == 1 else max(batch.rows_per_draft_forward) > 1


@pytest.mark.parametrize("max_batch", [1, 4])
def test_batched_greedy_steps_verify_the_drafts_runner_up_beside_its_chain_losslessly(eagle_engine, max_batch,
                                                                                      monkeypatch):
    """As one at a time (tests/serving/test_eagle.py): a batched row verifies the draft's runner-up first
    token beside its chain as a token tree, some steps are won by it, and greedy output stays the
    target's. Here the draft's first and second choices swap, so the runner-up is often right."""
    import draftwheel.serving.engine.eagle_decoding as loop

    params = SamplingParams(max_new_tokens=40, k=3)
    expected = eagle_engine.generate(PROMPTS, params, mode="autoregressive")
    monkeypatch.setattr(loop, "greedy", lambda logits: logits.topk(2, dim=-1).indices[..., 1])
    monkeypatch.setattr(loop, "draft_runner_up", lambda draft, logits: (draft.draft_to_target[logits.argmax()], 1.0))
    with BatchEngine(eagle_engine, BatchConfig(max_batch=max_batch)) as batch:
        got = batch.generate(PROMPTS, params, mode="draft")
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    won = [s for c in got for s in c.record.steps if s.beside is not None and s.k == 1 and s.accepted == 1]
    assert won and all(s.beside.source == "eagle3" and s.beside.accepted == 0 for s in won)


def test_a_rows_tree_stays_within_the_kv_positions_it_holds(eagle_engine, monkeypatch):
    """A request holds KV positions for its prompt and max_new_tokens only (here exactly: blocks of one
    position). Trees with the index's proposal as a branch at every drafting step, to the last tokens,
    never write past them, and greedy output stays the target's."""
    import draftwheel.serving.engine.eagle_decoding as loop

    params = SamplingParams(max_new_tokens=24, k=4)
    expected = eagle_engine.generate(PROMPTS, params, mode="autoregressive")
    monkeypatch.setattr(eagle_engine, "index_branch", True)
    monkeypatch.setattr(loop, "suffix_drafts", lambda *args, **kwargs: False)  # the draft drafts every step
    monkeypatch.setattr(loop, "branch_length", lambda probs, *args, **kwargs: len(probs))  # the whole proposal
    with BatchEngine(eagle_engine, BatchConfig(max_batch=1, kv_block_size=1, kv_blocks=4096)) as batch:
        got = batch.generate(PROMPTS, params, mode="hybrid")
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert any(s.beside is not None and "suffix" in (s.source, s.beside.source) for c in got for s in c.record.steps)


def test_one_draft_forward_for_several_requests_equals_each_alone(eagle_engine):
    """`Eagle3Draft.extend_many`: requests at different depths, a catch-up of several slots (target features
    to project) beside one-slot steps (the draft's own hidden states): each request's hidden state, logits
    and cache are its forward alone's, to float rounding."""
    from draftwheel.serving.engine.eagle import DraftCall, DraftKV

    model = eagle_engine.draft.model
    gen = torch.Generator().manual_seed(0)
    h, h3 = model.c.hidden_size, 3 * model.c.target_hidden_size

    def calls():
        torch.manual_seed(1)
        kvs = [DraftKV() for _ in range(3)]
        first = [DraftCall(torch.randint(0, 100, (n,), generator=gen), torch.randn(n, h3), kv, project=True)
                 for n, kv in zip((5, 2, 7), kvs)]
        return kvs, first

    gen.manual_seed(0)
    kvs_alone, first = calls()
    alone = [model.extend_many([call])[0] for call in first]
    gen.manual_seed(0)
    kvs_together, first = calls()
    together = model.extend_many(first)
    step = [(torch.tensor([i + 3]), torch.randn(1, h)) for i in range(3)]
    alone += [model.extend_many([DraftCall(t, f, kv)])[0] for (t, f), kv in zip(step, kvs_alone)]
    together += model.extend_many([DraftCall(t, f, kv) for (t, f), kv in zip(step, kvs_together)])
    for (ha, la), (ht, lt) in zip(alone, together):
        torch.testing.assert_close(ht, ha, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(lt, la, rtol=1e-4, atol=1e-4)
    for a, t in zip(kvs_alone, kvs_together):
        assert a.length == t.length
        torch.testing.assert_close(t.k, a.k, rtol=1e-4, atol=1e-5)


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(engine, monkeypatch):
    with BatchEngine(engine) as batch:
        plan = batch.scheduler.plan
        calls = iter([RuntimeError("a bug in planning")])

        def broken_once():
            for exc in calls:
                raise exc
            return plan()

        monkeypatch.setattr(batch.scheduler, "plan", broken_once)
        with pytest.raises(RuntimeError, match="a bug in planning"):
            batch.generate([PROMPTS[0]], SamplingParams(max_new_tokens=4))
        assert batch.stats()["free_blocks"] == batch.config.kv_blocks
        assert len(batch.generate([PROMPTS[1]], SamplingParams(max_new_tokens=4))[0].token_ids) == 4


@pytest.mark.parametrize("mode", ["autoregressive", "draft", "hybrid"])
def test_prompts_sharing_a_prefix_share_its_blocks(engine, mode):
    """A long common preamble: the first request computes it, the next ones find its blocks (fewer
    tokens through the model) and still decode the output one at a time gives."""
    preamble = "You are a careful assistant. Answer briefly and precisely, in plain words. " * 3
    prompts = [preamble + p for p in PROMPTS]
    params = SamplingParams(max_new_tokens=24, k=3)
    expected = engine.generate(prompts, params, mode=mode)
    with BatchEngine(engine, BatchConfig(kv_block_size=4, prefix_caching=True)) as batch:
        first = batch.generate(prompts[:1], params, mode=mode)
        fed_before = batch.scheduler.blocks.hit_tokens
        rest = batch.generate(prompts[1:], params, mode=mode)
        stats = batch.stats()
    assert [c.token_ids for c in first + rest] == [c.token_ids for c in expected]
    preamble_tokens = len(engine.target.tokenizer(preamble)["input_ids"])
    assert batch.scheduler.blocks.hit_tokens - fed_before >= 4 * (preamble_tokens // 4 - 1)
    assert 0.4 < stats["prefix_cache_hit_rate"] < 1


def test_eagle3_requests_compute_their_whole_prompt(eagle_engine):
    """eagle3 reads the target's features at every prompt position: its requests never share."""
    prompts = ["The same long preamble for everyone. " * 4 + p for p in PROMPTS[:2]]
    with BatchEngine(eagle_engine, BatchConfig(kv_block_size=4, prefix_caching=True)) as batch:
        batch.generate(prompts, SamplingParams(max_new_tokens=8), mode="draft")
        assert batch.scheduler.blocks.hit_tokens == 0
        for prompt in prompts:  # one after the other: the second finds the first's blocks
            batch.generate([prompt], SamplingParams(max_new_tokens=8), mode="autoregressive")
        assert batch.scheduler.blocks.hit_tokens > 0


@pytest.mark.parametrize("mode", ["draft", "hybrid"])
def test_steps_the_governor_caps_are_recorded_as_load_and_not_judged_as_the_drafts(pair, mode, monkeypatch):
    """With speculation off at every batch size of two rows or more (the governor's `plain` regime),
    requests running together take plain steps: the record says `load` for each, the output stays the
    target's, and `draft_counts` (what the monitor and mining judge the draft by) leaves them out."""
    from draftwheel.serving.engine.records import LOAD, draft_counts

    sink = Records()
    serial = make_engine(pair)
    params = SamplingParams(max_new_tokens=12, k=3)
    expected = [c.token_ids for c in serial.generate(PROMPTS[:4], params, mode=mode)]
    with BatchEngine(make_engine(pair, sink)) as batch:
        monkeypatch.setattr(batch.governor, "regime", lambda rows: ALL if rows < 2 else PLAIN)
        got = batch.generate(PROMPTS[:4], params, mode=mode)
    assert [c.token_ids for c in got] == expected
    capped = [s for r in sink.records for s in r.steps if s.source == LOAD]
    assert capped and all(s.k == 0 and s.accepted == 0 for s in capped)
    for record in sink.records:
        drafted, accepted, steps = draft_counts(record)
        load_steps = sum(s.source == LOAD for s in record.steps)
        own = [s for s in record.steps if s.source != LOAD and (mode == "draft" or (s.source or s.k))
               and s.source != "suffix"]
        assert steps == len(own) and steps <= record.verify_steps - load_steps
        assert (drafted, accepted) == (sum(s.k for s in own), sum(s.accepted for s in own))


@pytest.mark.parametrize("mode", ["hybrid", "suffix"])
def test_the_governors_index_regime_caps_the_draft_model_and_leaves_the_index_its_proposals(pair, mode, monkeypatch):
    """Under the governor's `index` regime at every load the draft model is capped, not the suffix index: an
    index proposal costs only its verify rows, which each row's own rule prices at its load. The rows
    still verify the index's proposals (for the prompts it holds) after the cap has made a plain step,
    never a model's draft, and the output stays the target's."""
    from draftwheel.serving.engine.records import LM_DRAFT, LOAD, SUFFIX

    sink = Records()
    params = SamplingParams(max_new_tokens=16, k=3)
    expected = [c.token_ids for c in make_engine(pair).generate(PROMPTS[:4], params, mode="autoregressive")]
    with BatchEngine(make_engine(pair, sink), BatchConfig(spec_index_regime=True)) as batch:
        assert INDEX in batch.governor.regimes
        monkeypatch.setattr(batch.governor, "regime", lambda rows: INDEX)
        got = batch.generate(PROMPTS[:4], params, mode=mode)
    assert [c.token_ids for c in got] == expected
    sources = [[s.source for s in r.steps if s.k or s.source == LOAD] for r in sink.records]
    assert any(SUFFIX in steps[steps.index(LOAD):] for steps in sources if LOAD in steps)
    assert not any(LM_DRAFT in steps for steps in sources)


def test_hybrid_rows_in_a_batch_time_their_steps_into_the_pace_of_that_load(pair, monkeypatch):
    """In a batch a row's verify share shrinks while its drafting stays whole, so whether drafting pays
    is learned per load (adaptive.LoadPaces): four requests decoding together time their draft steps
    into the pace for 3-4 rows, not into the one a request alone will resume."""
    with BatchEngine(make_engine(pair)) as batch:
        monkeypatch.setattr(batch.governor, "regime", lambda rows: ALL)  # the rows may draft at any load
        batch.generate(PROMPTS[:4], SamplingParams(max_new_tokens=16, k=3), slice="chat", mode="hybrid")
        paces = batch.engine.paces.resume(("chat", "draft", "", ""))
    assert paces.at(4).draft_steps > 0
    assert paces.at(1).draft_steps < paces.draft_steps
