"""Engine modes `suffix` and `hybrid` on tiny random Llama models: lossless (greedy identity with HF
generate, the two-token chi-square law of test_engine), per-step sources, index updates, errors.

The suffix index is seeded with the target's own greedy outputs with every 4th token corrupted, so
proposals are partly right: both the accepted and the rejected verification paths of suffix drafts
run. The draft model is test_engine's noisy copy of the target (acceptance roughly 0.3-0.8).
"""

import pytest

from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.suffix import SuffixIndex, target_key
from tests.serving.test_engine import PROMPTS, TWO_TOKEN_PROMPT, check_two_token_law, hf_greedy, pair  # noqa: F401


def corrupted(tokens, every=4, vocab=300):
    return [(t + 7) % vocab if i % every == every - 1 else t for i, t in enumerate(tokens)]


def make_engine(pair, index=None):
    tokenizer, target, draft = pair
    loaded = from_objects(target, tokenizer, "target")
    index = index if index is not None else SuffixIndex(target_key(loaded.model_id))
    return Engine(loaded, from_objects(draft, tokenizer, "draft"), suffix_index=index)


def seeded_engine(pair):
    """An engine whose index holds every prompt's corrupted greedy continuation (60 tokens)."""
    tokenizer, target, _ = pair
    engine = make_engine(pair)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        engine.suffix_index.add(ids + corrupted(hf_greedy(target, ids, 60)))
    return engine


@pytest.fixture(scope="module")
def seeded(pair):
    return seeded_engine(pair)


@pytest.mark.parametrize("mode", ["suffix", "hybrid"])
def test_greedy_identical_to_hf_generate(seeded, pair, mode):
    _, target, _ = pair
    requests_before = seeded.suffix_index.requests
    unseen = f"Once upon a time in {mode} mode"  # in no index (the fixture is shared): hybrid drafts it with the model
    completions = seeded.generate(PROMPTS + [unseen], SamplingParams(max_new_tokens=40, k=3), mode=mode)
    for completion in completions:
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 40), completion.prompt
        assert completion.record.mode == mode
    steps = [s for c in completions for s in c.record.steps]
    suffix_steps = [s for s in steps if s.source == "suffix"]
    assert any(s.accepted < s.k for s in suffix_steps), "no rejected suffix draft"
    assert any(s.accepted == s.k for s in suffix_steps), "no fully accepted suffix draft"
    assert all(s.source is None for s in steps if s.k == 0)
    if mode == "hybrid":
        assert {s.source for s in steps} >= {"suffix", "draft"}
        assert all(s.k <= 3 for s in steps if s.source == "draft")
        assert completions[0].record.draft_id.name == "draft"
    else:
        assert {s.source for s in steps} <= {"suffix", None}
        assert completions[0].record.draft_id is None
    assert seeded.suffix_index.requests == requests_before + len(completions)  # each finished request was indexed


def test_hybrid_takes_plain_steps_when_drafting_does_not_pay(pair, monkeypatch):
    from draftwheel.serving.engine.adaptive import LoadPaces
    from tests.serving.test_eagle import EveryThirdStepDrafts

    _, target, _ = pair
    engine = make_engine(pair)  # an empty shared index: the request's own part only
    monkeypatch.setattr(engine.paces, "resume", lambda key: LoadPaces(EveryThirdStepDrafts))
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=30, k=3), mode="hybrid")
    for completion in completions:
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 30), completion.prompt
    steps = [s for c in completions for s in c.record.steps[1:]]  # after the prefill step
    assert any(s.k == 0 and s.source is None for s in steps) and any(s.source == "draft" for s in steps)


def test_finished_request_makes_the_next_identical_one_cheap(pair):
    """Updating as requests finish: a repeat of a finished request is drafted from its own record and
    accepted almost whole (greedy), in a few verification steps."""
    engine = make_engine(pair)
    first, = engine.generate(["Please write a short"], SamplingParams(max_new_tokens=40), mode="suffix")
    again, = engine.generate(["Please write a short"], SamplingParams(max_new_tokens=40), mode="suffix")
    assert again.token_ids == first.token_ids
    assert again.record.accepted_tokens >= 0.8 * len(again.token_ids) - 1
    assert again.record.verify_steps < first.record.verify_steps / 2


def test_requests_naming_no_mode_are_hybrid_when_the_engine_has_the_tier(pair):
    tokenizer, target, draft = pair
    engine = make_engine(pair)
    assert engine.default_mode == "hybrid"
    completion, = engine.generate(["Please write a short"], SamplingParams(max_new_tokens=8))
    assert completion.record.mode == "hybrid"
    without_tier = Engine(from_objects(target, tokenizer, "target"), from_objects(draft, tokenizer, "draft"))
    assert without_tier.default_mode == "draft"


