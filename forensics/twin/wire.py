"""What the twin's HTTP servers read and write: sglang-native and OpenAI bodies, SSE chunks.

Tokens are synthetic (there is no model): a prompt counts one token per four
bytes of text, roughly a BPE tokenizer's rate, or ``len(input_ids)``; generated
tokens are ``" tok<i>"``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang's health-probe marker: the fake transfer backend
DEFAULT_MAX_TOKENS = 16


class BadRequest(ValueError):
    """A request body the twin cannot serve; the message says which field."""


@dataclass
class GenerationRequest:
    endpoint: str
    rid: str
    prompt_tokens: int
    max_new_tokens: int
    stream: bool
    bootstrap_host: str | None
    bootstrap_port: int | None
    bootstrap_room: int | None
    created: float = field(default_factory=time.time)

    @property
    def is_health_probe(self) -> bool:
        return self.bootstrap_host == FAKE_BOOTSTRAP_HOST

    @property
    def bootstrap_addr(self) -> str:
        return f"{self.bootstrap_host}:{self.bootstrap_port}"


def count_prompt_tokens(text: str) -> int:
    return max(1, -(-len(text.encode("utf-8")) // 4))


def parse(endpoint: str, body: dict) -> GenerationRequest:
    """Read a request body of ``endpoint``; raises :class:`BadRequest` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if endpoint == "/generate":
        if "input_ids" in body and body["input_ids"] is not None:
            ids = body["input_ids"]
            if not isinstance(ids, list) or not ids:
                raise BadRequest("input_ids: expected a non-empty list of ints")
            tokens = len(ids)
        elif isinstance(body.get("text"), str):
            tokens = count_prompt_tokens(body["text"])
        else:
            raise BadRequest("/generate needs 'text' (string) or 'input_ids'")
        params = body.get("sampling_params") or {}
        max_new = params.get("max_new_tokens", DEFAULT_MAX_TOKENS)
    elif endpoint == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            tokens = len(prompt)
        elif isinstance(prompt, str):
            tokens = count_prompt_tokens(prompt)
        else:
            raise BadRequest("/v1/completions needs 'prompt' (string or token list)")
        max_new = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    elif endpoint == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("/v1/chat/completions needs 'messages' (non-empty list)")
        text = "".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        tokens = count_prompt_tokens(text) + 4 * len(messages)  # chat template overhead
        max_new = body.get("max_completion_tokens", body.get("max_tokens", DEFAULT_MAX_TOKENS))
    else:
        raise BadRequest(f"unknown endpoint {endpoint}")
    if not isinstance(max_new, int) or max_new < 1:
        raise BadRequest(f"max tokens: expected a positive int, got {max_new!r}")
    room = body.get("bootstrap_room")
    port = body.get("bootstrap_port")
    return GenerationRequest(
        endpoint=endpoint,
        rid=str(body.get("rid") or uuid.uuid4().hex),
        prompt_tokens=tokens,
        max_new_tokens=max_new,
        stream=bool(body.get("stream", False)),
        bootstrap_host=body.get("bootstrap_host"),
        bootstrap_port=int(port) if port is not None else None,
        bootstrap_room=int(room) if room is not None else None,
    )


def token_text(index: int) -> str:
    return f" tok{index}"


def sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


def stream_chunk(req: GenerationRequest, index: int, text_so_far: str, meta: dict | None = None) -> dict:
    """One streamed chunk in the endpoint's format (``meta`` marks the last one)."""
    finish = None if meta is None else {"type": "length", "length": req.max_new_tokens}
    if req.endpoint == "/generate":
        info = {"id": req.rid, "prompt_tokens": req.prompt_tokens, "completion_tokens": index + 1,
                "finish_reason": finish}
        info.update(meta or {})
        return {"text": text_so_far, "meta_info": info, "index": 0}
    base = {"id": req.rid, "created": int(req.created), "model": "twin-synthetic"}
    if req.endpoint == "/v1/completions":
        choice = {"index": 0, "text": token_text(index), "finish_reason": "length" if meta is not None else None}
        chunk = dict(base, object="text_completion", choices=[choice])
    else:
        choice = {"index": 0, "delta": {"content": token_text(index)},
                  "finish_reason": "length" if meta is not None else None}
        chunk = dict(base, object="chat.completion.chunk", choices=[choice])
    if meta is not None:
        chunk["sglang_twin"] = meta
    return chunk


