"""Engine behaviour on tiny random Llama models built in the test (seconds on CPU).

The draft is the target with Gaussian noise on its output head, so acceptance is partial (roughly
0.3-0.8): both the all-accepted and the rollback paths run in every multi-token test.
"""

import copy
import random
import threading

import pytest
import torch

from draftwheel.serving.engine.engine import Engine, PromptTooLongError

from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.testing import build_tokenizer, tiny_llama
from tests.serving.law import chi_square, window_law
from tests.serving.law import assert_in_support

PROMPTS = ["The quick brown", "Hello! How can", "Please write a short", "import os\n", "def add(a, b):"]


def noisy_copy(model, scale, seed=1):
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight = draft.lm_head.weight
        weight.add_(torch.randn(weight.shape, generator=generator) * weight.std() * scale)
    return draft



@pytest.fixture(scope="module")
def pair():
    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    return tokenizer, target, noisy_copy(target, 0.3)


@pytest.fixture(scope="module")
def engine(pair):
    tokenizer, target, draft = pair
    return Engine(from_objects(target, tokenizer, "target"), from_objects(draft, tokenizer, "draft"))


def hf_greedy(model, prompt_ids, n):
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_identical_to_hf_generate(engine, pair, k):
    _, target, _ = pair
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=40, k=k))
    for completion in completions:
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 40), completion.prompt
    record_steps = [s for c in completions for s in c.record.steps]
    assert any(s.accepted < s.k for s in record_steps), "no rejection: rollback path untested"
    assert any(s.accepted == s.k > 0 for s in record_steps), "no full acceptance: bonus path untested"
    assert all(s.k <= k for s in record_steps)


def test_autoregressive_mode_identical_to_hf(engine, pair):
    _, target, _ = pair
    completion, = engine.generate(["The quick brown"], SamplingParams(max_new_tokens=25), mode="autoregressive")
    assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 25)
    assert completion.record.mode == "autoregressive" and completion.record.draft_id is None
    assert completion.record.steps == []


def test_kv_rollback_equals_reencoding(pair):
    _, target, _ = pair
    ids = torch.tensor([5, 17, 42, 99, 7, 250, 31, 8])
    rolled = CachedLM(target)
    rolled.forward(ids[:3])
    rolled.forward(ids[3:])
    rolled.rollback(3)
    fresh = CachedLM(target)
    fresh.forward(ids[:5])
    assert rolled.length == fresh.length == 5
    for layer_r, layer_f in zip(rolled.cache.layers, fresh.cache.layers):
        torch.testing.assert_close(layer_r.keys, layer_f.keys)
        torch.testing.assert_close(layer_r.values, layer_f.values)
    # Continuing after the rollback gives the logits of a cache that never saw the dropped tokens.
    torch.testing.assert_close(rolled.forward(torch.tensor([3])), fresh.forward(torch.tensor([3])))


def test_record_totals_consistent_with_steps(engine):
    completion, = engine.generate(["Hello! How can"], SamplingParams(max_new_tokens=30, k=3), slice="chat")
    record = completion.record
    assert record.slice == "chat" and record.mode == "draft"
    assert record.target_id.name == "target" and record.draft_id.name == "draft"
    assert record.drafted_tokens == sum(s.k for s in record.steps)
    assert record.accepted_tokens == sum(s.accepted for s in record.steps)
    assert record.verify_steps == len(record.steps)
    # Every step emits accepted + 1 tokens (the first, the prompt's prefill, is a step of k = 0).
    assert sum(s.accepted + 1 for s in record.steps) >= len(record.output_token_ids)
    assert completion.stats.mean_accepted_length == pytest.approx(
        (record.accepted_tokens + record.verify_steps) / record.verify_steps)
    assert 0 < record.ttft_s <= record.latency_s


