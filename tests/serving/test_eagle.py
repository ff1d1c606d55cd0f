"""The eagle3 draft kind in the Engine, on a tiny random target (seconds on CPU).

The draft is fitted in the fixture for a few hundred steps on the target's own greedy continuations
(training-time test, draftwheel.training.eagle_ttt), so acceptance is partial: both the all-accepted and the
rollback paths run. Greedy output must equal the target's alone; sampled output must follow the
target's law (chi-square, shared helper with the draft-model test); the speculators directory must
round-trip with identical outputs and carry every field the format requires. Mode `hybrid` with the
suffix index (proposals from test_suffix_engine's corrupted continuations) must stay lossless too.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftwheel.serving.engine.eagle import Eagle3Config, Eagle3Draft, Eagle3FormatError, load_eagle3, save_eagle3, vocab_from_counts
from draftwheel.serving.engine.adaptive import PRIOR_ROW_SLOPE, LoadPaces, StepPace, VerifyClock
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.models import IncompatibleModelsError, from_objects
from draftwheel.serving.loading import load_model
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.suffix import SuffixIndex, target_key
from draftwheel.serving.testing import build_tokenizer, save_model, tiny_llama
from tests.serving.test_engine import PROMPTS, check_two_token_law, hf_greedy, noisy_copy
from tests.serving.test_suffix_engine import corrupted, two_token_sequences  # noqa: F401 - a fixture
from draftwheel.training.eagle_ttt import teacher_log_probs, ttt_loss, unroll


def fit_draft(target, tokenizer, steps=300, seed=0) -> Eagle3Draft:
    """A draft fitted to the target's greedy continuations of PROMPTS (plus sampled ones for variety)."""
    torch.manual_seed(seed)
    sequences = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        sequences.append(ids + hf_greedy(target, ids, 40))
    width = min(len(s) for s in sequences)
    ids = torch.tensor([s[:width] for s in sequences])
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
    config = Eagle3Config.for_target(target.config, draft_vocab_size=target.config.vocab_size // 2)
    counts = torch.bincount(ids.flatten(), minlength=target.config.vocab_size)
    d2t, t2d = vocab_from_counts(counts, config.draft_vocab_size)
    draft = Eagle3Draft(config, d2t=d2t, t2d=t2d).attach_target(target)
    aux = torch.cat([out.hidden_states[i] for i in config.aux_layer_ids], -1)
    with torch.no_grad():
        teacher = teacher_log_probs(out.hidden_states[-1], target.lm_head.weight, draft)
    mask = torch.ones(ids.shape, dtype=torch.bool)
    optimizer = torch.optim.Adam(draft.parameters(), lr=3e-3)
    for _ in range(steps):
        loss, _ = ttt_loss(unroll(draft, ids, aux, 3), teacher, mask, decay=0.8)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return draft.eval()


@pytest.fixture(scope="module")
def pair():
    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    return tokenizer, target, fit_draft(target, tokenizer)


@pytest.fixture(scope="module")
def engine(pair):
    tokenizer, target, draft = pair
    return Engine(from_objects(target, tokenizer, "target"), from_objects(draft, tokenizer, "eagle"))


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_identical_to_target_alone(engine, pair, k):
    _, target, _ = pair
    completions = engine.generate(PROMPTS + ["Once upon a time"], SamplingParams(max_new_tokens=40, k=k))
    for completion in completions:
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 40), completion.prompt
    steps = [s for c in completions for s in c.record.steps]
    assert any(s.accepted < s.k for s in steps), "no rejection: the crop path is untested"
    assert any(s.accepted == s.k > 0 for s in steps), "no full acceptance: the bonus path is untested"


def test_adaptive_k_greedy_identical(engine, pair):
    _, target, _ = pair
    params = SamplingParams(max_new_tokens=30, k=5, adaptive_k=True)
    for completion in engine.generate(PROMPTS[:3], params):
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 30)


