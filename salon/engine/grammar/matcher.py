"""A request's grammar state: which tokens may come next, advanced over the tokens the request keeps.

The state is a function of the request's output tokens only (never of its batch, its chunks or its cache
hits): the engine advances it once per kept token, in order, and over a failover's resumed tokens when the
request is added.

Speculative drafts are looked at without being kept: `draft_prefix` (the scheduler) and `fill_draft_bitmasks`
(the model runner) advance the matcher through a chunk's drafts and roll it back by as many tokens (xgrammar's
rollback), so the state after either is the state before it.
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

    def draft_prefix(self, draft_token_ids) -> int:
        """How many leading drafts the grammar allows in a row: a draft it rejects could never be accepted,
        nor anything after it, nor anything after the stop token that ends the grammar. State unchanged."""
        n = 0
        for token_id in draft_token_ids:
            if self._matcher.is_terminated() or not self._matcher.accept_token(token_id):
                break
            n += 1
        if n:
            self._matcher.rollback(n)
        return n

    def fill_draft_bitmasks(self, bitmask: torch.Tensor, row: int, draft_token_ids) -> None:
        """Write the masks of a verified chunk's rows into bitmask[row : row + len(drafts) + 1]: row j gets the
        mask of the state after drafts [0, j) (the row samples output position i + j, which follows those
        drafts whenever its token is kept). The drafts are those draft_prefix allowed; a row after one the
        grammar does not take (or after the stop token) repeats the row before it: its token is never kept.
        State unchanged."""
        advanced = 0
        self._matcher.fill_next_token_bitmask(bitmask, row)
        for j, token_id in enumerate(draft_token_ids, start=1):
            if advanced == j - 1 and not self._matcher.is_terminated() and self._matcher.accept_token(token_id):
                advanced = j
                if not self._matcher.is_terminated():
                    self._matcher.fill_next_token_bitmask(bitmask, row + j)
                    continue
            bitmask[row + j] = bitmask[row + j - 1]
        if advanced:
            self._matcher.rollback(advanced)

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
