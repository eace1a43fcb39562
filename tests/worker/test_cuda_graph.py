"""StepGraphs' choice of shapes (its capture and replay need a GPU: tests/worker/test_gpu_model_runner.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from wick.layers.attention.selector import get_attention_backend
from wick.worker.cuda_graph import PREFILL_SIZES, StepGraphs, capture_sizes
from wick.worker.step_buffers import StepBuffers

CPU = torch.device("cpu")


def _graphs(backend: str, max_tokens: int, max_model_len: int, max_num_seqs: int = 4) -> StepGraphs:
    buffers = StepBuffers(max_tokens, capture_sizes(max_num_seqs)[-1], 8, 16, CPU)
    return StepGraphs(nn.Identity(), get_attention_backend(backend, CPU), buffers, max_num_seqs, max_model_len, 16,
                      CPU)


@pytest.mark.parametrize(("max_tokens", "max_model_len", "expected"), [
    (8192, 4096, list(PREFILL_SIZES)),
    (8192, 100, [16, 32, 64, 96, 128]),  # 128 takes prompts of 97-100 tokens; none has more
    (8192, 96, [16, 32, 64, 96]),
    (200, 4096, [16, 32, 64, 96, 128, 192]),  # the step buffers hold no more
])
def test_prefill_sizes_end_at_the_longest_context_and_the_buffers(max_tokens, max_model_len, expected):
    graphs = _graphs("triton", max_tokens, max_model_len)
    assert graphs.prefill_sizes == expected
    assert graphs.prefill_size(1) == 16 and graphs.prefill_size(expected[-1]) == expected[-1]
    assert graphs.prefill_size(expected[-1] + 1) is None
    assert graphs.sizes == [1, 2, 4] and graphs.batch_size(3) == 4


def test_no_prefill_graphs_where_the_backend_cannot_capture_them():
    graphs = _graphs("torch", 8192, 4096)
    assert graphs.prefill_sizes == [] and graphs.prefill_size(5) is None