def test_chain_cut_by_draft_confidence_stays_lossless(pair):
    """min_path_prob cuts a chain early on the draft's own probabilities: greedy output is unchanged, the
    sampled law too, and chains are really cut (some steps draft fewer than k tokens)."""
    tokenizer, target, draft = pair
    cut = Engine(from_objects(target, tokenizer, "target"), from_objects(draft, tokenizer, "eagle"),
                 min_path_prob=0.1)
    completions = cut.generate(PROMPTS, SamplingParams(max_new_tokens=40, k=5))
    for completion in completions:
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 40), completion.prompt
    lengths = {s.k for c in completions for s in c.record.steps if s.k}
    assert min(lengths) < 5 and max(lengths) > 1, lengths
    control = (tokenizer, target, noisy_copy(target, 1.0))
    check_two_token_law(cut, control, SamplingParams(max_new_tokens=3, temperature=1.0, top_k=3, k=3), n=600)
    with pytest.raises(ValueError, match="min_path_prob"):
        Engine(from_objects(target, tokenizer, "target"), min_path_prob=1.0)


def test_a_chain_stops_at_a_drafted_eos(pair):
    """Past a drafted EOS nothing is ever emitted: the chain ends there (the EOS itself is verified)."""
    from draftwheel.serving.engine.eagle import DraftCall, DraftKV
    from draftwheel.serving.engine.eagle_decoding import EagleDrafter, _run_ahead, run_serial
    from draftwheel.serving.engine.proposal import greedy_request

    tokenizer, target, draft = pair
    ids = torch.tensor(tokenizer(PROMPTS[0])["input_ids"])
    _, features = CachedLM(target).forward(ids[:-1], keep=1, aux=draft.c.aux_layer_ids)  # [P-1, 3H]

    def chain(eos_ids: set[int]) -> list[int]:
        kv = DraftKV()
        (hidden, logits), = draft.extend_many([DraftCall(ids[1:], features, kv, project=True)])
        req = greedy_request(ids, 5, eos_ids)
        return run_serial(_run_ahead(EagleDrafter(draft), hidden, logits, 5, kv, req))[0].tolist()

    free = chain(set())
    assert len(free) == 5
    assert chain({free[1]}) == free[:2]


def test_the_drafts_confidence_temperature_moves_where_chains_stop_and_nothing_else(pair):
    """The chain cut reads softmax(logits / confidence_temperature): a draft told it is overconfident
    (a high temperature) stops its chains sooner, drafting fewer tokens; greedy output is unchanged."""
    import copy
    import dataclasses

    tokenizer, target, draft = pair
    cooled = copy.deepcopy(draft)
    cooled.c = dataclasses.replace(draft.c, confidence_temperature=4.0)
    params = SamplingParams(max_new_tokens=40, k=5)
    runs = [Engine(from_objects(target, tokenizer, "target"), from_objects(d, tokenizer, "eagle"),
                   min_path_prob=0.1).generate(PROMPTS, params) for d in (draft, cooled)]
    for plain_t, hot_t in zip(*runs):
        assert plain_t.token_ids == hot_t.token_ids == hf_greedy(target, plain_t.prompt_token_ids, 40)
    mean_k = [sum(s.k for c in run for s in c.record.steps) / sum(1 for c in run for s in c.record.steps if s.k)
              for run in runs]
    assert mean_k[1] < mean_k[0], mean_k


def test_sampled_tokens_follow_target_distribution(engine, pair):
    """Lossless with q zero outside the draft vocabulary. The control law is a noisy copy of the
    target (the eagle draft has no standalone law to compare)."""
    tokenizer, target, _ = pair
    control = (tokenizer, target, noisy_copy(target, 1.0))
    completions = check_two_token_law(engine, control, SamplingParams(max_new_tokens=3, temperature=1.0, top_k=3, k=2))
    assert any(s.accepted > 0 for c in completions for s in c.record.steps), "no draft token ever accepted"