def test_suffix_mode_without_shared_index_uses_the_request_itself(pair):
    tokenizer, target, _ = pair
    engine = Engine(from_objects(target, tokenizer, "target"))
    completion, = engine.generate(["The quick brown"], SamplingParams(max_new_tokens=40), mode="suffix")
    assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 40)
    with pytest.raises(ValueError, match="'hybrid' needs a draft"):
        engine.generate(["hi"], SamplingParams(), mode="hybrid")


def test_index_of_another_target_is_refused(pair):
    tokenizer, target, _ = pair
    with pytest.raises(ValueError, match="suffix index"):
        Engine(from_objects(target, tokenizer, "target"), suffix_index=SuffixIndex("another-target@"))


@pytest.fixture(scope="module")
def two_token_sequences(pair):
    """Proposals on every path of the first two tokens: after the prompt the second most likely token
    is proposed (2 of 4 occurrences), and after each of the top-3 tokens a continuation is known."""
    import torch

    tokenizer, target, _ = pair
    prompt = tokenizer(TWO_TOKEN_PROMPT)["input_ids"]
    sequences = []
    with torch.no_grad():
        top = target(torch.tensor([prompt])).logits[0, -1].topk(3).indices.tolist()
        for a in top + [top[1]]:
            b = int(target(torch.tensor([prompt + [a]])).logits[0, -1].topk(2).indices[1])
            sequences.append(prompt + [a, b])
    return sequences


@pytest.mark.parametrize("mode", ["suffix", "hybrid"])
def test_sampled_tokens_follow_target_distribution(pair, two_token_sequences, mode):
    """test_engine's two-token chi-square law, with suffix drafts (a point-mass q) on the first tokens.
    The index also grows with each of the 1000 finished runs; that keeps the test valid, since the law
    holds whatever proposal a run gets from the index it finds."""
    engine = make_engine(pair)
    for tokens in two_token_sequences:
        engine.suffix_index.add(tokens)
    params = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=3, k=1)
    completions = check_two_token_law(engine, pair, params, mode=mode)
    steps = [s for c in completions for s in c.record.steps]
    assert mode == "suffix" or any(s.source == "draft" for s in steps)
    suffix_steps = [s for s in steps if s.source == "suffix"]
    assert any(s.accepted == 0 for s in suffix_steps) and any(s.accepted > 0 for s in suffix_steps)


def test_metrics_count_each_source(pair):
    from draftwheel.serving.server.metrics import Metrics

    metrics = Metrics()
    completions = seeded_engine(pair).generate(PROMPTS[:3], SamplingParams(max_new_tokens=30, k=3), mode="hybrid")
    for completion in completions:
        metrics.observe(completion.record)
    steps = [s for c in completions for s in c.record.steps]
    for source in ("suffix", "draft"):
        mine = [s for s in steps if s.source == source]
        assert metrics.value("draftwheel_spec_draft_tokens_total", {"source": source}) == sum(s.k for s in mine) > 0
        assert metrics.value("draftwheel_spec_accepted_tokens_total", {"source": source}) == \
            sum(s.accepted for s in mine)
    assert metrics.value("draftwheel_spec_drafts_total") == len(steps)  # all sources together


def test_hybrid_requests_carry_the_pace_per_slice_and_draft(pair):
    """The second hybrid request of a slice starts from the pace the first one measured (no warm-up);
    another slice, or a swapped draft, starts fresh; other modes keep none."""
    tokenizer, _, draft = pair
    engine = make_engine(pair)
    params = SamplingParams(max_new_tokens=24, k=3)
    engine.generate(PROMPTS[2:3], params, slice="chat", mode="suffix")  # (another prompt: not indexed for the next)
    assert len(engine.paces) == 0
    engine.generate(PROMPTS[:1], params, slice="chat", mode="hybrid")
    key = ("chat", "draft", "", "")
    assert len(engine.paces) == 1 and engine.paces.resume(key).draft_steps > 0
    assert engine.paces.resume(key).at(1).draft_steps == engine.paces.resume(key).draft_steps  # a request alone
    engine.generate(PROMPTS[1:2], params, slice="sql", mode="hybrid")
    assert len(engine.paces) == 2
    engine.swap_draft(from_objects(draft, tokenizer, "draft-v2"))
    assert engine.paces.resume(("chat", "draft-v2", "", "")).draft_steps == 0