def test_max_tokens_eos_and_stop_strings(engine, pair):
    tokenizer, target, _ = pair
    length, = engine.generate(["The quick brown"], SamplingParams(max_new_tokens=7, k=6))
    assert len(length.token_ids) == 7 and length.finish_reason == "length"
    # This prompt makes the target emit EOS at once (seen in its greedy output).
    eos, = engine.generate(["def add(a, b):"], SamplingParams(max_new_tokens=20))
    assert eos.token_ids[-1] == tokenizer.eos_token_id and eos.finish_reason == "stop"
    assert eos.token_ids == hf_greedy(target, eos.prompt_token_ids, 20)
    full, = engine.generate(["Hello! How can"], SamplingParams(max_new_tokens=30))
    stop = full.text[5:8]
    cut, = engine.generate(["Hello! How can"], SamplingParams(max_new_tokens=30, stop=[stop]))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    assert stop not in cut.text and len(cut.token_ids) < len(full.token_ids)
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]


def test_stream_deltas_concatenate_to_text(engine):
    *deltas, completion = engine.stream("Please write a short", SamplingParams(max_new_tokens=30, k=3))
    assert all(isinstance(d, str) and d for d in deltas) and len(deltas) > 1
    assert "".join(deltas) == completion.text


def test_sampling_is_seeded_and_reproducible(engine):
    params = SamplingParams(max_new_tokens=20, temperature=0.9, top_p=0.95, top_k=50, seed=7)
    first, second = engine.generate(["The quick brown"] * 2, params)
    assert first.token_ids == second.token_ids
    assert first.record.sampling.seed == 7


def test_sampled_tokens_follow_target_distribution(engine, pair):
    """The first two tokens of a sampled completion (the second one passes through draft + rejection
    sampling, k=1) must follow the target's joint law (see `check_two_token_law`)."""
    check_two_token_law(engine, pair, SamplingParams(max_new_tokens=3, temperature=1.0, top_k=3, k=1))


TWO_TOKEN_PROMPT = "The quick brown"


def check_two_token_law(engine, pair, params, mode=None, n=1000):
    """Sample `n` seeded completions of TWO_TOKEN_PROMPT; return them. Their first two tokens must follow
    the target's joint law p(a) p(b | a), computed exactly from target forwards through transformers' own
    warpers (tests/serving/law.py, not the engine's `warp`). Pearson's X^2 with cells expecting fewer
    than 5 pooled, and samples outside the support counted (there must be none); seeded, so
    deterministic. Control: the same samples against the control model's own law (cells it cannot
    produce pooled and counted the same way, never smoothed) are rejected."""
    tokenizer, target, control = pair
    prompt_ids = tokenizer(TWO_TOKEN_PROMPT)["input_ids"]
    completions = [engine.generate([TWO_TOKEN_PROMPT], SamplingParams(**{**params.__dict__, "seed": seed}),
                                   mode=mode)[0] for seed in range(n)]
    samples = [tuple(completion.token_ids[:2]) for completion in completions]
    result = chi_square(samples, window_law(target, prompt_ids, params, 0, 2))
    assert result.outside_support == 0 and result.pvalue > 1e-3, result
    assert chi_square(samples, window_law(control, prompt_ids, params, 0, 2)).pvalue < 1e-6
    return completions


def test_prompt_too_long_and_bad_mode(engine, pair):
    tokenizer, target, _ = pair
    long_prompt = "word " * target.config.max_position_embeddings
    with pytest.raises(PromptTooLongError, match="context"):
        engine.generate([long_prompt], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="mode"):
        engine.generate(["hi"], SamplingParams(), mode="beam")
    with pytest.raises(ValueError, match="medusa"):
        engine.generate(["hi"], SamplingParams(), mode="medusa")
    no_draft = Engine(from_objects(target, tokenizer, "target"))
    assert no_draft.default_mode == "autoregressive"
    with pytest.raises(ValueError, match="draft"):
        no_draft.generate(["hi"], SamplingParams(), mode="draft")