def hybrid_engine(pair, sequences, **kwargs):
    tokenizer, target, draft = pair
    loaded = from_objects(target, tokenizer, "target")
    index = SuffixIndex(target_key(loaded.model_id))
    for tokens in sequences:
        index.add(tokens)
    return Engine(loaded, from_objects(draft, tokenizer, "eagle"), suffix_index=index, **kwargs)


@pytest.mark.parametrize("mode", ["draft", "hybrid"])
def test_the_served_residual_starts_after_the_prompts_token(pair, monkeypatch, mode):
    from tests.serving.test_suffix_engine import assert_residual_aligned, emitted_tokens

    tokenizer, target, _ = pair
    known = [ids + corrupted(hf_greedy(target, ids, 60)) for ids in (tokenizer(p)["input_ids"] for p in PROMPTS)]
    emitted = emitted_tokens(monkeypatch)
    completions = hybrid_engine(pair, known).generate(PROMPTS, SamplingParams(max_new_tokens=30, k=3), mode=mode)
    assert any(step.accepted for c in completions for step in c.record.steps)
    assert_residual_aligned(completions, emitted)


@pytest.mark.parametrize("min_path_prob", [0.0, 0.1])
def test_hybrid_with_suffix_index_greedy_identical(pair, min_path_prob):
    """The suffix index drafts where it knows the continuation, the eagle draft elsewhere; the eagle
    draft catches up on the features of suffix-drafted positions without re-encoding."""
    tokenizer, target, _ = pair
    known = [ids + corrupted(hf_greedy(target, ids, 60)) for ids in (tokenizer(p)["input_ids"] for p in PROMPTS)]
    engine = hybrid_engine(pair, known, min_path_prob=min_path_prob)
    completions = engine.generate(PROMPTS + ["Once upon a time"], SamplingParams(max_new_tokens=40, k=3),
                                  mode="hybrid")
    for completion in completions:
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 40), completion.prompt
        assert completion.record.mode == "hybrid" and completion.record.draft_id.name == "eagle"
    steps = [s for c in completions for s in c.record.steps]
    assert {s.source for s in steps if s.k} == {"suffix", "eagle3"}
    suffix_steps = [s for s in steps if s.source == "suffix"]
    assert any(s.accepted < s.k for s in suffix_steps) and any(s.accepted == s.k for s in suffix_steps)
    assert all(s.k <= 3 for s in steps if s.source == "eagle3")
    assert max(s.k for s in suffix_steps) > 3  # the index proposes past the draft's k
    # a suffix step followed by an eagle3 step: the draft consumed the queued slots of both
    assert any(a.source == "suffix" and b.source == "eagle3" for c in completions
               for a, b in zip(c.record.steps, c.record.steps[1:]))


def test_hybrid_verifies_the_index_beside_the_chain_losslessly(pair, monkeypatch):
    """Greedy draft steps verify the index's proposal as a second branch of one tree: output stays the
    target's, some steps are won by the branch (kept in the cache off the chain), and such a step is
    recorded as the index's."""
    tokenizer, target, _ = pair
    known = [ids + corrupted(hf_greedy(target, ids, 60), every=3) for ids in (tokenizer(p)["input_ids"] for p in PROMPTS)]
    kept_off_chain = []
    keep_path = CachedLM.keep_path

    def spy(self, nodes, path):
        if path != list(range(len(path))):
            kept_off_chain.append(path)
        return keep_path(self, nodes, path)

    monkeypatch.setattr(CachedLM, "keep_path", spy)
    # every step drafts, and the index only ever proposes a branch
    monkeypatch.setattr(StepPace, "draft_pays", lambda self: True)
    monkeypatch.setattr("draftwheel.serving.engine.eagle_decoding.suffix_drafts", lambda *a, **k: False)
    engine = hybrid_engine(pair, known, index_branch=True)
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=40, k=3), mode="hybrid")
    for completion in completions:
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 40), completion.prompt
    assert kept_off_chain, "no step was won by the index's branch: the tree path is untested"
    steps = [s for c in completions for s in c.record.steps]
    won = [s for s in steps if s.source == "suffix"]  # the branch's wins, as recorded: the chain beside them
    assert any(s.accepted > 0 for s in won)
    assert all(s.beside.source == "eagle3" and s.beside.accepted < s.accepted for s in won)
    off = hybrid_engine(pair, known, index_branch=False)
    assert [c.token_ids for c in off.generate(PROMPTS, SamplingParams(max_new_tokens=40, k=3), mode="hybrid")] \
        == [c.token_ids for c in completions]
    assert not any(s.source == "suffix" for c in off.generate(PROMPTS[:2], SamplingParams(max_new_tokens=40, k=3),
                                                             mode="hybrid") for s in c.record.steps)