def emitted_tokens(monkeypatch) -> dict[int, list]:
    """What each request's decoding loop emitted, in all (tokens cut by EOS included), by request in the
    order they first emitted: the truth a record's steps are read against."""
    from draftwheel.serving.engine.decoding import Request

    emitted: dict[int, list] = {}  # id(request) -> [request (kept alive, so ids stay unique), tokens]
    emit = Request.emit

    def counting(self, tokens):
        emitted.setdefault(id(self), [self, 0])[1] += len(tokens)
        return emit(self, tokens)

    monkeypatch.setattr(Request, "emit", counting)
    return emitted


def assert_residual_aligned(completions, emitted) -> None:
    """The served residual reads each record's steps from the right token: from the first when the
    loop's steps emitted every token, else from the second (the first came from the prompt's forward)."""
    from draftwheel.mining.residual import served_residual, steps_hold_first_token

    assert len(completions) == len(emitted)
    for completion, (_, n_emitted) in zip(completions, emitted.values()):
        record = completion.record
        from_steps = sum(step.accepted + 1 for step in record.steps)
        assert steps_hold_first_token(record) == (from_steps == n_emitted), (record.mode, from_steps, n_emitted)
        assert len(served_residual(record)) == len(record.output_token_ids)


@pytest.mark.parametrize("mode", ["suffix", "draft", "hybrid"])
def test_the_served_residual_starts_where_each_loops_steps_start(pair, monkeypatch, mode):
    emitted = emitted_tokens(monkeypatch)
    completions = seeded_engine(pair).generate(PROMPTS, SamplingParams(max_new_tokens=30, k=3), mode=mode)
    assert any(step.accepted for c in completions for step in c.record.steps)
    assert_residual_aligned(completions, emitted)


def test_stretch_length_keeps_tokens_worth_their_rows():
    from draftwheel.serving.engine.adaptive import stretch_length

    # cheap rows (bfloat16 on AMX): every likely token pays; dear rows (float32 on AVX2): fewer do
    assert stretch_length([0.9, 0.8, 0.5], ratio=0.5, row_slope=0.03, tokens=3.0, rows=3) == 3
    assert stretch_length([0.9, 0.8, 0.5], ratio=0.5, row_slope=0.2, tokens=3.0, rows=3) == 1
    assert stretch_length([0.9, 0.8], ratio=0.01, row_slope=0.03, tokens=3.0, rows=3) == 0  # keeps failing here
    assert stretch_length([], ratio=1.0, row_slope=0.0, tokens=1.0, rows=1) == 0


class _FixedClock:
    """A verify clock whose row cost does not follow this machine's timings (a deterministic test)."""

    slope = 0.05

    def observe(self, rows, seconds):
        pass


def test_suffix_steps_verify_the_stretch_while_it_comes_true(pair, monkeypatch):
    """A proposal of one token with three stretch tokens after it: verified whole while the stretch is
    right; a stretch that keeps being rejected stops being verified. Lossless either way."""
    from draftwheel.serving.engine import suffix_decoding
    from draftwheel.serving.engine.suffix import EMPTY, Proposal

    tokenizer, target, _ = pair
    engine = Engine(from_objects(target, tokenizer, "target"))
    prompt = "The quick brown"
    ids = tokenizer(prompt)["input_ids"]
    truth = hf_greedy(target, ids, 40)

    def oracle(right):
        def propose(context, max_k, *parts):
            ahead = truth[len(context) - len(ids):][:4]
            if len(ahead) < 4 or max_k < 4:
                return EMPTY
            stretch = ahead[1:] if right else [(t + 1) % target.config.vocab_size for t in ahead[1:]]
            return Proposal(tokens=ahead[:1], score=1.0, match_len=1, probs=(1.0,), stretch=tuple(stretch),
                            stretch_probs=(1.0, 1.0, 1.0))
        return propose

    monkeypatch.setattr(suffix_decoding, "VerifyClock", _FixedClock)
    monkeypatch.setattr(suffix_decoding, "best_proposal", oracle(True))
    good, = engine.generate([prompt], SamplingParams(max_new_tokens=40), mode="suffix")
    assert good.token_ids == truth
    drafted = [s for s in good.record.steps if s.source == "suffix"]
    assert drafted and all(s.k == 4 and s.accepted == 4 for s in drafted)

    monkeypatch.setattr(suffix_decoding, "best_proposal", oracle(False))
    bad, = engine.generate([prompt], SamplingParams(max_new_tokens=40), mode="suffix")
    assert bad.token_ids == truth
    ks = [s.k for s in bad.record.steps if s.source == "suffix"]
    assert ks[0] == 4 and ks[-1] == 1 and all(s.accepted == 1 for s in bad.record.steps if s.source == "suffix")
