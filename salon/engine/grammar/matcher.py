"""A request's grammar state: which tokens may come next, advanced over the tokens the request keeps.

The state is a function of the request's output tokens only (never of its batch, its chunks or its cache
hits): the engine advances it once per kept token, in order, and over a failover's resumed tokens when the
request is added.
"""

from __future__ import annotations

import torch


class RequestGrammar:
    def __init__(self, compiled, vocab_size: int) -> None:
        import xgrammar

        self._matcher = xgrammar.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.num_accepted_tokens = 0

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into bitmask[row] (int32 words, bit t % 32 of word t // 32 = token t)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        """Advance over a kept token; False (state unchanged) when the grammar does not allow it."""
        if not self._matcher.accept_token(token_id):
            return False
        self.num_accepted_tokens += 1
        return True

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted: the reply is over."""
        return self._matcher.is_terminated()
