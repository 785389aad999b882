"""OpenTelemetry GenAI semantic-convention attributes on a turn's span, for both fronts.

request   gen_ai.operation.name, gen_ai.provider.name (and the older gen_ai.system), gen_ai.request.model,
          gen_ai.request.{max_tokens, temperature, top_p, top_k, presence_penalty,
          frequency_penalty, seed, stop_sequences, choice.count}
response  gen_ai.response.{id, model, finish_reasons}, gen_ai.usage.{input_tokens, output_tokens},
          gen_ai.server.time_to_first_token (seconds), salon.usage.cached_tokens.{device, host}
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.trace import Span

from salon.api.chat.v1 import chat_pb2

PROVIDER = "salon"


def set_request_attributes(
    span: Span, operation: str, model: str, sampling: chat_pb2.SamplingParams, num_choices: int = 1
) -> None:
    if not span.is_recording():
        return
    attributes = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,
        "gen_ai.request.model": model,
        "gen_ai.request.choice.count": num_choices,
    }
    if "temperature" not in sampling.model_default_fields:  # else the model's default, chosen by the engine
        attributes["gen_ai.request.temperature"] = sampling.temperature
    if sampling.max_new_tokens:
        attributes["gen_ai.request.max_tokens"] = sampling.max_new_tokens
    if sampling.top_p:
        attributes["gen_ai.request.top_p"] = sampling.top_p
    if sampling.top_k:
        attributes["gen_ai.request.top_k"] = sampling.top_k
    if sampling.presence_penalty:
        attributes["gen_ai.request.presence_penalty"] = sampling.presence_penalty
    if sampling.frequency_penalty:
        attributes["gen_ai.request.frequency_penalty"] = sampling.frequency_penalty
    if sampling.HasField("seed"):
        attributes["gen_ai.request.seed"] = sampling.seed
    if sampling.stop_strings:
        attributes["gen_ai.request.stop_sequences"] = list(sampling.stop_strings)
    span.set_attributes(attributes)


def set_response_attributes(
    span: Span,
    response_id: str,
    model: str,
    finish_reasons: Sequence[str],
    finals: Sequence[chat_pb2.GenerateFinal],
    ttft_s: float | None,
) -> None:
    if not span.is_recording() or not finals:
        return
    usage = finals[0].usage
    attributes = {
        "gen_ai.response.id": response_id,
        "gen_ai.response.model": model,
        "gen_ai.response.finish_reasons": list(finish_reasons),
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": sum(f.usage.generated_tokens for f in finals),
        "salon.usage.cached_tokens.device": usage.cached_tokens.device,
        "salon.usage.cached_tokens.host": usage.cached_tokens.host,
        "salon.engine_id": finals[0].engine_id,
    }
    if ttft_s is not None:
        attributes["gen_ai.server.time_to_first_token"] = ttft_s
    span.set_attributes(attributes)