@pytest.mark.parametrize("loses", [True, False])
def test_a_draft_that_clearly_loses_explores_only_where_the_index_has_nothing_better(pair, monkeypatch, loses):
    """Every draw says draft, and a draft that competes with the index always wins. A draft that clearly
    loses does not compete: its exploring steps leave each index proposal that beats a plain step to
    the index, so with the whole greedy continuation known it never drafts. One that does not clearly
    lose takes those steps. Output is the target's either way."""
    tokenizer, target, _ = pair
    known = [ids + hf_greedy(target, ids, 40) for ids in (tokenizer(p)["input_ids"] for p in PROMPTS)]
    monkeypatch.setattr(StepPace, "draft_pays", lambda self: True)
    monkeypatch.setattr(StepPace, "clearly_loses", property(lambda self: loses))
    monkeypatch.setattr("draftwheel.serving.engine.adaptive.index_beats_draft", lambda *a, **k: False)
    # the rule, not this machine's timings: a verify row costs what the prior says
    monkeypatch.setattr(VerifyClock, "cost", lambda self, rows: 1.0 + PRIOR_ROW_SLOPE * (rows - 1))
    engine = hybrid_engine(pair, known)
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=30, k=3), mode="hybrid")
    for completion in completions:
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 30), completion.prompt
    sources = [s.source for c in completions for s in c.record.steps[:-1]]  # the last token: a plain step
    assert ("eagle3" in sources) is not loses and ("suffix" in sources) is loses, sources


def test_step_pace_clearly_loses_only_past_its_warm_up_and_beyond_its_error():
    """Units as in test_engine's pace tests: 1.32 a step. One token a step is 0.76 a unit: clearly below a
    plain step once measured; three (2.3) or a noisy 1-2 around break-even are not."""
    losing, paying, marginal = StepPace(warmup=3), StepPace(warmup=3), StepPace(warmup=3)
    for step in range(3):
        assert not losing.clearly_loses  # warming up: nothing measured yet
        losing.drafted(1, 5, 0.1, 1.0)
        paying.drafted(3, 5, 0.1, 1.0)
        marginal.drafted(1 + step % 2, 5, 0.1, 1.0)
    assert losing.clearly_loses and not paying.clearly_loses and not marginal.clearly_loses


@pytest.mark.parametrize("mode", ["draft", "hybrid"])
def test_greedy_steps_verify_the_drafts_runner_up_beside_its_chain_losslessly(pair, mode, monkeypatch):
    """Where the chain's first token is wrong, the target's token is often the draft's second choice:
    verified beside the chain as a one-token branch, some steps are won by it (recorded as the draft's,
    the chain beside it), and greedy output stays the target's. The tiny draft's runner-up is rarely
    right, so here the two swap: the chain starts from the draft's second choice and the branch is its
    first, verified at any probability."""
    import draftwheel.serving.engine.eagle_decoding as loop

    tokenizer, target, _ = pair
    monkeypatch.setattr(loop, "greedy", lambda logits: logits.topk(2, dim=-1).indices[..., 1])
    monkeypatch.setattr(loop, "draft_runner_up", lambda draft, logits: (draft.draft_to_target[logits.argmax()], 1.0))
    engine = hybrid_engine(pair, [])  # an empty index: the draft's own branches only
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=40, k=3), mode=mode)
    for completion in completions:
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 40), completion.prompt
    steps = [s for c in completions for s in c.record.steps]
    won = [s for s in steps if s.beside is not None and s.k == 1 and s.accepted == 1]
    assert won and all(s.source == "eagle3" and s.beside.source == "eagle3" and s.beside.accepted == 0
                       for s in won)
    off = hybrid_engine(pair, [], runner_up=False).generate(PROMPTS, SamplingParams(max_new_tokens=40, k=3), mode=mode)
    assert [c.token_ids for c in off] == [c.token_ids for c in completions]
    assert not any(s.beside is not None for c in off for s in c.record.steps)


