"""An int8 recipe's measured quality figures and the gates a small margin past them (test_model_quality.py,
test_model_smollm2.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Int8Gates:
    """An activation recipe's measured figures; each gate is a small margin past its figure."""

    ppl: float  # perplexity on gpl-3.txt
    agreeing_steps: int  # teacher-forced top-1 equal to float32's
    mean_logprob_error: float  # mean |log-prob error| of float32's top-1 token

    @property
    def max_ppl(self) -> float:
        return self.ppl + 0.004

    @property
    def min_agreeing_steps(self) -> int:
        return self.agreeing_steps - 1

    @property
    def max_mean_logprob_error(self) -> float:
        return self.mean_logprob_error + 0.001