def test_chat_template_applied(engine, pair):
    tokenizer, _, _ = pair
    completion, = engine.generate(["Hello!"], SamplingParams(max_new_tokens=5), chat=True)
    assert completion.record.prompt.startswith("<|im_start|>user\nHello!<|im_end|>")
    assert completion.record.prompt.endswith("<|im_start|>assistant\n")
    assert completion.prompt == "Hello!"


class _Collect:
    def __init__(self):
        self.records = []

    def write(self, record):
        self.records.append(record)

    def observe(self, record):
        self.records.append(record)


class _Broken:
    def write(self, record):
        raise OSError("disk full")


def test_records_go_to_sink_and_metrics_and_failures_do_not_fail(pair):
    tokenizer, target, draft = pair
    sink, metrics = _Collect(), _Collect()
    engine = Engine(from_objects(target, tokenizer, "t"), from_objects(draft, tokenizer, "d"), sink=sink,
                    metrics=metrics)
    completions = engine.generate(["a", "b"], SamplingParams(max_new_tokens=5))
    assert [r.request_id for r in sink.records] == [c.request_id for c in completions] == \
        [r.request_id for r in metrics.records]
    broken = Engine(from_objects(target, tokenizer, "t"), sink=_Broken())
    assert broken.generate(["a"], SamplingParams(max_new_tokens=3))[0].finish_reason in ("length", "stop")


def test_swap_draft_keeps_running_request_on_old_draft(engine, pair):
    tokenizer, target, draft = pair
    engine = Engine(from_objects(target, tokenizer, "t"), from_objects(draft, tokenizer, "old"))
    stream = engine.stream("The quick brown", SamplingParams(max_new_tokens=30, k=2))
    next(stream)  # the request has started with the old draft
    engine.swap_draft(from_objects(noisy_copy(target, 1.0, seed=3), tokenizer, "new"))
    *_, completion = stream
    assert completion.record.draft_id.name == "old"
    assert engine.generate(["x"], SamplingParams(max_new_tokens=3))[0].record.draft_id.name == "new"


class _CountingFlag(threading.Event):
    """A cancel flag that counts how often the engine looks at it."""

    def __init__(self):
        super().__init__()
        self.checks = 0

    def is_set(self):
        self.checks += 1
        return super().is_set()


def test_cancel_is_checked_every_step_and_ends_the_stream_without_a_record(pair):
    """The server cuts a request by setting its cancel flag. The engine looks at it on every verification
    step, not only when a text delta comes out: text can stay held back for the rest of a request (a
    random model's run of incomplete UTF-8 characters), and a flag read only between deltas then let a
    cut request run to max_tokens while the process waited to exit. Once set, the stream ends at the
    next step with no Completion and nothing written to the log."""
    tokenizer, target, draft = pair
    sink = _Collect()
    engine = Engine(from_objects(target, tokenizer, "t"), from_objects(draft, tokenizer, "d"), sink=sink)
    flag = _CountingFlag()
    *deltas, completion = engine.stream("The quick brown", SamplingParams(max_new_tokens=40, k=3), mode="draft",
                                        cancel=flag)
    assert completion.record.verify_steps > len(deltas)  # some steps yielded nothing: not one check per delta
    assert flag.checks == completion.record.verify_steps
    flag, sink.records = _CountingFlag(), []
    stream = engine.stream("The quick brown", SamplingParams(max_new_tokens=40, k=3), mode="draft", cancel=flag)
    next(stream)
    flag.set()
    checks = flag.checks
    assert list(stream) == [] and flag.checks == checks + 1 and sink.records == []


@pytest.fixture(scope="module")
def heads(pair):
    """Medusa heads with random (non-identity) blocks: partial acceptance, both verify paths."""
    from draftwheel.serving.engine.medusa import MedusaHeads

    _, target, _ = pair
    heads = MedusaHeads.for_target(target, n_heads=3)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for block in heads.blocks:
            block[0].linear.weight.copy_(torch.randn(block[0].linear.weight.shape, generator=generator) * 0.2)
    return heads.eval()