def test_a_runner_up_that_never_comes_true_stops_being_verified(pair, monkeypatch):
    """The runner-up's probability is calibrated by how often it came true, carried across a slice's
    requests: one that is always wrong (here the draft's least likely token, at 0.2) soon stops paying
    for its verify row."""
    import draftwheel.serving.engine.eagle_decoding as loop

    monkeypatch.setattr(loop, "draft_runner_up", lambda draft, logits: (draft.draft_to_target[logits.argmin()], 0.2))
    from draftwheel.serving.engine.suffix import ReadOnlyIndex

    monkeypatch.setattr(StepPace, "draft_pays", lambda self: True)  # the tiny draft drafts every step
    # The row's price is measured on the wall clock; fixed here so only the calibration decides.
    real_rule = loop.runner_up_pays
    monkeypatch.setattr(loop, "runner_up_pays", lambda odds, prob, row_slope, rate=1.0: real_rule(odds, prob, 0.05, 1.0))
    engine = hybrid_engine(pair, [])
    engine.suffix_index = ReadOnlyIndex(engine.suffix_index)  # the second pass must not copy the first
    params = SamplingParams(max_new_tokens=40, k=3)

    def branched() -> tuple[int, int]:
        """(draft steps, those with a branch)"""
        steps = [s for c in engine.generate(PROMPTS, params, mode="hybrid", slice="chat") for s in c.record.steps
                 if s.source == "eagle3"]
        return len(steps), sum(s.beside is not None for s in steps)

    (drafted, first), (drafted_again, second) = branched(), branched()
    assert 0 < first and drafted_again >= drafted // 2 and second < first / 4, \
        (drafted, first, drafted_again, second)


class EveryThirdStepDrafts:
    """A stand-in for draftwheel.serving.engine.adaptive.StepPace with a fixed pattern: draft, skip, skip, draft, ..."""

    def __init__(self):
        from draftwheel.serving.engine.adaptive import VerifyClock

        self.calls = 0
        self.clock = VerifyClock()
        self.ratio = 1.0
        self.clearly_loses = False

    def draft_pays(self) -> bool:
        self.calls += 1
        return self.calls % 3 == 1

    def drafted(self, tokens: int, rows: int, draft_s: float, verify_s: float) -> None:
        pass


def test_hybrid_takes_plain_steps_when_drafting_does_not_pay(pair, monkeypatch):
    """Steps the pace rules out are plain target steps when the index has nothing: their positions queue
    for the draft like suffix-drafted ones, and greedy output stays the target's."""
    tokenizer, target, _ = pair
    engine = hybrid_engine(pair, [])  # an empty index: the request's own part only
    monkeypatch.setattr(engine.paces, "resume", lambda key: LoadPaces(EveryThirdStepDrafts))
    completions = engine.generate(PROMPTS, SamplingParams(max_new_tokens=30, k=3), mode="hybrid")
    for completion in completions:
        assert completion.token_ids == hf_greedy(target, completion.prompt_token_ids, 30), completion.prompt
    steps = [s for c in completions for s in c.record.steps[:-1]]  # the last token is always a plain step
    plain = [s for s in steps if s.k == 0]
    assert plain and all(s.source is None and s.accepted == 0 for s in plain)
    # a plain step followed by an eagle3 step: the draft consumed the plain step's queued slots
    assert any(a.k == 0 and b.source == "eagle3" for c in completions
               for a, b in zip(c.record.steps, c.record.steps[1:]))
    assert any(s.k > 1 for s in steps if s.source == "eagle3")


