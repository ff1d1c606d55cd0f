"""The continuous-batching scheduler and the KV block accounting, pure Python (no torch, no model)."""

import pytest

from draftwheel.serving.engine.blocks import BlockManager, OutOfBlocksError
from draftwheel.serving.engine.scheduler import QueueFullError, Scheduler, SchedulerConfig, Sequence


def test_blocks_are_handed_out_and_come_back():
    blocks = BlockManager(n_blocks=4, block_size=16)
    assert blocks.blocks_for(16) == 1 and blocks.blocks_for(17) == 2
    table, cached = blocks.allocate(33)
    assert cached == 0
    assert len(table) == 3 and blocks.free_blocks == 1
    with pytest.raises(OutOfBlocksError, match="2 KV blocks needed, 1 free"):
        blocks.allocate(17)
    blocks.release(table)
    assert blocks.free_blocks == 4 and table == []
    blocks.release(table)  # a second release gives nothing back twice
    assert blocks.free_blocks == 4
    with pytest.raises(ValueError, match="kv_blocks"):
        BlockManager(0, 16)


def scheduler(n_blocks=8, block_size=4, **config):
    return Scheduler(BlockManager(n_blocks, block_size), SchedulerConfig(**config))


def seq(positions, pending=None, prefilling=True):
    return Sequence(max_positions=positions, pending=positions if pending is None else pending, prefilling=prefilling)


def test_admission_is_fifo_and_bounded_by_rows_and_blocks():
    s = scheduler(n_blocks=8, block_size=4, max_batch=2)
    a, b, c = seq(16), seq(8), seq(4)  # 4, 2 and 1 blocks
    for x in (a, b, c):
        s.add(x)
    assert s.admit() == [a, b]  # max_batch rows
    assert s.blocks.free_blocks == 2 and len(a.table) == 4 and len(b.table) == 2
    s.remove(a)
    assert s.blocks.free_blocks == 6 and a.table == []
    assert s.admit() == [c]


def test_a_request_that_does_not_fit_yet_holds_the_queue():
    s = scheduler(n_blocks=4, block_size=4, max_batch=8)
    big, small = seq(12), seq(4)  # 3 blocks, 1 block
    s.add(seq(8))
    assert len(s.admit()) == 1  # 2 blocks left
    s.add(big)
    s.add(small)
    assert s.admit() == []  # small would fit, but big came first
    s.remove(s.running[0])
    assert s.admit() == [big, small]


def test_refusals_name_the_limit():
    s = scheduler(n_blocks=2, block_size=4, max_waiting=1)
    with pytest.raises(ValueError, match="need 3 KV blocks of 4 positions; the pool has 2"):
        s.add(seq(9))
    s.add(seq(4))
    with pytest.raises(QueueFullError, match="1 requests already waiting"):
        s.add(seq(4))
    with pytest.raises(ValueError, match="max_batch"):
        SchedulerConfig(max_batch=0)


def test_decoding_rows_first_then_prompts_in_chunks():
    s = scheduler(n_blocks=64, block_size=4, max_batch=8, max_batch_tokens=20)
    decoding = [seq(40, pending=1, prefilling=False), seq(40, pending=5, prefilling=False)]
    long_prompt, next_prompt = seq(60, pending=50), seq(20, pending=10)
    for x in (*decoding, long_prompt, next_prompt):
        s.add(x)
    s.admit()
    plan = s.plan()
    assert plan[:2] == [(decoding[0], 1), (decoding[1], 5)]
    assert plan[2:] == [(long_prompt, 14)]  # the rest of the 20-token budget
    long_prompt.pending -= 14
    decoding[0].pending = decoding[1].pending = 0  # waiting on their next call
    assert s.plan() == [(long_prompt, 20)]


def test_prompts_keep_moving_when_decoding_rows_fill_the_budget():
    s = scheduler(n_blocks=64, block_size=4, max_batch=8, max_batch_tokens=16)
    rows = [seq(40, pending=6, prefilling=False) for _ in range(3)]  # 18 tokens > the budget
    prompt = seq(40, pending=30)
    for x in (*rows, prompt):
        s.add(x)
    s.admit()
    assert s.plan()[-1] == (prompt, 4)  # a quarter of the budget


def test_the_positions_whose_logits_are_read_go_in_one_chunk():
    s = scheduler(n_blocks=64, block_size=4, max_batch=8, max_batch_tokens=10)
    prompt = seq(40, pending=12)
    prompt.keep = 5  # e.g. a prompt with 4 drafts behind it: the last 5 logits are read
    s.add(prompt)
    s.admit()
    assert s.plan() == [(prompt, 7)]  # not 10: that would leave 2 of the 5 for the next chunk


