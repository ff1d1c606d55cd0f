"""Load a `draftwheel export` directory with the speculators library's own EAGLE-3 classes.

Runs in the isolated venv `scripts/speculators_env.sh` makes (never in draftwheel's: it imports only
speculators, transformers, torch and safetensors). It builds `Eagle3DraftModel` from
`Eagle3SpeculatorConfig.from_pretrained(EXPORT)`, loads `model.safetensors` into it and reports the
missing and unexpected keys as JSON. The keys speculators itself never saves (its training-only copies of
the verifier's norm and head, `_keys_to_ignore_on_save`) are reported apart, as `not_saved`. With
`--inputs FILE` (safetensors: `hidden_states` [1, T, 3*H] fused target features, `input_ids` [1, T]) it
also runs one draft step over those positions and writes the draft-vocabulary logits [T, Vd] to `--logits`.

With `--from-pretrained` it also loads the directory through `Eagle3DraftModel.from_pretrained`, the
library's own path, which resolves the verifier by `speculators_config.verifier.name_or_path` (its config
and weights, from the hub or the hub cache: set HF_HUB_OFFLINE=1 to stay off the network) and reports
whether the embedding table it ends up with is the checkpoint's.

    python scripts/speculators_check.py EXPORT [--inputs FILE --logits FILE] [--from-pretrained]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from safetensors.torch import load_file, save_file
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig


def load(export: str) -> tuple[Eagle3DraftModel, dict]:
    config = Eagle3SpeculatorConfig.from_pretrained(export)
    # Plain attention: flex attention (speculators' default) is meant for CUDA training.
    config.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel(config)
    state = load_file(f"{export}/model.safetensors")
    missing, unexpected = model.load_state_dict(state, strict=False)
    not_saved = set(model._keys_to_ignore_on_save)
    report = {"missing": sorted(set(missing) - not_saved), "unexpected": sorted(unexpected),
              "not_saved": sorted(set(missing) & not_saved),
              "verifier": config.speculators_config.verifier.name_or_path,
              "embed_tokens_finite": bool(torch.isfinite(model.embed_tokens.weight).all()),
              "embed_tokens_nonzero": bool(model.embed_tokens.weight.abs().sum() > 0)}
    return model.eval(), report


def from_pretrained_report(export: str, state: dict[str, torch.Tensor]) -> dict:
    """Load through the library's `from_pretrained` (it resolves the verifier by name): the target layers
    it settled on and whether its embedding table is the checkpoint's."""
    model = Eagle3DraftModel.from_pretrained(export, attn_implementation="eager")
    return {"aux_layer_ids": list(model.config.eagle_aux_hidden_state_layer_ids),
            "embed_tokens_equal": bool(torch.equal(model.embed_tokens.weight, state["embed_tokens.weight"]))}


def draft_logits(model: Eagle3DraftModel, hidden_states: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """One draft step (ttt_steps=1) over every position: the LM head's output [T, Vd]."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.detach()))
    try:
        with torch.no_grad():
            model(hidden_states=hidden_states, input_ids=input_ids,
                  document_ids=torch.zeros_like(input_ids), ttt_steps=1)
    finally:
        hook.remove()
    return seen[0][0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export")
    parser.add_argument("--inputs", help="safetensors with hidden_states [1, T, 3*H] and input_ids [1, T]")
    parser.add_argument("--logits", help="where to write the logits (with --inputs)")
    parser.add_argument("--from-pretrained", action="store_true",
                        help="also load through Eagle3DraftModel.from_pretrained (resolves the verifier by name)")
    args = parser.parse_args(argv)
    model, report = load(args.export)
    if args.from_pretrained:
        report["from_pretrained"] = from_pretrained_report(args.export, model.state_dict())
    if args.inputs:
        inputs = load_file(args.inputs)
        logits = draft_logits(model, inputs["hidden_states"].to(model.fc.weight.dtype), inputs["input_ids"])
        save_file({"logits": logits.contiguous()}, args.logits)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
