"""CPU serving kernels: oneDNN linear layers with weights packed once, at load time.

Why: on CPU a stock `nn.Linear` calls MKL's sgemm, which re-packs the whole weight on every call. For
the short inputs of decoding that packing is most of the cost, and it grows with the number of rows:
on the 2-core AMD EPYC this project is measured on, a (k+1)=5-token verify forward cost ~1.45x a
1-token forward, which eats the speedup speculative decoding is for. oneDNN's linear with a weight
reordered ahead of time (the same op PyTorch Inductor uses when it freezes a CPU model) does not pay
that cost: 5 rows cost about what 1 row costs, and both are faster than MKL (docs/serving-engine.md
has the measurements). This is what CPU serving stacks do (IPEX, Inductor freezing); HF `generate`
does not.

`prepack_linears(model)` swaps the `nn.Linear` layers of a CPU float32/bfloat16 model for `PackedLinear`
in place, those with at least `MIN_PACKED_WEIGHT` weights: a oneDNN call has a fixed cost (~13 us here)
that outweighs the saving on small matrices (measured per layer: 256x256 is faster stock at 1 and 5
rows, 384x384 and up is faster packed at 5 rows). A `PackedLinear` keeps the original `weight` and
`bias` parameters (state dicts, tied weights and `save_pretrained` see no change) and repacks itself
when the weight was modified in place since packing (an optimizer step, a `load_state_dict`), so the
packed copy can never go stale. With autograd recording (or an input of another dtype) it runs the
stock op, so training through a packed model stays correct; decoding runs under
`torch.inference_mode`/`no_grad` and takes the packed op. `unpacked_copy(model)` is the inverse, for
measuring HF `generate` as users run it.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from draftwheel.serving.engine.precision import cpu_has_amx_bf16

log = logging.getLogger(__name__)

MIN_PACKED_WEIGHT = 1 << 17  # float32 weights (in_features * out_features) below which the stock op is faster
# bfloat16: the stock op is slow at every size for a few rows (a 576x192 SmolLM2 k/v projection: ~106 us per
# row stock vs ~15 us packed), so everything is packed: plain decoding 59 -> 48 ms per token on the reference.
MIN_PACKED_WEIGHT_BF16 = 0


def _pack(weight: torch.Tensor) -> torch.Tensor:
    # The batch-size hint is the typical row count: a (k+1)-token verify. Any row count works.
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 5)


def _median_s(fn: Callable[[], torch.Tensor], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[reps // 2]


@functools.lru_cache(maxsize=None)
def stock_wins_one_row(out_features: int, in_features: int, dtype: torch.dtype) -> bool:
    """Measured once per shape and process: is the stock op faster than the packed one for ONE row?

    Why: which kernel wins a single-row (plain decoding) call depends on the CPU. On the AMD EPYC of the
    first measurements packed oneDNN won at every row count; on an Intel Xeon with AMX the stock (MKL)
    gemv wins at one row (59 vs 64 ms per SmolLM2 step) while packed still wins the multi-row verify
    (77 vs ~100 ms for 4 tokens). Measuring beats guessing; ties go to the packed op.
    """
    weight = torch.randn(out_features, in_features, dtype=dtype)
    packed, row = _pack(weight), torch.randn(1, in_features, dtype=dtype)
    with torch.inference_mode():
        stock_s = _median_s(lambda: F.linear(row, weight), 15)
        packed_s = _median_s(lambda: torch.ops.mkldnn._linear_pointwise(row, packed, None, "none", [], ""), 15)
    return stock_s < 0.95 * packed_s


@functools.lru_cache(maxsize=None)
def one_row_reduces_apart(dtype: torch.dtype) -> bool:
    """Does oneDNN's packed op reduce a single row in another order than the same row among others?
    In bfloat16 on a CPU without AMX tiles (AVX-512 BF16 dot products) it does for long rows: a
    1536-wide row (SmolLM2's MLP down projection) differed in the last bit from its place in a 5-row
    call on 19 of 50 random inputs, while any call of 2 to 64 rows gave every row bitwise the same. A
    verify forward would then not be the one-token steps it stands for, and greedy speculative output
    drifts from plain decoding (3 of 8 held-out chat prompts identical), so such single rows are
    computed as two (`PackedLinear`). With AMX, and in float32, rows agree at every count."""
    return dtype == torch.bfloat16 and not cpu_has_amx_bf16()


class PackedLinear(nn.Module):
    """`nn.Linear` computed with a oneDNN weight packed once. Same parameters, same results (fp32).
    Single rows take whichever kernel measured faster on this CPU (`stock_wins_one_row`), except where
    a single row must be computed as two to match its multi-row results bitwise (`one_row_reduces_apart`)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter objects: tying and state dicts are unchanged
        self.bias = linear.bias
        self._packed: torch.Tensor | None = _pack(self.weight)
        self._packed_version = self.weight._version
        self.one_row_as_two = one_row_reduces_apart(self.weight.dtype)
        self.one_row_stock = not self.one_row_as_two and stock_wins_one_row(self.out_features, self.in_features,
                                                                            self.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dtype != self.weight.dtype or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)  # oneDNN's packed op has no backward
        if self.one_row_stock and x.numel() == self.in_features:
            return F.linear(x, self.weight, self.bias)
        if self._packed is None or self.weight._version != self._packed_version:  # copied, or changed in place
            self._packed, self._packed_version = _pack(self.weight), self.weight._version
        if self.one_row_as_two and x.numel() == self.in_features:
            row = x.reshape(1, self.in_features)
            out = torch.ops.mkldnn._linear_pointwise(torch.cat([row, row]), self._packed, self.bias, "none", [], "")
            return out[:1].reshape(*x.shape[:-1], self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")

    # A oneDNN tensor cannot be copied or pickled: copies (deepcopy, pickle) drop it and pack on first use.
    def __getstate__(self) -> dict:
        return {**self.__dict__, "_packed": None}

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


@functools.lru_cache(maxsize=None)
def packs_bfloat16() -> bool:
    """oneDNN has a bfloat16 path on this CPU. Without one (an AVX2-only CPU: no AVX-512, no AVX-NE-CONVERT)
    packing a bfloat16 weight raises, so bfloat16 layers stay stock there."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def packable(dtype: torch.dtype) -> bool:
    return dtype == torch.float32 or (dtype == torch.bfloat16 and packs_bfloat16())


def can_prepack(model: nn.Module) -> bool:
    """oneDNN is built in, and the model's parameters are on the CPU in a dtype it packs here."""
    param = next(model.parameters(), None)
    return (param is not None and param.device.type == "cpu" and packable(param.dtype)
            and torch.backends.mkldnn.is_available())


def _swap_children(model: nn.Module, wanted: Callable[[nn.Module], bool],
                   replacement: Callable[[nn.Module], nn.Module]) -> int:
    """Replace every submodule for which `wanted` holds by `replacement(submodule)`; return how many."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if wanted(child)]
    for parent, name, child in swaps:
        setattr(parent, name, replacement(child))
    return len(swaps)


def prepack_linears(model: nn.Module, min_weight: int | None = None) -> int:
    """Replace the model's `nn.Linear` modules holding at least `min_weight` weights (default
    `MIN_PACKED_WEIGHT`; `MIN_PACKED_WEIGHT_BF16` for bfloat16 layers) with `PackedLinear`, in place; return
    how many were replaced (0 when `can_prepack` is false, or when the model was packed before)."""
    if not can_prepack(model):
        return 0

    def threshold(dtype: torch.dtype) -> int:
        if min_weight is not None:
            return min_weight
        return MIN_PACKED_WEIGHT_BF16 if dtype == torch.bfloat16 else MIN_PACKED_WEIGHT

    swapped = _swap_children(model, lambda m: type(m) is nn.Linear and packable(m.weight.dtype)
                             and m.weight.numel() >= threshold(m.weight.dtype), PackedLinear)
    if swapped:
        log.info("prepacked %d linear layers of %s for oneDNN", swapped, type(model).__name__)
    return swapped


def is_packed(model: nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())


def _stock_linear(packed: PackedLinear) -> nn.Linear:
    linear = nn.Linear(packed.in_features, packed.out_features, bias=packed.bias is not None, device="meta")
    linear.weight, linear.bias = packed.weight, packed.bias  # the (copied) parameters themselves
    return linear


def unpacked_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` with every `PackedLinear` turned back into a stock `nn.Linear`."""
    clone = copy.deepcopy(model)  # keeps tied parameters tied
    _swap_children(clone, lambda m: isinstance(m, PackedLinear), _stock_linear)
    return clone
