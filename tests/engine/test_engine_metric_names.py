"""Every way a salon request can finish has vLLM's finished_reason value (the step loop labels each
finished request with it: a reason without one would stop the loop)."""

from salon.engine.metrics import VLLM_FINISHED_REASONS
from salon.engine.request import FinishReason


def test_every_finish_reason_has_a_vllm_value():
    assert set(VLLM_FINISHED_REASONS) == {reason.value for reason in FinishReason}
    assert VLLM_FINISHED_REASONS == {
        "stop_token": "stop",
        "stop_string": "stop",
        "length": "length",
        "context_full": "length",
        "aborted": "abort",
        "error": "error",
    }
