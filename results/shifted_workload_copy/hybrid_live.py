"""The live code requests replayed in mode hybrid (`draftwheel serve`'s default: draft + suffix tier), in their
served order, once per draft: the suffix index starts from every logged request before them (what a server
would hold) and learns from each one as serving does. Prints each draft's mean accepted length.
usage: hybrid_live.py STATE SERVED_VERSION DRAFT..."""
import sys, os
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
print(f"{len(live)} live code requests; the index starts from {len(earlier)} earlier ones", flush=True)
from serving.sink import JsonlSink
sink = JsonlSink(os.environ["OUT_LOGS"]) if os.environ.get("OUT_LOGS") else None
for spec in drafts:
    draft = load_model(spec, dtype=torch.bfloat16)
    index = SuffixIndex.from_records(earlier, target_key(target.model_id))
    engine = Engine(target, draft, suffix_index=index, dtype=torch.bfloat16, min_path_prob=0.25)  # serve.yaml
    accepted = steps = same = 0
    by_source = {}
    for r in live:
        params = SamplingParams(max_new_tokens=len(r.output_token_ids), k=4)
        done = engine.generate([r.prompt], params, slice="code", chat=False, mode="hybrid")[0]  # the logged prompt is already templated
        assert list(done.prompt_token_ids) == list(r.prompt_token_ids)
        accepted, steps = accepted + done.record.accepted_tokens, steps + done.record.verify_steps
        same += list(done.token_ids) == list(r.output_token_ids)
        if sink is not None:
            sink.write(done.record)
        for st in done.record.steps:
            src = st.source or ("plain" if st.k == 0 else "?")
            t = by_source.setdefault(src, [0, 0, 0])
            t[0] += 1; t[1] += st.accepted; t[2] += st.k
    print(f"{spec}: hybrid MAL {mean_accepted_length(accepted, steps):.3f} over {len(live)} "
          f"(outputs identical to the logged ones: {same}/{len(live)})", flush=True)
    for src, (n, acc, drafted) in sorted(by_source.items()):
        print(f"   {src}: {n} steps, {acc / n:.2f} accepted per step, {drafted / n:.1f} drafted per step", flush=True)
if sink is not None:
    sink.close()
    from flows.served import VersionTally, delivered_gain
    tally = VersionTally("draftwheel-draft", ["1", "2"])
    list(tally.watch(read_records(os.environ["OUT_LOGS"])))
    gain = delivered_gain(tally, "2", "1")
    for key in ("slices", "as_served"):
        e = gain[key]["code"]
        print(f"{key}: v1 {e['previous']['mean_accepted_length']:.3f} (n={e['previous']['requests']}) -> v2 "
              f"{e['champion']['mean_accepted_length']:.3f} (n={e['champion']['requests']}): {e['mal_change']:+.1%} "
              f"[{e['mal_change_ci'][0]:+.1%}, {e['mal_change_ci'][1]:+.1%}]", flush=True)
