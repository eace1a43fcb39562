"""`wick chat`: talk to a model in the terminal, with the engine in this process (no server)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from wick.cli.engine_flags import add_engine_flags, engine_args_from

if TYPE_CHECKING:
    from wick.entrypoints.llm import LLM

HELP = "/reset clears the conversation, /exit quits (or Ctrl-D / Ctrl-C)."


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("chat", help="chat with a model in the terminal")
    add_engine_flags(parser)
    parser.add_argument("--system", default=None, help="a system message that opens every conversation")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Also `wick serve --i` (vllm.rs's interactive mode)."""
    from wick.entrypoints.llm import LLM

    chat = Chat(LLM(**dataclasses.asdict(engine_args_from(args))), args.system)
    try:
        # Line editing and history for input(), where the platform has it.
        importlib.import_module("readline")
    except ImportError:
        pass
    print(f"wick chat: {chat.llm.engine_args.model or 'SmolLM2-135M-Instruct (default)'}. {HELP}", flush=True)
    try:
        while True:
            try:
                line = input("> ").strip()
            except EOFError:
                print()
                return 0
            if line == "/exit":
                return 0
            if line == "/reset":
                chat.reset()
                print("(conversation cleared)")
            elif line.startswith("/"):
                print(f"unknown command {line}. {HELP}")
            elif line:
                try:
                    for delta in chat.send(line):
                        sys.stdout.write(delta)
                        sys.stdout.flush()
                except ValueError as e:
                    print(f"error: {e}")
                print()
    except KeyboardInterrupt:
        print()
        return 0


class Chat:
    """A conversation with the model: its history and one streamed answer at a time."""

    def __init__(self, llm: LLM, system: str | None = None) -> None:
        """Answers are sampled with the model's and the flags' sampling defaults (llm.sampling_defaults)."""
        self.llm = llm
        self.system = system
        self.messages: list[dict[str, str]] = []
        self._ids = itertools.count()
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def send(self, text: str) -> Iterator[str]:
        """Adds the user's message, yields the answer's text piece by piece as it is decoded, and
        adds the answer to the history. Raises ValueError when the conversation no longer fits."""
        from wick.engine.protocol import EngineCoreRequest
        from wick.tokenizer.chat_template import apply_chat_template

        llm = self.llm
        messages = [*self.messages, {"role": "user", "content": text}]
        prompt = apply_chat_template(llm.tokenizer, messages, add_generation_prompt=True,
                                     chat_template=llm.engine_args.chat_template)
        token_ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
        room = llm.config.max_model_len - len(token_ids)
        if room < 1:
            raise ValueError(f"the conversation has {len(token_ids)} tokens, more than the model's context of "
                             f"{llm.config.max_model_len}: /reset to start again")
        defaults = llm.sampling_defaults
        params = defaults.sampling_params(defaults.max_tokens_for(room, llm.config.max_model_len),
                                          eos_token_ids=llm.eos_token_ids)
        request_id = f"chat-{next(self._ids)}"
        llm.output_processor.add_request(request_id, prompt, token_ids, params)
        try:
            llm.core.add_request(EngineCoreRequest(request_id, token_ids, params))
            answer = ""
            while llm.core.has_unfinished_requests():
                outputs, to_abort = llm.output_processor.process_outputs(llm.core.step())
                llm.core.abort_requests(to_abort)
                for output in outputs:
                    text_so_far = output.outputs[0].text
                    if len(text_so_far) > len(answer):
                        yield text_so_far[len(answer):]
                        answer = text_so_far
        finally:
            llm.core.abort_requests(llm.output_processor.abort_request(request_id))
        self.messages = [*messages, {"role": "assistant", "content": answer}]
