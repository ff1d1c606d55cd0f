"""The floating-point type the engine serves in: `float32`, `bfloat16`, or `auto`.

Why bfloat16 on CPUs with AMX: speculative decoding pays off only when verifying k+1 tokens costs
about what one decoding step costs. On the 2-core Intel Xeon this project is measured on, a 4-token
verify forward of SmolLM2-135M costs ~1.5x a 1-token step in float32 (oneDNN's float32 kernels for a
few rows stream the weights at about half the single-row rate), but only ~1.1x in bfloat16 with
prepacked weights, where oneDNN uses AMX tiles for the extra rows (docs/serving-engine.md has the
measurements). A single bfloat16 step costs about what a float32 one does, so plain decoding gets no
slower. `auto` picks bfloat16 when the CPU has AMX-BF16 (and oneDNN supports bfloat16), else float32; on a
CUDA GPU, bfloat16 where the GPU supports it. The device setting `auto` (`resolve_device`) is CUDA when
present, else the CPU.

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


def cpu_has_amx_bf16() -> bool:
    import torch

    from draftwheel.serving.engine.prepack import packs_bfloat16

    caps = torch._C._cpu._get_cpu_capability()  # what torch itself dispatches on
    return bool(caps.get("amx_bf16")) and packs_bfloat16()


def resolve_dtype(name: str, device: str = "cpu") -> "torch.dtype":
    """`auto` -> bfloat16 on AMX-BF16 CPUs and on CUDA GPUs that support it (as `resolve_bf16`), else
    float32; `float32`/`bfloat16` as named. `device` as `resolve_device` returns it. Raises ValueError
    naming the choices for anything else."""
    import torch

    if name == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
        return torch.bfloat16 if device == "cpu" and cpu_has_amx_bf16() else torch.float32
    check_dtype_name(name)
    return getattr(torch, name)


def resolve_bf16(value: "bool | str", device: str = "cpu") -> bool:
    """A trainer's `bf16` switch as a bool: True/False as given, `auto` -> bfloat16 autocast only where it
    is fast: a CUDA GPU that supports it (trainer device `auto`), or a CPU with AMX-BF16. On an AVX2-only
    CPU, without bfloat16 matrix units, autocast made a batched SmolLM2 forward 7x slower and a whole
    training step of the draft 25x slower than float32, so `auto` keeps float32 there.
    Raises ValueError naming the `bf16` field for anything else."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered not in ("auto", "true", "false"):
            raise ValueError(f"bf16: {value!r} is not one of true, false, auto")
        if lowered != "auto":
            return lowered == "true"
        import torch

        if device == "auto" and torch.cuda.is_available():
            return torch.cuda.is_bf16_supported()
        return cpu_has_amx_bf16()
    if not isinstance(value, bool):
        raise ValueError(f"bf16: {value!r} is not one of true, false, auto")
    return value


def dtype_name(dtype: "torch.dtype") -> str:
    return str(dtype).removeprefix("torch.")
