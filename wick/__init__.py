"""wick: a readable LLM serving engine on PyTorch and Triton."""

from wick.config import EngineArgs
from wick.entrypoints.llm import LLM
from wick.outputs import CompletionOutput, Logprob, RequestOutput
from wick.sampling_params import SamplingParams, StructuredOutputsParams

__version__ = "0.1.0"
__all__ = ["LLM", "CompletionOutput", "EngineArgs", "Logprob", "RequestOutput", "SamplingParams",
           "StructuredOutputsParams", "__version__"]