def test_hybrid_sampled_tokens_follow_target_distribution(pair, two_token_sequences):
    tokenizer, target, _ = pair
    engine = hybrid_engine(pair, two_token_sequences)
    control = (tokenizer, target, noisy_copy(target, 1.0))
    params = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=3, k=1)
    completions = check_two_token_law(engine, control, params, mode="hybrid")
    sources = {s.source for c in completions for s in c.record.steps if s.k}
    assert sources == {"suffix", "eagle3"}, sources


def test_speculators_round_trip_identical_outputs(engine, pair, tmp_path):
    tokenizer, target, draft = pair
    out = save_eagle3(draft, tmp_path / "eagle", tokenizer)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["architectures"] == ["Eagle3Speculator"]
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == draft.c.draft_vocab_size
    assert config["target_hidden_size"] == target.config.hidden_size
    assert config["eagle_aux_hidden_state_layer_ids"] == draft.c.aux_layer_ids
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"][0]["speculative_tokens"] >= 1 and "verifier" in spec
    weights = load_file(str(out / "model.safetensors"))
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    assert int(weights["t2d"].sum()) == config["draft_vocab_size"]
    # d2t holds offsets: target id = i + d2t[i], and exactly those ids are set in t2d.
    targets = torch.arange(config["draft_vocab_size"]) + weights["d2t"]
    assert weights["t2d"][targets].all()
    assert "embed_tokens.weight" not in weights  # shared with the target, never saved
    target_dir = save_model(target, tokenizer, tmp_path / "target")
    reloaded = Engine(load_model(target_dir), load_model(out))
    assert reloaded.draft.kind == "eagle3"
    params = SamplingParams(max_new_tokens=24, k=3)
    again = reloaded.generate(PROMPTS, params)
    first = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in again] == [c.token_ids for c in first]
    assert [s.accepted for c in again for s in c.record.steps] == [s.accepted for c in first for s in c.record.steps]


def test_bad_speculators_dirs_name_the_field(pair, tmp_path):
    tokenizer, _, draft = pair
    out = save_eagle3(draft, tmp_path / "eagle")
    config = json.loads((out / "config.json").read_text())
    del config["eagle_aux_hidden_state_layer_ids"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(Eagle3FormatError, match="eagle_aux_hidden_state_layer_ids"):
        load_eagle3(out)


def test_the_confidence_temperature_round_trips_and_a_bad_one_names_the_field(pair, tmp_path):
    import copy
    import dataclasses

    draft = copy.deepcopy(pair[2])
    assert draft.c.confidence_temperature == 1.0  # drafts saved before it existed read as uncalibrated
    draft.c = dataclasses.replace(draft.c, confidence_temperature=1.5)
    out = save_eagle3(draft, tmp_path / "eagle")
    assert load_eagle3(out).c.confidence_temperature == 1.5
    config = json.loads((out / "config.json").read_text())
    for bad in (0, -1.0, "warm", True):
        config["draftwheel"]["confidence_temperature"] = bad
        (out / "config.json").write_text(json.dumps(config))
        with pytest.raises(Eagle3FormatError, match="draftwheel.confidence_temperature"):
            load_eagle3(out)


def test_draft_for_another_target_shape_is_refused(pair):
    tokenizer, _, draft = pair
    other = tiny_llama(tokenizer, n_layers=2, hidden=32, seed=3)
    with pytest.raises(IncompatibleModelsError, match="eagle3"):
        Engine(from_objects(other, tokenizer, "other"), from_objects(draft, tokenizer, "eagle"))
