"""POST /tokenize and POST /detokenize, with vLLM's request and response shapes."""

from __future__ import annotations

from typing import Any

from wick.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest, template_messages
from wick.entrypoints.openai.serving_engine import OpenAIServing


class ServingTokenization(OpenAIServing):
    def tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        self.models.resolve(request.model)
        if request.messages is not None:
            _, token_ids = self.render_chat(
                template_messages(request.messages), request.tools, request.add_generation_prompt,
                request.continue_final_message, request.chat_template_kwargs)
        else:
            token_ids = self.encode(request.prompt or "", "prompt", add_special_tokens=request.add_special_tokens)
        return {"count": len(token_ids), "max_model_len": self.engine.max_model_len, "tokens": token_ids}

    def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        self.models.resolve(request.model)
        self.check_token_ids(request.tokens, "tokens")
        return {"prompt": self.tokenizer.decode(request.tokens)}