def test_blocks_come_as_one_run_where_the_pool_has_one():
    blocks = BlockManager(n_blocks=8, block_size=4)
    (a, _), (b, _), (c, _) = blocks.allocate(8), blocks.allocate(8), blocks.allocate(8)  # [0, 1] [2, 3] [4, 5]
    blocks.release(a)
    blocks.release(c)  # free: 0 1 4 5 6 7
    assert blocks.allocate(12) == ([4, 5, 6], 0)  # the first run of 3, not 0 1 4
    assert blocks.allocate(12) == ([0, 1, 7], 0)  # no run left: the lowest free blocks
    assert b == [2, 3]


def test_forward_clock_splits_a_forward_into_row_shares():
    from draftwheel.serving.engine.adaptive import ForwardClock

    clock = ForwardClock()
    for tokens in (1, 4, 16, 32, 8):  # seconds = 0.02 + 0.001 * tokens: b / a = 0.05
        clock.observe(tokens, 0.02 + 0.001 * tokens)
    assert abs(clock.ratio - 0.05) < 1e-6
    assert clock.share(1, 1, 1, 0.021) == 0.021  # a row alone: the whole forward
    # 16 rows, one a verify of 5 tokens, 15 plain: 20 tokens in 0.04 s
    plain, verify = clock.share(1, 16, 20, 0.04), clock.share(5, 16, 20, 0.04)
    assert abs(15 * plain + verify - 0.04) < 1e-12  # the shares add up to the forward
    assert abs(plain - (0.02 / 16 + 0.001)) < 1e-9 and abs(verify - plain - 4 * 0.001) < 1e-9
    # a verify's 4 extra rows: 0.17 of a plain row alone, 1.8 plain rows' worth in this batch
    assert (verify - plain) / plain > 1.5


def test_prompts_share_their_registered_full_blocks():
    blocks = BlockManager(n_blocks=12, block_size=4, prefix_caching=True)
    system = list(range(100, 110))  # 10 tokens: 2 full blocks and 2 more
    first, cached = blocks.allocate(16, system + [1, 2])
    assert cached == 0  # nothing registered yet
    blocks.register(first, system + [1, 2])  # 12 tokens: 3 full blocks
    second, cached = blocks.allocate(16, system + [3, 4, 5])
    assert second[:2] == first[:2] and cached == 8  # [100..103] [104..107]; block 3 differs (108 109 3 4)
    assert blocks.free_blocks == 12 - 4 - 2
    assert blocks.hit_tokens == 8 and blocks.queried_tokens == 12 + 13
    # the prompt's last token is always computed by the request itself: 8 tokens share 1 block, not 2
    assert blocks.allocate(12, system[:8])[1] == 4
    other, cached = blocks.allocate(8, [7] * 8)
    assert cached == 0 and not set(other) & set(first)


def test_released_prefixes_stay_cached_until_the_pool_needs_their_blocks():
    blocks = BlockManager(n_blocks=6, block_size=4, prefix_caching=True)
    prompt = list(range(13))  # 3 full blocks
    table, _ = blocks.allocate(16, prompt)
    blocks.register(table, prompt)
    held = list(table)
    blocks.release(table)
    assert blocks.free_blocks == 6
    again, cached = blocks.allocate(16, prompt)
    assert again[:3] == held[:3] and cached == 12  # found again after its owner left
    blocks.release(again)
    partial, _ = blocks.allocate(16, [1] * 16)  # 4 blocks: the 3 plain free ones, then the oldest cached one
    assert held[2] in partial  # the prompt's end went first
    blocks.release(partial)
    assert blocks.allocate(16, prompt)[1] == 8  # its first two blocks are still found


def test_a_shared_block_in_use_costs_a_new_request_nothing():
    blocks = BlockManager(n_blocks=4, block_size=4, prefix_caching=True)
    prompt = list(range(9))  # 2 full blocks
    first, _ = blocks.allocate(12, prompt)
    blocks.register(first, prompt)
    assert blocks.free_blocks == 1
    assert blocks.can_allocate(12, prompt)  # 3 blocks, 2 of them shared and held: 1 new
    assert not blocks.can_allocate(12, [5] * 9)
    second, cached = blocks.allocate(12, prompt)
    assert cached == 8 and blocks.free_blocks == 0
    blocks.release(first)
    assert blocks.free_blocks == 1  # the shared blocks are still held by the second request


