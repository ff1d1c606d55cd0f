"""`draftwheel export`: a stored eagle3 draft as a speculators EAGLE-3 directory that vLLM serves anywhere.

A stored draft is already in the speculators format (draftwheel.serving.engine.eagle); the export makes it portable:

- `speculators_config.verifier.name_or_path` is the target's Hugging Face id (`ORG/NAME`), never a
  local path: `vllm serve EXPORT` loads the verifier by that name on whatever machine it runs.
- `embed_tokens.weight` is the target's input embedding table, copied. Our drafts share the target's
  table and never store it; vLLM would share it too, but the speculators library's `Eagle3DraftModel`
  keeps a table of its own and, without the tensor, runs on an uninitialised one without a word.
- every file is world-readable (0644, the directory 0755): the registry's copies are 0600.
- the directory appears whole or not at all: it is written to a temporary sibling and renamed (an
  exception removes the sibling; only a killed process leaves it, hidden). A non-empty `out` is refused
  unless `force`, and then replaced as a whole.

This module reads the target's embedding tensor from its safetensors files (it loads no model), and
never fetches anything; it does not train, serve or register.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from draftwheel.hashing import weights_sha256
from draftwheel.registry_names import TARGET_SHA_TAG, not_trained_for, trained_for
from draftwheel.serving.engine.eagle import CONFIG_FILE, WEIGHTS_FILE, Eagle3Config, Eagle3FormatError, check_export
from draftwheel.serving.engine.reference import hub_id, is_hub_id

EMBED_KEY = "embed_tokens.weight"
FILE_MODE, DIR_MODE = 0o644, 0o755


class ExportExistsError(ValueError):
    """The output directory holds files and replacing them was not asked for."""


def resolve_verifier(recorded: str, override: str = "") -> str:
    """The verifier id the export records: `override` (--verifier), else the draft's own when it is a hub
    id, else the id of the target dir it names (the reference dir's, a hub cache snapshot's); a local
    path with no known id is refused, naming the flag that fixes it."""
    if override:
        if not is_hub_id(override):
            raise ValueError(f"--verifier {override!r}: expected the target's Hugging Face id (ORG/NAME), "
                             "not a local path: vLLM loads the verifier by this name wherever it runs")
        return override
    if is_hub_id(recorded):
        return recorded
    known = hub_id(recorded)
    if known:
        return known
    what = f"names {recorded!r}, a local path" if recorded else "names no target"
    raise ValueError(f"the draft's verifier {what}, which vLLM cannot load on another machine; "
                     "pass --verifier ORG/NAME, the target's Hugging Face id")


def target_embeddings(target_dir: str | Path, config: Eagle3Config) -> torch.Tensor:
    """The target's input embedding table [vocab_size, hidden] from its safetensors files, after checking
    the target is the one the draft was trained for (when the draft records one)."""
    target_dir = Path(target_dir)
    if not target_dir.is_dir():
        raise FileNotFoundError(f"target {target_dir}: not a model directory (--target names the target)")
    if config.target_sha256:
        sha = weights_sha256(target_dir)
        tags = {TARGET_SHA_TAG: config.target_sha256}
        if not trained_for(tags, sha):
            raise ValueError(f"--target {target_dir}: the draft was {not_trained_for(tags, sha, 'this target')}")
    found = []
    for shard in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            found += [(key, shard) for key in handle.keys() if key.split(".")[-2:] == EMBED_KEY.split(".")]
    if len(found) != 1:
        names = [key for key, _ in found] or "none"
        raise FileNotFoundError(f"--target {target_dir}: expected one *{EMBED_KEY} tensor, found {names}")
    key, shard = found[0]
    with safe_open(str(shard), framework="pt") as handle:
        table = handle.get_tensor(key)
    if tuple(table.shape) != (config.vocab_size, config.hidden_size):
        raise ValueError(f"--target {target_dir}: {key} has shape {tuple(table.shape)}, the draft needs "
                         f"({config.vocab_size}, {config.hidden_size})")
    return table


def check_portable(path: str | Path) -> Eagle3Config:
    """`check_export` plus what another machine needs: a hub-id verifier, the embedding table, readable files."""
    path = Path(path)
    config = check_export(path)
    if not is_hub_id(config.verifier_name):
        raise Eagle3FormatError(f"speculators_config.verifier.name_or_path: {config.verifier_name!r} is not a "
                                "Hugging Face id (ORG/NAME)")
    with safe_open(str(path / WEIGHTS_FILE), framework="pt") as handle:
        if EMBED_KEY not in handle.keys():
            raise Eagle3FormatError(f"{path / WEIGHTS_FILE}: missing tensor {EMBED_KEY!r}")
        shape = tuple(handle.get_slice(EMBED_KEY).get_shape())
    if shape != (config.vocab_size, config.hidden_size):
        raise Eagle3FormatError(f"{EMBED_KEY}: shape {shape}, expected ({config.vocab_size}, {config.hidden_size})")
    unreadable = [p.name for p in path.iterdir() if p.stat().st_mode & 0o444 != 0o444]
    if unreadable:
        raise Eagle3FormatError(f"{path}: not world-readable: {sorted(unreadable)}")
    return config


def _refuse_existing(out: Path, force: bool) -> None:
    if not out.exists() or force or (out.is_dir() and not any(out.iterdir())):
        return
    what = f"holds {len(list(out.iterdir()))} entries" if out.is_dir() else "is a file"
    raise ExportExistsError(f"--out {out} {what}; pass --force to replace it")


def _write(src: Path, tmp: Path, verifier: str, embeddings: torch.Tensor) -> None:
    """The export's files into `tmp`: the config with the verifier, the weights with the embedding table,
    the tokenizer files; our own `draftwheel_*` files stay behind."""
    data = json.loads((src / CONFIG_FILE).read_text())
    data["speculators_config"]["verifier"]["name_or_path"] = verifier
    (tmp / CONFIG_FILE).write_text(json.dumps(data, indent=2))
    state = load_file(str(src / WEIGHTS_FILE))
    state[EMBED_KEY] = embeddings.to(state["fc.weight"].dtype).contiguous()
    save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    for item in src.iterdir():
        if item.is_file() and item.name not in (CONFIG_FILE, WEIGHTS_FILE) and not item.name.startswith("draftwheel_"):
            shutil.copyfile(item, tmp / item.name)
    for item in tmp.iterdir():
        os.chmod(item, FILE_MODE)
    os.chmod(tmp, DIR_MODE)


def _replace(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`; an existing `out` (empty, or forced) is moved aside first and removed after."""
    old = None
    if (out.is_dir() and any(out.iterdir())) or out.is_file():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.rename(out, old / out.name)
    try:
        os.replace(tmp, out)  # onto an empty directory, or none
    except OSError:
        if old is not None:
            os.rename(old / out.name, out)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def export_speculators(src: str | Path, out: str | Path, target: str | Path, verifier: str = "",
                       force: bool = False) -> Path:
    """Write the eagle3 draft stored at `src` to `out` as a portable speculators directory (see the module
    docstring); `target` is the target's local dir (the embedding table's source), `verifier` overrides
    the recorded target id. Nothing is written when a check fails."""
    src, out = Path(src), Path(out)
    config = check_export(src)
    name = resolve_verifier(config.verifier_name, verifier)
    embeddings = target_embeddings(target, config)
    _refuse_existing(out, force)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    except OSError as exc:
        raise OSError(f"--out {out}: cannot write in {out.parent}: {exc.strerror or exc}") from exc
    try:
        _write(src, tmp, name, embeddings)
        check_portable(tmp)
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