def test_medusa_greedy_identical_and_sampled_runs(pair, heads, tmp_path):
    tokenizer, target, _ = pair
    engine = Engine(from_objects(target, tokenizer, "target"), medusa=heads)
    assert engine.default_mode == "medusa"
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=30, k=3))
    for completion in completions:
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 30)
        assert completion.record.mode == "medusa" and completion.record.draft_id.name == "medusa-heads"
    assert any(s.accepted < s.k for c in completions for s in c.record.steps)
    # Sampled: every token inside the target's top 3 given its prefix, from chains of 2-3 drafted tokens,
    # reproducible by seed (the law itself: tests/serving/test_sampling_law.py).
    params = SamplingParams(max_new_tokens=20, temperature=1.0, top_k=3, k=3, seed=3)
    sampled, = engine.generate(["The quick"], params)
    assert_in_support(target, sampled.prompt_token_ids, sampled.token_ids, params)
    assert any(s.k >= 2 for s in sampled.record.steps)
    assert engine.generate(["The quick"], params)[0].token_ids == sampled.token_ids


def test_medusa_accepts_when_heads_guess_right():
    """A tied-embedding random model repeats its last token, and identity-initialised heads predict
    "the same as the target's next token": the chain is right, so whole chains are accepted."""
    from draftwheel.serving.engine.medusa import MedusaHeads

    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=True)
    engine = Engine(from_objects(target, tokenizer, "t"), medusa=MedusaHeads.for_target(target, n_heads=4).eval())
    completion, = engine.generate(["The quick"], SamplingParams(max_new_tokens=21, k=4))
    assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 21)
    assert completion.record.accepted_tokens == completion.record.drafted_tokens == 16
    assert completion.stats.mean_accepted_length == 5.0


def test_engine_from_specs_with_medusa_dir(pair, heads, tmp_path):
    from draftwheel.serving.testing import save_model

    tokenizer, target, _ = pair
    target_dir = save_model(target, tokenizer, tmp_path / "target")
    heads.save(tmp_path / "heads")
    engine = engine_from_specs(target_dir, medusa=tmp_path / "heads")
    completion, = engine.generate(["Hello! How can"], SamplingParams(max_new_tokens=12))
    assert completion.record.draft_id.name == "heads" and len(completion.record.draft_id.sha256) == 64
    assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 12)


def test_adaptive_k_choice_follows_acceptance_and_cost():
    from draftwheel.serving.engine.adaptive import AdaptiveK, best_k, expected_tokens

    assert expected_tokens(0.0, 5) == 1.0 and expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert best_k(0.95, 0.05, 8) == 8  # cheap, accurate draft: draft as far as allowed
    assert best_k(0.2, 0.3, 8) == 1  # poor draft: the shortest chain
    assert best_k(0.8, 0.9, 8) == 1  # draft nearly as slow as the target
    assert 1 < best_k(0.8, 0.1, 8) < 8
    controller = AdaptiveK(k_max=8)
    for _ in range(20):  # every draft token rejected, draft cost 10% of the target
        controller.update(k=controller.next_k(), accepted=0, draft_s=0.01, target_s=0.1)
    assert controller.a < 0.1 and controller.next_k() == 1
    for _ in range(40):  # now all accepted
        k = controller.next_k()
        controller.update(k=k, accepted=k, draft_s=0.01 * k, target_s=0.1)
    assert controller.a > 0.9 and controller.next_k() == 8
    assert controller.c == pytest.approx(0.1, rel=1e-4)


