"""Speed and mean accepted length on the live code requests, in one run: plain decoding, then per draft mode
draft (what `draftwheel traffic` logs) and mode hybrid (`draftwheel serve`'s default: draft + suffix tier,
min_path_prob 0.25, an index that starts from every logged request before these and learns from each).
Per prompt the methods run back to back, so each ratio is taken over the same seconds of the machine.
usage: speed_live.py STATE SERVED_VERSION DRAFT..."""
import sys, os, time, json
sys.path.insert(0, os.environ.get("PYTHONPATH", "/work/main"))
import torch
from flows.monitor import read_records
from serving.engine import Engine
from serving.models import load_model
from serving.params import SamplingParams
from serving.suffix import SuffixIndex, target_key
from serving.acceptance import mean_accepted_length
from draftwheel import home

state, version, drafts = sys.argv[1], sys.argv[2], sys.argv[3:]
os.environ["DRAFTWHEEL_HOME"] = state
torch.set_num_threads(2)
records = list(read_records(os.path.join(state, "logs")))
live = [r for r in records if r.slice == "code" and r.draft_id is not None and r.draft_id.version == version
        and r.mode == "draft"]
live_ids = {r.request_id for r in live}
earlier = [r for r in records if r.request_id not in live_ids and r.ts < min(x.ts for x in live)]
target = load_model(home.state_dir() / "models" / "smollm2-135m-instruct", dtype=torch.bfloat16)
loaded = [load_model(spec, dtype=torch.bfloat16) for spec in drafts]
engine = Engine(target, loaded[0], dtype=torch.bfloat16, min_path_prob=0.25)
indexes = [[SuffixIndex.from_records(earlier, target_key(target.model_id)) for _ in range(2)] for _ in drafts]
totals = {}  # method -> [seconds, tokens, accepted, steps, identical]


def run(name, prompt, params, mode, ref):
    start = time.perf_counter()
    done = engine.generate([prompt], params, slice="code", chat=False, mode=mode)[0]
    t = totals.setdefault(name, [0.0, 0, 0, 0, 0])
    t[0] += time.perf_counter() - start
    t[1] += len(done.token_ids)
    t[2] += done.record.accepted_tokens
    t[3] += done.record.verify_steps
    t[4] += list(done.token_ids) == list(ref)


warm = SamplingParams(max_new_tokens=4, k=4)
engine.generate([live[0].prompt], warm, chat=False, mode="autoregressive")
for i, r in enumerate(live):
    params = SamplingParams(max_new_tokens=len(r.output_token_ids), k=4)
    engine.suffix_index = None
    run("plain", r.prompt, params, "autoregressive", r.output_token_ids)
    for spec, draft, (index, index_both) in zip(drafts, loaded, indexes):
        engine.swap_draft(draft)
        if os.environ.get("DRAFT_MODE"):
            engine.suffix_index = None
            run(f"{spec} draft", r.prompt, params, "draft", r.output_token_ids)
        engine.suffix_index, engine.verify_both = index, False  # learns from this request, as serving's does
        run(f"{spec} hybrid", r.prompt, params, "hybrid", r.output_token_ids)
        engine.suffix_index, engine.verify_both = index_both, True
        run(f"{spec} hybrid, both verified", r.prompt, params, "hybrid", r.output_token_ids)
    if (i + 1) % 20 == 0:
        print(f"{i + 1}/{len(live)}", flush=True)
plain = totals["plain"][1] / totals["plain"][0]
out = {}
for name, (s, tokens, acc, steps, same) in totals.items():
    out[name] = {"tokens_per_s": round(tokens / s, 2), "x_plain": round(tokens / s / plain, 3),
                 "mean_accepted_length": round(mean_accepted_length(acc, steps), 3) if steps else None,
                 "identical_to_logged": f"{same}/{len(live)}"}
    print(f"{name}: {out[name]}", flush=True)
json.dump(out, open(os.environ.get("OUT", "/dev/null"), "w"), indent=2)
