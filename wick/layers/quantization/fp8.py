"""FP8 (e4m3) weights: checkpoints with quant_method "fp8" (block-wise `weight_scale_inv` over
`weight_block_size` tiles, as DeepSeek-V3 and Qwen3-*-FP8 ship, or one `weight_scale` per tensor),
and in-situ quantization of full-precision checkpoints (`--quantization fp8`: one scale per output row).

Per-tensor scales of merged shards become per-row scales, so every layer is either block-scaled or
row-scaled. On a GPU of compute capability 8.9 or more (fp8 conversions in hardware) the Triton kernels
read the fp8 bytes once, up to TILE_MAX_ROWS rows; past them, and elsewhere, the weight is converted per
forward (with one scale a row the scale then multiplies the product).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from wick.kernels.fp8_matmul import GEMV_MAX_ROWS, fp8_dequantize, scales_per_row
from wick.layers.quantization.base import LinearMethod, QuantizationConfig, set_weight_attrs

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
# Up to this many rows the fp8 kernels read W as it is held; past it (long prefills) W converted to x's dtype and
# cuBLAS win. On an H100 the tile kernel took 0.34 ms at 64 rows and 1.04 at 1,024 for Llama-3.1-8B's four
# linears where W converted then cuBLAS took 0.86 and 1.45 (benchmarks/kernels/bench_fp8_gemm.py).
TILE_MAX_ROWS = 1024


class Fp8Config(QuantizationConfig):
    name = "fp8"

    def __init__(self, block: tuple[int, int] | None = None, static_activations: bool = False,
                 in_situ: bool = False) -> None:
        self.block = block
        self.static_activations = static_activations
        self.in_situ = in_situ

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Fp8Config:
        fmt = str(config.get("fmt", "e4m3")).lower()
        if fmt not in ("e4m3", "float8_e4m3fn"):
            raise ValueError(f"FP8 quantization_config: fmt {fmt!r} is not supported; supported: e4m3")
        scheme = config.get("activation_scheme", "dynamic")
        if scheme not in ("dynamic", "static"):
            raise ValueError(f"FP8 quantization_config: activation_scheme must be dynamic or static, got {scheme!r}")
        block = config.get("weight_block_size")
        if block is not None:
            if not (isinstance(block, (list, tuple)) and len(block) == 2
                    and all(isinstance(b, int) and b > 0 for b in block)):
                raise ValueError(f"FP8 quantization_config: weight_block_size must be two positive integers, "
                                 f"got {block!r}")
            block = (block[0], block[1])
        return cls(block, scheme == "static")

    def get_linear_method(self) -> LinearMethod:
        return Fp8LinearMethod(self)

    def describe(self) -> str:
        if self.in_situ:
            return "FP8 e4m3 (in-situ, per row)"
        return f"FP8 e4m3 {'block ' + 'x'.join(map(str, self.block)) if self.block else 'per tensor'}"


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [N, K] -> (e4m3 [N, K], float32 scales [N, 1]) with each row's largest value at FP8_MAX."""
    w = weight.float()
    scale = (w.abs().amax(1, keepdim=True) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def _fp8_gpu(x: torch.Tensor) -> bool:
    """Whether x's GPU runs the fp8 kernels (compute capability 8.9 and later convert fp8 in hardware)."""
    return torch.cuda.get_device_capability(x.device) >= (8, 9)


def _param(shape: tuple[int, ...], dtype: torch.dtype, **attrs: Any) -> nn.Parameter:
    return set_weight_attrs(nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False), **attrs)