def test_score_calibration_stops_trusting_an_index_that_over_promises():
    from draftwheel.serving.engine.adaptive import ScoreCalibration, index_beats_draft

    chat, templated = ScoreCalibration(), ScoreCalibration()
    assert chat.scaled(8.0) == 8.0  # the prior trusts the score
    assert index_beats_draft(chat.scaled(8.0), a=0.6, k=5)
    for _ in range(10):
        chat.update(score=8.0, accepted=0)  # a once-seen match: promised 8 tokens, the first one rejected
        templated.update(score=8.0, accepted=8)
    assert chat.ratio < 0.1 and templated.ratio == pytest.approx(1.0)
    assert not index_beats_draft(chat.scaled(8.0), a=0.6, k=5)  # the draft's E(0.6, 5) - 1 = 1.37
    assert index_beats_draft(templated.scaled(8.0), a=0.6, k=5)
    for _ in range(30):  # the index starts to deliver again: trust comes back
        chat.update(score=4.0, accepted=4)
    assert chat.ratio > 0.9


def test_hybrid_uses_one_token_matches_only_in_place_of_plain_steps():
    from draftwheel.serving.engine.adaptive import suffix_drafts

    assert suffix_drafts(score=0.9, match_len=1, draft_pays=False, a=0.1, k=5)  # instead of a plain step
    assert not suffix_drafts(score=0.9, match_len=1, draft_pays=True, a=0.1, k=5)  # E(0.1, 5) - 1 = 0.11
    assert suffix_drafts(score=0.9, match_len=2, draft_pays=True, a=0.1, k=5)
    assert not suffix_drafts(score=0.9, match_len=4, draft_pays=True, a=0.6, k=5)  # the draft's 1.37 wins


def feed(pace, steps: int, tokens, rows: int = 5, draft_s: float = 0.1, verify_s: float = 1.0) -> list[bool]:
    """`steps` steps of `pace`: each draft step it allows emits `tokens(i)`; returns the choices."""
    choices = []
    for i in range(steps):
        pays = pace.draft_pays()
        choices.append(pays)
        if pays:
            pace.drafted(tokens(i), rows, draft_s, verify_s)
    return choices


def test_step_pace_keeps_a_draft_that_pays_and_drops_one_that_does_not():
    """Units: a 5-row verify costs 1 + 0.05 * 4 = 1.2 (the clock's prior slope) and drafting a tenth of
    it more, 1.32 units. 2-3 tokens a step is ~1.9 tokens per unit: it drafts on every step. One token
    a step (0.76 per unit, a draft whose every token is rejected) loses: after the warm-up it drafts on
    a few per cent of steps (the draws whose optimistic tail beats 1), not never, so a recovery shows."""
    from draftwheel.serving.engine.adaptive import StepPace

    good = StepPace()
    assert all(feed(good, 100, lambda i: 2 + i % 2))
    assert good.ratio == pytest.approx(2.5 / 1.32, rel=0.05)

    bad = StepPace(warmup=3)
    choices = feed(bad, 400, lambda i: 1)
    assert choices[:3] == [True] * 3 and bad.ratio == pytest.approx(1 / 1.32)
    assert 0 < sum(choices[3:]) < 0.05 * 397


def test_step_pace_notices_a_draft_that_recovers():
    from draftwheel.serving.engine.adaptive import StepPace

    pace = StepPace()
    feed(pace, 200, lambda i: 1)
    assert not all(feed(pace, 20, lambda i: 1))
    choices = feed(pace, 300, lambda i: 4)  # the draft now emits 4 tokens a step
    assert sum(choices[-50:]) == 50  # once its draws show it, it drafts on every step again


def test_step_pace_weighs_a_marginal_draft_by_the_odds_it_pays():
    """Around break-even the evidence is uncertain: the share of steps drafted follows the estimated
    odds that the draft pays, rising with the draft's true speed (Thompson sampling)."""
    from draftwheel.serving.engine.adaptive import StepPace

    def share(mean_tokens: float) -> float:
        pace, noise = StepPace(), random.Random(1)  # tokens: 1 + a binomial count, mean `mean_tokens`
        choices = feed(pace, 600, lambda i: 1 + sum(noise.random() < (mean_tokens - 1) / 4 for _ in range(4)))
        return sum(choices[100:]) / 500

    shares = [share(m) for m in (1.1, 1.32, 1.6)]  # 0.83, 1.0 and 1.21 tokens per unit
    assert shares[0] < 0.15 and shares[2] > 0.9 and shares[0] < shares[1] < shares[2], shares