def final_chunk(req: GenerationRequest, text: str, meta: dict) -> dict:
    """The last streamed chunk: finish reason and the twin's KV check (``kv_intact``)."""
    if req.endpoint == "/generate":
        info = {"id": req.rid, "prompt_tokens": req.prompt_tokens, "completion_tokens": req.max_new_tokens,
                "finish_reason": {"type": "length", "length": req.max_new_tokens}}
        info.update(meta)
        return {"text": text, "meta_info": info, "index": 0}
    base = {"id": req.rid, "created": int(req.created), "model": "twin-synthetic", "sglang_twin": meta}
    if req.endpoint == "/v1/completions":
        return dict(base, object="text_completion", choices=[{"index": 0, "text": "", "finish_reason": "length"}])
    return dict(base, object="chat.completion.chunk",
                choices=[{"index": 0, "delta": {}, "finish_reason": "length"}])


def generate_body(req: GenerationRequest, text: str, meta: dict, answer) -> dict:
    """A finished non-streamed ``/generate`` body with the keys the release's tokenizer manager
    writes (``answer``: :class:`forensics.twin.generate_answer.AnswerKeys`) and the
    twin's own instrumentation (``meta``) added to ``meta_info``. The values are what a
    plain request gets from real sglang: zero retractions and cached tokens, null
    ``cached_tokens_details`` and ``dp_rank`` (one DP rank), wall-clock ``*_ts`` stamps."""
    now = time.time()
    tokens = req.max_new_tokens
    values = {"id": req.rid, "finish_reason": {"type": "length", "length": tokens},
              "prompt_tokens": req.prompt_tokens, "completion_tokens": tokens, "weight_version": "default",
              "num_retractions": 0, "reasoning_tokens": 0, "cached_tokens": 0, "cached_tokens_details": None,
              "dp_rank": None, "queue_time": 0.0, "e2e_latency": now - req.created,
              "request_received_ts": req.created, "api_server_dispatch_finish_ts": req.created,
              "response_sent_to_client_ts": now, "request_finished_ts": now,
              "decode_throughput": (tokens - 1) / max(now - req.created, 1e-6)}
    info = {key: values.get(key) for key in answer.meta}
    info.update(meta)
    parts = {"text": text, "output_ids": list(range(tokens)), "meta_info": info}
    return {key: parts.get(key) for key in answer.top}


def final_response(req: GenerationRequest, text: str, meta: dict, answer=None) -> dict:
    """The non-streaming response body (``/generate``: as :func:`generate_body` when the
    release's answer keys are given)."""
    usage = {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.max_new_tokens,
             "total_tokens": req.prompt_tokens + req.max_new_tokens}
    if req.endpoint == "/generate" and answer is not None and answer.top:
        return generate_body(req, text, meta, answer)
    if req.endpoint == "/generate":
        info = {"id": req.rid, "prompt_tokens": req.prompt_tokens, "completion_tokens": req.max_new_tokens,
                "finish_reason": {"type": "length", "length": req.max_new_tokens}}
        info.update(meta)
        return {"text": text, "meta_info": info}
    base = {"id": req.rid, "created": int(req.created), "model": "twin-synthetic", "usage": usage,
            "sglang_twin": meta}
    if req.endpoint == "/v1/completions":
        return dict(base, object="text_completion",
                    choices=[{"index": 0, "text": text, "finish_reason": "length"}])
    return dict(base, object="chat.completion",
                choices=[{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}])