class Fp8LinearMethod(LinearMethod):
    def __init__(self, config: Fp8Config) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        cfg = self.config
        output_size = sum(output_sizes)
        layer.fp8_dtype = params_dtype
        if cfg.in_situ:
            weight = _param((0,), params_dtype, output_dim=0, input_dim=1)
            weight.weight_loader = partial(self._load_in_situ, layer)
            layer.register_parameter("weight", weight)
            layer.fp8_pending = set(range(len(output_sizes)))
            return
        layer.register_parameter("weight", _param((output_size, input_size), torch.float8_e4m3fn,
                                                  output_dim=0, input_dim=1))
        if cfg.block is not None:
            bn, bk = cfg.block
            scale = _param((-(-output_size // bn), -(-input_size // bk)), torch.float32,
                           output_dim=0, output_pack=bn, input_dim=1, input_pack=bk)
            layer.register_parameter("weight_scale_inv", scale)
        else:
            layer.register_parameter("weight_scale", _param((len(output_sizes),), torch.float32, per_shard=True))
        if cfg.static_activations:
            # Read for completeness of the checkpoint; activations are not quantized (W8A16).
            layer.register_parameter("input_scale", _param((len(output_sizes),), torch.float32, per_shard=True))

    def _load_in_situ(self, layer: nn.Module, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: int | str | None = None) -> None:
        if param.numel() == 0:
            param.data = torch.empty(layer.output_size, layer.input_size, dtype=layer.fp8_dtype, device=param.device)
        layer.weight_loader(param, loaded, shard_id)
        layer.fp8_pending.discard(layer.shard_index(shard_id))
        if not layer.fp8_pending:
            layer.weight.data, layer.fp8_scale = quantize_rows(layer.weight.data)
            layer.fp8_block = (1, layer.input_size)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.config.in_situ:
            if layer.fp8_pending:
                raise ValueError("a layer to quantize to fp8 is missing some of its merged shards")
            return
        if self.config.block is not None:
            layer.fp8_scale, layer.fp8_block = layer.weight_scale_inv.data, self.config.block
        else:
            sizes = torch.tensor(layer.output_sizes, device=layer.weight_scale.device)
            layer.fp8_scale = layer.weight_scale.data.repeat_interleave(sizes).reshape(-1, 1)
            layer.fp8_block = (1, layer.input_size)

    def initialize_dummy(self, layer: nn.Module, generator: torch.Generator, low: float, high: float) -> None:
        device = layer.weight.device
        weight = torch.empty(layer.output_size, layer.input_size, dtype=layer.fp8_dtype, device=device)
        weight.uniform_(low, high, generator=generator)
        quantized, scale = quantize_rows(weight)
        layer.weight.data = quantized
        if self.config.in_situ:
            layer.fp8_pending = set()
            layer.fp8_scale, layer.fp8_block = scale, (1, layer.input_size)
        elif self.config.block is not None:
            layer.weight_scale_inv.data.fill_(high / FP8_MAX)
            layer.weight.data = (weight / (high / FP8_MAX)).to(torch.float8_e4m3fn)
        else:
            layer.weight_scale.data.fill_(high / FP8_MAX)
            layer.weight.data = (weight / (high / FP8_MAX)).to(torch.float8_e4m3fn)

    def held_tensors(self, layer: nn.Module) -> list[torch.Tensor]:
        return [layer.fp8_scale]

    def apply_gated(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                    activation: str) -> torch.Tensor | None:
        if bias is not None or not (x.is_cuda and x.numel() <= GEMV_MAX_ROWS * x.shape[-1] and _fp8_gpu(x)):
            return None
        from wick.kernels.fp8_matmul import fp8_gemv

        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        out = fp8_gemv(x2, layer.weight, layer.fp8_scale, layer.fp8_block, activation)
        return None if out is None else out.reshape(*x.shape[:-1], out.shape[-1])

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.is_cuda and x.numel() <= TILE_MAX_ROWS * x.shape[-1] and _fp8_gpu(x):
            from wick.kernels.fp8_matmul import fp8_matmul

            out = fp8_matmul(x, layer.weight, layer.fp8_scale, layer.fp8_block)
        elif scales_per_row(layer.fp8_block, x.shape[-1]):
            # One scale a row multiplies the product: W converts to x's dtype exactly, in one pass
            # (expanding the scales and W to float32 first moved ~28 bytes a weight where this moves 5).
            out = (x @ layer.weight.to(x.dtype).t()).mul_(layer.fp8_scale.view(-1))
        else:
            out = x @ fp8_dequantize(layer.weight, layer.fp8_scale, layer.fp8_block).to(x.dtype).t()
        return out + bias if bias is not None else out
