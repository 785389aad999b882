"""The bounds of a generate request's controls that the gateway (HTTP and gRPC) and the engine both check,
so that a request the gateway lets through is never refused by an engine for the same field.

    logit_bias                  at most MAX_LOGIT_BIAS entries, each within ±MAX_LOGIT_BIAS_VALUE (OpenAI's)
    priority                    within ±MAX_PRIORITY
    cache_salt                  at most MAX_CACHE_SALT_BYTES of UTF-8
    chat_template_kwargs        at most MAX_CHAT_TEMPLATE_KWARGS_BYTES as JSON
"""

from __future__ import annotations

MAX_LOGIT_BIAS = 300
MAX_LOGIT_BIAS_VALUE = 100.0
MAX_PRIORITY = 1_000_000
MAX_CACHE_SALT_BYTES = 256
MAX_CHAT_TEMPLATE_KWARGS_BYTES = 4096
