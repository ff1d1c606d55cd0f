"""The floating-point type the engine serves in: `float32`, `bfloat16`, or `auto`.

Why bfloat16 on CPUs with bfloat16 matrix hardware: speculative decoding pays off only when verifying
k+1 tokens costs about what one decoding step costs. On the 2-core Intel Xeon this project is measured
on, a 4-token verify forward of SmolLM2-135M costs ~1.5x a 1-token step in float32 (oneDNN's float32
kernels for a few rows stream the weights at about half the single-row rate), but only ~1.1x in
bfloat16 with prepacked weights, where oneDNN uses AMX tiles for the extra rows (docs/serving-engine.md
has the measurements); a single bfloat16 step costs about what a float32 one does. On a 2-core AMD EPYC
with AVX-512 BF16 (no AMX) bfloat16 decodes ~1.3x faster than float32 (as served ~1.25x: its extra
verify rows cost a little more there, so speculation gains a little less over plain decoding).
`auto` picks bfloat16 where the CPU has AMX-BF16 or AVX-512 BF16 and oneDNN packs bfloat16, else
float32; on a CUDA GPU, bfloat16 where the GPU supports it. The device setting `auto`
(`resolve_device`) is CUDA when present, else the CPU.

Lossless is always measured against the target alone in the same dtype: greedy speculative output is
token-identical to plain decoding of the same (bfloat16 or float32) target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CHOICES = ("auto", "float32", "bfloat16")  # torch-free, for config validation and CLI choices


def check_dtype_name(name: str) -> None:
    """Raise ValueError naming the `dtype` field unless `name` is one of CHOICES (torch-free: configs call it)."""
    if name not in CHOICES:
        raise ValueError(f"dtype: {name!r} is not one of {', '.join(CHOICES)}")


DEVICES = ("auto", "cpu", "cuda")  # torch-free: `auto` is CUDA when present, else the CPU; `cuda:N` names one GPU


def check_device_name(name: str) -> None:
    """Raise ValueError naming the `device` field unless `name` is one of DEVICES or `cuda:N` (torch-free)."""
    if name not in DEVICES and not (name.startswith("cuda:") and name[len("cuda:"):].isdigit()):
        raise ValueError(f"device: {name!r} is not one of {', '.join(DEVICES)} (or cuda:N)")


def resolve_device(name: str) -> str:
    """`auto` -> `cuda` when a CUDA GPU is present, else `cpu`; any other name as given, once checked."""
    check_device_name(name)
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _cpu_has(feature: str) -> bool:
    import torch

    return bool(torch._C._cpu._get_cpu_capability().get(feature))  # what torch itself dispatches on


def cpu_has_amx_bf16() -> bool:
    """Does this CPU have AMX-BF16 tiles (an Intel Xeon of the Sapphire Rapids kind and later)?"""
    return _cpu_has("amx_bf16")


def cpu_has_bf16_matmul() -> bool:
    """Does this CPU multiply bfloat16 matrices in hardware (AMX-BF16 tiles or AVX-512 BF16 dot products)?"""
    return cpu_has_amx_bf16() or _cpu_has("avx512_bf16")


def cpu_serves_bf16() -> bool:
    """bfloat16 matrix hardware (`cpu_has_bf16_matmul`) and a oneDNN that packs bfloat16 weights."""
    from draftwheel.serving.engine.prepack import packs_bfloat16

    return cpu_has_bf16_matmul() and packs_bfloat16()


def resolve_dtype(name: str, device: str = "cpu") -> "torch.dtype":
    """`auto` -> bfloat16 on CPUs that serve it (`cpu_serves_bf16`: AMX-BF16 or AVX-512 BF16) and on CUDA
    GPUs that support it, else float32; `float32`/`bfloat16` as named. `device` as `resolve_device`
    returns it. Raises ValueError naming the choices for anything else."""
    import torch

    if name == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
        return torch.bfloat16 if device == "cpu" and cpu_serves_bf16() else torch.float32
    check_dtype_name(name)
    return getattr(torch, name)


def _switch(value: "bool | str", field: str) -> bool | None:
    """A true/false/auto setting: True or False as given (a bool or its name), None for `auto`. Raises
    ValueError naming `field` for anything else."""
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower() if isinstance(value, str) else None
    if lowered not in ("auto", "true", "false"):
        raise ValueError(f"{field}: {value!r} is not one of true, false, auto")
    return None if lowered == "auto" else lowered == "true"


def resolve_bf16(value: "bool | str", device: str = "cpu") -> bool:
    """A trainer's `bf16` switch as a bool: True/False as given, `auto` -> bfloat16 autocast only where it
    is fast: a CUDA GPU that supports it (trainer device `auto`), or a CPU that multiplies bfloat16 in
    hardware (`cpu_has_bf16_matmul`: AMX-BF16, or AVX-512 BF16, where autocast made a batched SmolLM2
    forward 1.8x and a draft training step 1.6x faster than float32 on a 2-core EPYC). On an AVX2-only
    CPU autocast made the same forward 7x slower and a whole training step of the draft 25x slower than
    float32, so `auto` keeps float32 there. Training needs no bitwise agreement between row counts nor
    packed weights, so it may use bfloat16 where serving does not (`cpu_serves_bf16`).
    Raises ValueError naming the `bf16` field for anything else."""
    given = _switch(value, "bf16")
    if given is not None:
        return given
    import torch

    if device == "auto" and torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return cpu_has_bf16_matmul()


def resolve_target_bf16(value: "bool | str", bf16: bool, device: str = "cpu") -> bool:
    """A trainer's `target_bf16` switch (the target's side of training: its continuations and features)
    as a bool: True/False as given, `auto` -> bfloat16 where the draft trains in it (`bf16`, resolved)
    and the target serves in it (`resolve_dtype`'s `auto`), so the draft learns the tokens and features
    serving will show it (a CPU whose oneDNN cannot pack bfloat16 serves float32, so its target stays
    float32 even where `bf16` trains the draft under autocast). Raises ValueError naming the
    `target_bf16` field for anything else."""
    given = _switch(value, "target_bf16")
    if given is not None:
        return given
    import torch

    return bf16 and resolve_dtype("auto", resolve_device(device)) == torch.bfloat16


def dtype_name(dtype: "torch.dtype") -> str:
    return str(dtype).removeprefix("torch.")
