"""What would verifying the index's proposal and the draft's chain together give? A teacher-forced greedy
walk over the live code answers (serving's walk, `training.eagle_ttt.served_walk`'s conventions), with a
prompt lookup standing in for the suffix tier: at each step the lookup proposes up to L tokens (the
continuation of the latest earlier occurrence of the context's last 3..2 tokens), the draft its k-token
chain. Mean accepted length per policy: draft only, lookup only (a plain step when it has nothing), and
both verified in one forward (the longer accepted run counts).
usage: tree_sim.py STATE SERVED_VERSION DRAFT..."""
import sys, os
sys.path.insert(0, "/work/main")
import torch
from flows.monitor import read_records
from serving.models import load_model
from training.eagle_train import answer_chains
from draftwheel import home

state, version, drafts = sys.argv[1], sys.argv[2], sys.argv[3:]
os.environ["DRAFTWHEEL_HOME"] = state
torch.set_num_threads(2)
K, L = 4, 16
recs = [r for r in read_records(os.path.join(state, "logs")) if r.slice == "code" and r.draft_id is not None
        and r.draft_id.version == version and r.mode == "draft"]
target = load_model(home.state_dir() / "models" / "smollm2-135m-instruct")


def lookup(ids, end, most):
    """Continuation (up to `most` tokens) of the latest earlier occurrence of ids[end-n:end], n = 3, 2."""
    for n in (3, 2):
        gram = ids[end - n:end]
        for s in range(end - n - 1, -1, -1):
            if ids[s:s + n] == gram:
                return ids[s + n:min(s + n + most, end)]
    return []


for spec in drafts:
    draft = load_model(spec).model.attach_target(target.model).eval()
    totals = {"draft": [0, 0, 0], "lookup": [0, 0, 0], "both": [0, 0, 0]}  # emitted, steps, verified rows
    for r in recs:
        logits, ref, mask = answer_chains(target.model, draft, r.prompt_token_ids, r.output_token_ids, K)
        guesses = torch.stack([draft.draft_to_target[lg.argmax(-1)] for lg in logits])[:, 0].tolist()  # [K][n]
        ids = list(r.prompt_token_ids) + list(r.output_token_ids)
        refl = ref[0].tolist()
        row = mask[0].tolist()
        first, last = row.index(True), len(row) - 1 - row[::-1].index(True)
        for policy in totals:
            anchor = first
            while last - anchor > 0:
                cap = last - anchor - 1  # tokens that may be drafted: all left but the bonus/last
                a_draft = 0
                while a_draft < min(K, cap) and guesses[a_draft][anchor] == refl[anchor + 1 + a_draft]:
                    a_draft += 1
                # context so far: ids[:anchor + 2]; the lookup proposes the tokens at anchor + 2 ...
                proposal = lookup(ids, anchor + 2, min(L, cap))
                a_look = 0
                while a_look < len(proposal) and proposal[a_look] == refl[anchor + 1 + a_look]:
                    a_look += 1
                a = {"draft": a_draft, "lookup": a_look, "both": max(a_draft, a_look)}[policy]
                totals[policy][0] += a + 1
                totals[policy][1] += 1
                totals[policy][2] += 1 + {"draft": min(K, cap), "lookup": len(proposal),
                                          "both": min(K, cap) + len(proposal)}[policy]
                anchor += a + 1
    print(spec, " ".join(f"{p}: MAL {e / s:.3f} ({rows / s:.1f} rows per verify)" for p, (e, s, rows) in totals.items()), flush=True)
