"""Embedding requests in the scheduler and on the core process's wire: a prompt may fill the whole context (no
token follows it), the request finishes with the step that computes its prompt, and its blocks are freed."""

from __future__ import annotations

from wick.core.kv_cache_manager import KVCacheManager
from wick.core.request import Request, RequestStatus
from wick.core.sched_output import ModelRunnerOutput
from wick.core.scheduler import Scheduler
from wick.engine.core_process import decode_output, decode_request, encode_output, encode_request, pack, unpack
from wick.engine.protocol import EngineCoreOutput, EngineCoreRequest
from wick.pooling_params import PoolingParams
from wick.sampling_params import SamplingParams


def test_a_pooling_request_finishes_after_its_prompt() -> None:
    kv = KVCacheManager(16, block_size=4, enable_prefix_caching=False)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=8,
                          enable_chunked_prefill=False)
    request = Request("e", list(range(8)), SamplingParams(max_tokens=1), seed=0, pooling_params=PoolingParams())
    scheduler.add_request(request)  # 8 tokens: the whole context, which a generation request could not have
    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"e": 8}
    assert output.scheduled_new_reqs[0].pooling_params == PoolingParams()
    updated = scheduler.update_from_output(output, ModelRunnerOutput(pooler_output={"e": [0.5, 0.5]}))
    assert updated == [] and request.status is RequestStatus.FINISHED_STOPPED
    assert request.output_token_ids == [] and kv.num_free_blocks == 16
    assert not scheduler.has_unfinished_requests() and scheduler.schedule().finished_req_ids == ["e"]


def test_the_wire_carries_pooling_params_and_embeddings() -> None:
    request = EngineCoreRequest("e", [1, 2], SamplingParams(max_tokens=1), pooling_params=PoolingParams(16, False))
    assert decode_request(unpack(pack(encode_request(request)))).pooling_params == PoolingParams(16, False)
    plain = EngineCoreRequest("g", [1, 2], SamplingParams())
    assert decode_request(unpack(pack(encode_request(plain)))).pooling_params is None
    output = EngineCoreOutput("e", [], finish_reason="stop", pooling_output=[0.25, -1.5])
    assert decode_output(unpack(pack(encode_output(output)))) == output