def test_spec_governor_keeps_the_regime_that_emits_most():
    from draftwheel.serving.engine.adaptive import ALL, INDEX, PLAIN, REGIMES, SpecGovernor

    governor = SpecGovernor(explore=0.1, explore_clear=0.02, warmup=2, seed=1, regimes=REGIMES)
    assert governor.regime(1) == ALL  # one row alone is never governed
    emits = {ALL: 40, INDEX: 70, PLAIN: 60}  # the draft model loses here, the index gains
    tried = []
    for _ in range(6):  # warm-up: each regime measured twice, drafting first
        regime = governor.regime(12)
        tried.append(regime)
        governor.observe(12, regime, tokens=emits[regime], seconds=1.0)
    assert tried == [ALL, ALL, INDEX, INDEX, PLAIN, PLAIN]
    assert governor.best(12) == INDEX and governor.clear(12)  # every span alike: told apart at once
    choices = [governor.regime(12) for _ in range(3000)]
    assert 0.96 < choices.count(INDEX) / 3000 < 0.995  # the others tried one span in fifty, both of them
    assert choices.count(ALL) > 10 and choices.count(PLAIN) > 10
    assert governor.rate(16, PLAIN) == 60.0 and governor.rate(3, PLAIN) is None  # 9-16 rows: one bucket
    with pytest.raises(ValueError, match="regime"):
        governor.observe(12, "some", tokens=1, seconds=1.0)


def test_spec_governor_explores_more_while_the_regimes_are_not_told_apart():
    from draftwheel.serving.engine.adaptive import ALL, INDEX, PLAIN, REGIMES, SpecGovernor

    governor = SpecGovernor(explore=0.1, explore_clear=0.02, warmup=2, seed=1, regimes=REGIMES)
    for tokens in (30, 70, 40, 80):  # drafting: 55 a second on average, spans spread widely
        governor.observe(12, ALL, tokens=tokens, seconds=1.0)
        governor.observe(12, INDEX, tokens=tokens - 5, seconds=1.0)
    for tokens in (50, 70, 45, 75):  # plain: 60
        governor.observe(12, PLAIN, tokens=tokens, seconds=1.0)
    assert governor.best(12) == PLAIN and not governor.clear(12)
    choices = [governor.regime(12) for _ in range(2000)]
    assert 0.87 < choices.count(PLAIN) / 2000 < 0.93  # still one span in ten elsewhere
    for _ in range(40):  # more spans of the same regimes, now tightly spread: the evidence becomes clear
        for regime, tokens in ((ALL, 40), (INDEX, 45), (PLAIN, 60)):
            governor.observe(12, regime, tokens=tokens, seconds=1.0)
    assert governor.clear(12) and governor.standard_error(12, ALL) < 5.0
    choices = [governor.regime(12) for _ in range(2000)]
    assert 0.96 < choices.count(PLAIN) / 2000 < 0.995
    assert governor.standard_error(3, ALL) == float("inf")  # a bucket never measured


def test_spec_governor_with_one_exploration_share_explores_alike_however_clear():
    from draftwheel.serving.engine.adaptive import ALL, INDEX, PLAIN, REGIMES, SpecGovernor

    governor = SpecGovernor(explore=0.1, explore_clear=0.1, warmup=2, seed=3, regimes=REGIMES)
    for _ in range(4):
        for regime, tokens in ((ALL, 40), (INDEX, 45), (PLAIN, 60)):
            governor.observe(12, regime, tokens=tokens, seconds=1.0)
    assert governor.clear(12)
    choices = [governor.regime(12) for _ in range(2000)]
    assert 0.87 < choices.count(PLAIN) / 2000 < 0.93
    with pytest.raises(ValueError, match="explore_clear"):
        SpecGovernor(explore=0.05, explore_clear=0.1)
    from draftwheel.serving.server.serve_config import ServeConfig

    with pytest.raises(ValueError, match="spec_explore_clear"):  # the config names the field
        ServeConfig(spec_explore=0.05, spec_explore_clear=0.1)
    assert ServeConfig(scheduler="batched", spec_explore_clear=0.05).batch_config().spec_explore_clear == 0.05


def test_spec_governor_weighs_two_regimes_by_default():
    from draftwheel.serving.engine.adaptive import ALL, INDEX, PLAIN, SpecGovernor

    governor = SpecGovernor(seed=2)
    assert governor.regimes == (ALL, PLAIN)
    for _ in range(4):
        governor.observe(12, ALL, tokens=40, seconds=1.0)
        governor.observe(12, PLAIN, tokens=60, seconds=1.0)
    assert INDEX not in {governor.regime(12) for _ in range(1000)}
    with pytest.raises(ValueError, match="regime"):
        governor.observe(12, INDEX, tokens=1, seconds=1.0)
    with pytest.raises(ValueError, match="regimes"):
        SpecGovernor(regimes=(ALL, INDEX))  # plain must stay among them: never slower than batched plain
    from draftwheel.serving.server.serve_config import ServeConfig

    assert ServeConfig(spec_index_regime=True).batch_config().spec_index_regime