def test_step_pace_is_unmoved_by_machine_load_and_deterministic_by_seed():
    """Costs are the drafting time over the same step's verify time: a machine twice as slow for both
    leaves the ratio alone. The draws come from the pace's own seeded generator."""
    from draftwheel.serving.engine.adaptive import StepPace

    fast, slow = StepPace(), StepPace()
    noise = random.Random(2)
    tokens = [1 + noise.randrange(4) for _ in range(200)]
    assert feed(fast, 200, tokens.__getitem__) == feed(slow, 200, tokens.__getitem__, draft_s=0.2, verify_s=2.0)
    assert fast.ratio == pytest.approx(slow.ratio)


def test_suffix_proposal_replaces_a_plain_step_only_when_it_beats_one():
    """With drafting ruled out, a 16-token proposal costs 1 + 0.05 * 16 = 1.8 units: it must promise
    more than 0.8 accepted tokens to beat a plain step's one token per unit."""
    from draftwheel.serving.engine.adaptive import suffix_drafts

    cost = lambda rows: 1.0 + 0.05 * (rows - 1)  # noqa: E731
    assert suffix_drafts(0.9, 4, False, a=0.5, k=4, n_index=16, row_cost=cost)
    assert not suffix_drafts(0.7, 4, False, a=0.5, k=4, n_index=16, row_cost=cost)
    assert suffix_drafts(0.3, 4, False, a=0.5, k=4, n_index=2, row_cost=cost)  # 1.3 tokens for 1.1 units


def test_pace_memory_resumes_a_copy_per_key_and_keeps_the_newest_keys():
    from draftwheel.serving.engine.adaptive import PaceMemory, StepPace

    memory = PaceMemory(max_keys=2)
    first = memory.resume("chat")
    assert first.draft_steps == 0
    for _ in range(4):
        first.at(1).draft_pays()
        first.at(1).drafted(1, 5, 0.1, 1.0)
    memory.keep("chat", first)
    again = memory.resume("chat")
    assert again is not first and again.draft_steps == 4 and again.at(1).ratio == first.at(1).ratio  # no warm-up
    again.at(1).drafted(5, 5, 0.1, 1.0)
    assert memory.resume("chat").draft_steps == 4  # a resumed copy changes nothing until it is kept
    assert memory.resume("sql").draft_steps == 0
    memory.keep("sql", memory.resume("sql"))
    memory.keep("code", memory.resume("code"))
    assert len(memory) == 2 and memory.resume("chat").draft_steps == 0  # the oldest key was dropped
    custom = PaceMemory(factory=lambda: StepPace(warmup=7))
    assert custom.resume("chat").at(1).warmup == 7 and custom.resume("chat").at(8).warmup == 7


def test_a_copy_of_the_pace_memory_starts_where_it_stands_and_never_moves_it():
    from draftwheel.serving.engine.adaptive import PaceMemory, StepPace

    memory = PaceMemory(max_keys=3, factory=lambda: StepPace(warmup=5))
    pace = memory.resume("code")
    pace.at(1).drafted(1, 5, 0.1, 1.0)
    memory.keep("code", pace)
    copied = memory.copy()
    assert copied.resume("code").draft_steps == 1 and copied.resume("chat").at(1).warmup == 5
    measured = copied.resume("code")
    measured.at(1).drafted(1, 5, 0.1, 1.0)
    copied.keep("code", measured)
    copied.keep("chat", copied.resume("chat"))
    assert copied.resume("code").draft_steps == 2 and len(copied) == 2
    assert memory.resume("code").draft_steps == 1 and len(memory) == 1  # the original is where it was
    pace.at(1).drafted(1, 5, 0.1, 1.0)  # the kept pace itself is not shared either
    assert copied.resume("code").draft_steps == 2


