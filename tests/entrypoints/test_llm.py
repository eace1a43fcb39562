"""The offline API on real model files (`default_llm` is tests/conftest.py's, shared with
tests/core/test_structured_output.py; `qwen_llm` is conftest.py's, shared with test_llm_tools.py)."""

from __future__ import annotations

import math

import pytest

from wick import LLM, SamplingParams


def test_default_model_knows_the_capital_of_france(default_llm):
    out = default_llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                           SamplingParams(temperature=0.0, max_tokens=32))[0]
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason in ("stop", "length")


def test_generate_accepts_strings_token_ids_and_dicts(default_llm):
    tokenizer = default_llm.get_tokenizer()
    ids = tokenizer.encode("The sky is")
    params = SamplingParams(temperature=0.0, max_tokens=6)
    by_text, by_ids, by_dict = default_llm.generate(["The sky is", ids, {"prompt_token_ids": ids}], params)
    assert by_text.prompt_token_ids == ids and by_text.prompt == "The sky is"
    assert by_text.outputs[0].token_ids == by_ids.outputs[0].token_ids == by_dict.outputs[0].token_ids
    assert by_text.outputs[0].text == tokenizer.decode(by_text.outputs[0].token_ids, skip_special_tokens=True)
    assert by_text.outputs[0].finish_reason == "length" and len(by_text.outputs[0].token_ids) == 6


def test_logprobs_and_prompt_logprobs_equal_log_softmax(default_llm):
    params = SamplingParams(temperature=0.0, max_tokens=3, logprobs=2, prompt_logprobs=1)
    out = default_llm.generate("One, two, three,", params)[0]
    sample = out.outputs[0]
    assert len(sample.logprobs) == 3
    for token_id, position in zip(sample.token_ids, sample.logprobs, strict=True):
        assert token_id in position and position[token_id].rank == 1  # greedy picks the top token
        assert len(position) == 2 or len(position) == 3
        assert all(lp.logprob <= 0 for lp in position.values())
    assert math.isclose(sample.cumulative_logprob, sum(p[t].logprob for t, p in zip(sample.token_ids,
                                                                                     sample.logprobs, strict=True)))
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    for token_id, position in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:], strict=True):
        assert token_id in position


def test_decode_logprobs_equal_the_same_tokens_prompt_logprobs(monkeypatch):
    """The decode-time logprobs of the generated tokens equal the prefill-time prompt logprobs of the same
    tokens when prompt + output is fed back as a prompt. On the float32 path: the CPU's bfloat16 GGUF kernels
    round their inputs, so one row and many rows can land a last bit apart, which the logits then amplify."""
    monkeypatch.setenv("WICK_CPU_QUANT_KERNELS", "0")
    llm = LLM(max_model_len=2048)
    out = llm.generate("One, two, three,", SamplingParams(temperature=0.0, max_tokens=3, logprobs=0))[0]
    sample = out.outputs[0]
    again = llm.generate({"prompt_token_ids": out.prompt_token_ids + sample.token_ids},
                         SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0))[0]
    tail = again.prompt_logprobs[len(out.prompt_token_ids):]
    for token_id, decoded, prefilled in zip(sample.token_ids, sample.logprobs, tail, strict=True):
        assert math.isclose(decoded[token_id].logprob, prefilled[token_id].logprob, abs_tol=1e-3)


def test_stop_string_and_stop_token(default_llm):
    free = default_llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0.0, max_tokens=20))[0].outputs[0]
    assert " 8" in free.text, free.text
    stopped = default_llm.generate("1, 2, 3, 4, 5,",
                                   SamplingParams(temperature=0.0, max_tokens=20, stop=[" 8"]))[0].outputs[0]
    assert stopped.text == free.text[: free.text.index(" 8")]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == " 8"
    token = free.token_ids[2]
    by_token = default_llm.generate("1, 2, 3, 4, 5,", SamplingParams(temperature=0.0, max_tokens=20,
                                                                     stop_token_ids=[token]))[0].outputs[0]
    assert by_token.token_ids == free.token_ids[:3] and by_token.stop_reason == token


def test_n_samples_and_min_tokens(default_llm):
    out = default_llm.generate("Once upon a time", SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=10,
                                                                  min_tokens=10))[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert all(len(o.token_ids) == 10 for o in out.outputs)


def test_seed_reproducible(default_llm):
    params = SamplingParams(temperature=1.0, seed=42, max_tokens=12)
    a = default_llm.generate("Tell me a story", params)[0].outputs[0].token_ids
    b = default_llm.generate(["Hello", "Tell me a story", "x"], params)[1].outputs[0].token_ids
    assert a == b


@pytest.mark.slow
def test_qwen_coder_answers_a_coding_question(qwen_llm):
    out = qwen_llm.chat([{"role": "user", "content": "Write a Python function that returns the sum of a list of "
                                                       "numbers. Reply with only the code."}],
                        SamplingParams(temperature=0.0, max_tokens=80))[0]
    text = out.outputs[0].text
    assert "def " in text and "return" in text and "sum" in text, text


def test_dummy_model_without_tokenizer_takes_token_ids(tmp_path):
    import json

    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000, "max_position_embeddings": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = LLM(str(tmp_path), load_format="dummy")
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=5, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 5 and out.text == "" and all(0 <= t < 1000 for t in out.token_ids)
    with pytest.raises(ValueError, match="token ids"):
        llm.generate("text needs a tokenizer")


def test_generation_config_defaults_reach_a_call_that_omits_them(tmp_path, tiny_llama_dir):
    """The model's generation_config.json (greedy, 5 tokens) is what a call without SamplingParams gets; the
    call's own SamplingParams win; --generation-config vllm ("vllm") ignores the file."""
    import json
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": 5}))
    llm = LLM(str(folder), max_model_len=128, kv_cache_memory=8 << 20)
    greedy = llm.generate([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))[0].outputs[0]
    default = llm.get_default_sampling_params()
    assert (default.temperature, default.max_tokens) == (0.0, 5)
    omitted = llm.generate([5, 6, 7], default.clone(ignore_eos=True))[0].outputs[0]
    assert omitted.token_ids == greedy.token_ids
    own = llm.generate([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))[0].outputs[0]
    assert own.token_ids == greedy.token_ids[:2]
    assert LLM(str(folder), max_model_len=128, kv_cache_memory=8 << 20,
               generation_config="vllm").get_default_sampling_params().temperature == 1.0