def test_a_pace_learned_under_batched_load_leaves_a_lone_request_s_pace_alone():
    """In a batch a row's verify share shrinks while its drafting stays whole: there, drafting stops
    paying. That verdict belongs to the load it was measured at: a request alone still drafts."""
    from draftwheel.serving.engine.adaptive import LoadPaces

    paces = LoadPaces()
    assert paces.at(3) is paces.at(4) and paces.at(4) is not paces.at(5) and paces.at(0) is paces.at(1)
    alone, batched = paces.at(1), paces.at(4)
    feed(alone, 100, lambda i: 2)  # 2 tokens a step for 1.2 * (1 + 0.1 / 1.0) units: 1.5 a unit
    # the row's share of a batched verify is a fifth of the forward, the drafting as long as alone:
    # 1.2 * (1 + 0.3 / 0.2) = 3 units, 0.67 tokens a unit
    batched_choices = feed(batched, 300, lambda i: 2, draft_s=0.3, verify_s=0.2)
    assert sum(batched_choices[100:]) < 0.05 * 200  # under load, plain steps
    assert all(feed(alone, 50, lambda i: 2)) and alone.ratio == pytest.approx(2 / 1.32, rel=0.05)
    assert paces.draft_steps == alone.draft_steps + batched.draft_steps


def test_adaptive_k_in_engine_logs_each_step_k(engine, pair):
    _, target, _ = pair
    completion, = engine.generate(["The quick brown"], SamplingParams(max_new_tokens=40, k=6, adaptive_k=True))
    ks = [s.k for s in completion.record.steps]
    assert all(0 <= k <= 6 for k in ks) and len(set(ks)) > 1  # the controller moved k
    assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 40)


def test_stream_holds_back_a_possible_stop_prefix(pair):
    from draftwheel.serving.engine.stopping import OutputState

    tokenizer, _, _ = pair
    out = OutputState(tokenizer, eos_ids=set(), stop=["END"], max_new_tokens=100)
    out.extend(tokenizer("hello EN")["input_ids"])
    assert out.stable_text() == "hello "  # "EN" could become "END"
    first = list(out.token_ids)
    out.extend(tokenizer("D more")["input_ids"])
    assert out.finished and out.text == "hello " and out.finish_reason == "stop"
    # The stop string began in the first step's tokens: the cut reaches back into them.
    assert out.token_ids == first[: len(out.token_ids)] and "more" not in tokenizer.decode(out.token_ids)


def test_the_hybrid_weighs_what_each_choice_costs():
    """Equal promises go to the index once the draft's tokens cost anything (c > 0): a draft that learned
    what the index already copies must not take the step and pay c for the same tokens. Free drafting
    (c = 0, rows free) is the old rule, score > E(a, k) - 1; long index proposals pay for their rows."""
    from draftwheel.serving.engine.adaptive import expected_tokens, index_beats_draft

    tie = expected_tokens(0.6, 5) - 1  # the index promises exactly what the draft expects
    assert not index_beats_draft(tie, a=0.6, k=5)
    assert index_beats_draft(tie, a=0.6, k=5, n_index=5, c=0.08)
    assert index_beats_draft(tie + 0.01, a=0.6, k=5)
    rows = lambda n: 1.0 + 0.1 * (n - 1)  # a CPU where each verify row costs a tenth of a step
    assert not index_beats_draft(tie, a=0.6, k=5, n_index=16, c=0.02, row_cost=rows)  # 16 rows: 2.5 steps


def test_the_verify_clock_fits_the_cost_of_a_row():
    from draftwheel.serving.engine.adaptive import VerifyClock

    clock = VerifyClock(prior_slope=0.05)
    assert clock.cost(6) == pytest.approx(1.25)  # nothing seen: the prior
    for _ in range(3):
        clock.observe(1, 0.020)  # 20 ms a step, 2 ms per extra row: slope 0.1
    assert clock.slope == 0.05  # one row count alone cannot show a slope
    for rows in (2, 4, 6, 17):
        clock.observe(rows, 0.020 + 0.002 * (rows - 1))
    assert clock.slope == pytest.approx(0.1, rel=1e-6) and clock.cost(11) == pytest.approx(2.0)


def test_the_verify_clock_prices_row_counts_it_has_measured_by_their_own_times():
    """On a CPU the cost is not linear in the rows: here 1-5 rows take the same 40 ms and 17 rows 70 ms.
    The line through them prices a 4-row verify above a step; once a 1-row forward and a 4-row one have
    each been seen twice, their own mean times price it. Counts not measured yet keep the line."""
    from draftwheel.serving.engine.adaptive import VerifyClock

    clock = VerifyClock(prior_slope=0.05)
    for rows in (4, 17, 4, 17, 1):
        clock.observe(rows, 0.070 if rows == 17 else 0.040)
    assert clock.cost(4) == pytest.approx(1.0 + clock.slope * 3) and clock.cost(4) > 1.05  # one 1-row step: the line
    clock.observe(1, 0.040)
    assert clock.cost(4) == pytest.approx(1.0) and clock.cost(17) == pytest.approx(1.75)
    assert clock.cost(5) == pytest.approx(1.0 + clock.slope * 4)  # never seen: the line


def test_a_load_met_first_starts_from_another_load_s_tokens_when_even_the_best_case_cannot_pay():
    """The load moves what drafting costs, never the tokens a draft step emits. A draft whose steps
    emit one token cannot pay at any load (1 token for a 5-row verify's 1.2 units, drafting free): a
    lone request after batched traffic is spared the warm-up. One whose steps emit 3 tokens may pay
    alone though batching priced it out: alone it starts fresh, drafts and measures its real cost."""
    from draftwheel.serving.engine.adaptive import LoadPaces

    hopeless = LoadPaces()
    for _ in range(30):  # 30 draft steps measured in a batch of 4
        hopeless.at(4).drafted(1, 5, 0.3, 0.2)
    alone = hopeless.at(1)
    assert (alone.draft_steps, alone.seed_steps) == (0, 30) and alone.ratio == pytest.approx(1 / 1.2)
    assert sum(feed(alone, 30, lambda i: 1)) == 0  # a fresh pace drafts its first 3 steps whatever they bring

    priced_out = LoadPaces()
    batched = feed(priced_out.at(4), 200, lambda i: 3, draft_s=0.6, verify_s=0.2)  # 3 tokens for 4.8 units
    assert sum(batched[100:]) < 10
    alone = priced_out.at(1)
    assert (alone.draft_steps, alone.seed_steps) == (0, 0)  # 3 / 1.2 tokens a unit at best: measure it
    assert all(feed(alone, 100, lambda i: 3))  # alone, drafting costs a tenth of the verify: it pays
    assert alone.ratio == pytest.approx(3 / 1.32, rel=0.02)
    assert priced_out.at(4).ratio == pytest.approx(3 / 4.8, rel=0.02)  # and the batched load keeps its own
    assert LoadPaces().at(1).draft_steps == 0  # nothing measured anywhere: a fresh pace


def test_a_load_met_first_is_not_seeded_from_a_warm_up_s_worth_of_steps():
    """A pessimistic seed keeps the draft out for about a hundred steps: three steps measured in a batch
    (the governor kept that load on plain steps) are too few to stand on, so a lone request measures."""
    from draftwheel.serving.engine.adaptive import LoadPaces

    few = LoadPaces()
    for _ in range(3):
        few.at(4).drafted(1, 5, 0.3, 0.2)
    alone = few.at(1)
    assert (alone.draft_steps, alone.seed_steps) == (0, 0)
    assert all(feed(alone, 30, lambda i: 3))  # alone the draft pays: it drafts through
    enough = LoadPaces(min_seed_steps=3)
    for _ in range(3):
        enough.at(4).drafted(1, 5, 0.3, 0.2)
    assert enough.at(1).seed_steps == 3  # with the floor at three, the same steps seed
