"""Sampling a step's rows where the logits are (device_sampling.py's ops), with one copy back per step.

The host sampler (sampler.py) copies every row that is not a plain argmax to the host: 1 MB of logits per
row for Gemma's vocabulary. Here the rows stay on the device; what crosses is, per step, one host-to-device
copy of the rows' parameters and of the token counts' increments, and one device-to-host copy of the ids
(with the asked-for log-probs packed in the same tensor).

Per request the sampler keeps, on the device:
- its generator, seeded with the request's seed (Request.generator.initial_seed()) and advanced past the
  tokens the request already had when it was first sampled here (a failover resume's tokens each used one
  draw); every sampled row takes one float64 uniform from it, in row order, so a row's draw never depends
  on its batch;
- nothing for a logit bias or min_tokens: each step uploads the (row, token, bias) and (row, token) masks of
  its rows with the rest of its parameters, from SamplingParams.masked_token_ids at each row's output position;
- with penalties, a row of a counts pool: how often each token occurs in the output (int32) and whether it
  occurs in the prompt (bool). The counts follow the request's output_token_ids: each step adds the tokens
  appended since the last step, so nothing is rebuilt from the Python lists after the first time.
State lives as long as the request object does (a weak mapping; a collected request frees its pool row).

Speculative rows keep sampler.py's semantics: row j of a verified chunk counts the drafts [0, j) as output
tokens (DraftHistory) and takes the generator's next draw; `rewind` then leaves the generator as if only the
produced rows had drawn, so output position i gets the generator's i-th draw whether or not it was verified.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch

from salon.engine.batch import ScheduledChunk
from salon.engine.kv.kv_transfer import to_device
from salon.engine.request import Request
from salon.engine.worker.device_sampling import apply_penalties_rows, draw_rows, kept_weights, logprob_rows
from salon.engine.worker.sampler import SampledToken


@dataclass
class _RequestState:
    generator: torch.Generator | None
    slot: int | None = None  # its row of the counts pool (requests with penalties)
    counted: int = 0  # output tokens already added to its counts
    prompt_counted: bool = False


class CountsPool:
    """Rows of per-token counts on the device, one per request with penalties: output occurrences (int32)
    and prompt membership (bool). Grows by doubling; a freed row is reused (zeroed when taken)."""

    def __init__(self, vocab: int, device: torch.device) -> None:
        self.vocab, self.device = vocab, device
        self.output = torch.zeros((0, vocab), dtype=torch.int32, device=device)
        self.prompt = torch.zeros((0, vocab), dtype=torch.bool, device=device)
        self.free: list[int] = []

    def take(self) -> int:
        if not self.free:
            old = self.output.shape[0]
            new = max(4, 2 * old)
            self.output = torch.cat([self.output, self.output.new_zeros((new - old, self.vocab))])
            self.prompt = torch.cat([self.prompt, self.prompt.new_zeros((new - old, self.vocab))])
            self.free.extend(range(new - 1, old - 1, -1))
        slot = self.free.pop()
        self.output[slot].zero_()
        self.prompt[slot].zero_()
        return slot

    def release(self, slot: int) -> None:
        self.free.append(slot)


class DeviceSampler:
    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._states: weakref.WeakKeyDictionary[Request, _RequestState] = weakref.WeakKeyDictionary()
        self._pool: CountsPool | None = None

    def _state(self, request: Request, vocab: int) -> _RequestState:
        state = self._states.get(request)
        if state is None:
            generator = None
            if request.generator is not None:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(request.generator.initial_seed())
                for _ in request.output_token_ids:  # tokens it came with used one draw each
                    _uniform(generator, self.device)
            state = self._states[request] = _RequestState(generator)
        if request.sampling.has_penalties and state.slot is None:
            if self._pool is None or self._pool.vocab != vocab:
                self._pool = CountsPool(vocab, self.device)
            pool = self._pool
            state.slot = pool.take()
            weakref.finalize(request, pool.release, state.slot)
        return state

    def sample(
        self, logits: torch.Tensor, chunks: list[ScheduledChunk]
    ) -> tuple[list[SampledToken], list[torch.Generator | None], list[torch.Tensor | None]]:
        """logits f32[R, V] of the chunks' rows (each chunk: its draft rows, then its last row) -> one token per
        row, and per chunk its generator and, where it verified drafts, the generator's state before them."""
        vocab = logits.shape[-1]
        rows: list[tuple[Request, int, _RequestState]] = []  # (request, drafts before the row, state)
        generators: list[torch.Generator | None] = []
        before: list[torch.Tensor | None] = []
        for chunk in chunks:
            state = self._state(chunk.request, vocab)
            generators.append(state.generator)
            drafts = chunk.draft_token_ids
            before.append(state.generator.get_state() if drafts and state.generator is not None else None)
            rows.extend((chunk.request, j, state) for j in range(len(drafts) + 1))
        meta = _Metadata(rows, chunks)
        packed = meta.upload(self.device)
        logits = logits.float()
        if meta.mask_rows:  # sampler.apply_logit_masks: bias added in float32, then the masked tokens at -inf
            logits = logits.clone()
            rows_, tokens_ = packed.index("bias_rows"), packed.index("bias_tokens")
            logits[rows_, tokens_] = logits[rows_, tokens_] + packed.floats("bias_values").float()
            logits.index_put_((packed.index("masked_rows"), packed.index("masked_tokens")), _minus_inf(self.device))
        penalized = logits
        if meta.pen_rows:
            pool = self._pool
            slots, tokens = packed.index("count_slots"), packed.index("count_tokens")
            pool.prompt.index_put_((packed.index("prompt_slots"), packed.index("prompt_tokens")), _true(self.device))
            pool.output.index_put_((slots, tokens), _one(self.device), accumulate=True)
            row_slots = packed.index("row_slots")
            counts = pool.output.index_select(0, row_slots)
            counts.index_put_(
                (packed.index("draft_rows"), packed.index("draft_tokens")), _one(self.device), accumulate=True
            )
            seen = pool.prompt.index_select(0, row_slots) | (counts > 0)
            pen_rows = packed.index("pen_rows")
            rep, freq, pres = packed.floats("penalties").view(3, -1).float()
            penalized = logits.clone()
            penalized[pen_rows] = apply_penalties_rows(logits[pen_rows], rep, freq, pres, counts, seen)
        tokens = torch.argmax(penalized, dim=-1)
        if meta.sampled_rows:
            sampled_rows = packed.index("sampled_rows")
            temperature, top_p, log_min_p = packed.floats("sampling").view(3, -1)
            kept, weights = kept_weights(
                penalized[sampled_rows], temperature.float(), packed.index("top_k"), top_p, log_min_p.float()
            )
            u = torch.cat([_uniform(rows[r][2].generator, self.device) for r in meta.sampled_rows])
            tokens[sampled_rows] = draw_rows(kept, weights, u)
        return meta.download(tokens, logits, packed), generators, before

    def rewind(self, generator: torch.Generator | None, state: torch.Tensor | None, num_draws: int) -> None:
        """sampler.rewind_generator for a device generator: back to `state`, then num_draws draws."""
        if generator is None or state is None:
            return
        generator.set_state(state)
        for _ in range(num_draws):
            _uniform(generator, self.device)


def _uniform(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """f64[1]: the one draw in [0, 1) a sampled token uses (sampler.uniform, on the device)."""
    return torch.rand(1, generator=generator, dtype=torch.float64, device=device)


def _one(device: torch.device) -> torch.Tensor:
    return torch.ones((), dtype=torch.int32, device=device)


def _minus_inf(device: torch.device) -> torch.Tensor:
    return torch.full((), -math.inf, dtype=torch.float32, device=device)


def _true(device: torch.device) -> torch.Tensor:
    return torch.ones((), dtype=torch.bool, device=device)


class _Packed:
    """The step's host-built integer and float fields, moved to the device in one int64 copy."""

    def __init__(self, tensor: torch.Tensor, fields: dict[str, tuple[int, int]]) -> None:
        self.tensor, self.fields = tensor, fields

    def index(self, name: str) -> torch.Tensor:
        start, n = self.fields[name]
        return self.tensor[start : start + n]

    def floats(self, name: str) -> torch.Tensor:
        return self.index(name).view(torch.float64)


class _Metadata:
    """What the step's rows need on the device, built from host lists, and how the result comes back."""

    def __init__(self, rows: list[tuple[Request, int, _RequestState]], chunks: list[ScheduledChunk]) -> None:
        self.rows = rows
        self.chunks = chunks
        self.pen_rows = [r for r, (req, _, _) in enumerate(rows) if req.sampling.has_penalties]
        self.mask_rows = [r for r, (req, _, _) in enumerate(rows) if req.sampling.has_logit_masks]
        self.sampled_rows = [r for r, (req, _, _) in enumerate(rows) if not req.sampling.greedy]
        self.logprob_rows = [
            r for r, (req, _, _) in enumerate(rows) if req.sampling.return_logprobs or req.sampling.num_top_logprobs
        ]
        self.num_top = max((rows[r][0].sampling.num_top_logprobs for r in self.logprob_rows), default=0)

    def upload(self, device: torch.device) -> _Packed:
        ints: dict[str, list[int]] = {k: [] for k in _INT_FIELDS}
        floats: dict[str, list[float]] = {"penalties": [], "sampling": [], "bias_values": []}
        drafts_of = {id(c.request): c.draft_token_ids for c in self.chunks}
        synced: set[int] = set()
        for i, r in enumerate(self.pen_rows):
            request, j, state = self.rows[r]
            if id(request) not in synced:  # the tokens appended to its output since its counts were last updated
                synced.add(id(request))
                if not state.prompt_counted:
                    state.prompt_counted = True
                    prompt = sorted(set(request.prompt_token_ids))
                    ints["prompt_slots"] += [state.slot] * len(prompt)
                    ints["prompt_tokens"] += prompt
                new = request.output_token_ids[state.counted :]
                ints["count_slots"] += [state.slot] * len(new)
                ints["count_tokens"] += new
                state.counted += len(new)
            ints["row_slots"].append(state.slot)
            ints["pen_rows"].append(r)
            for token in drafts_of[id(request)][:j]:
                ints["draft_rows"].append(i)
                ints["draft_tokens"].append(token)
        for r in self.mask_rows:  # row j of a verified chunk counts the drafts [0, j) as output tokens
            request, j, _ = self.rows[r]
            params = request.sampling
            ints["bias_rows"] += [r] * len(params.logit_bias)
            ints["bias_tokens"] += [t for t, _ in params.logit_bias]
            floats["bias_values"] += [b for _, b in params.logit_bias]
            masked = params.masked_token_ids(request.num_output_tokens + j)
            ints["masked_rows"] += [r] * len(masked)
            ints["masked_tokens"] += list(masked)
        p = [self.rows[r][0].sampling for r in self.pen_rows]
        floats["penalties"] = [x.repetition_penalty for x in p] + [x.frequency_penalty for x in p]
        floats["penalties"] += [x.presence_penalty for x in p]
        s = [self.rows[r][0].sampling for r in self.sampled_rows]
        ints["sampled_rows"] = list(self.sampled_rows)
        ints["top_k"] = [x.top_k for x in s]
        floats["sampling"] = [x.temperature for x in s] + [x.top_p for x in s]
        floats["sampling"] += [math.log(x.min_p) if x.min_p > 0 else -math.inf for x in s]
        ints["logprob_rows"] = list(self.logprob_rows)
        fields: dict[str, tuple[int, int]] = {}
        host: list[int] = []
        for name, values in ints.items():
            fields[name] = (len(host), len(values))
            host += values
        parts = [torch.tensor(host, dtype=torch.int64)]
        offset = len(host)
        for name, values in floats.items():
            fields[name] = (offset, len(values))
            parts.append(torch.tensor(values, dtype=torch.float64).view(torch.int64))
            offset += len(values)
        return _Packed(to_device(torch.cat(parts), device), fields)

    def download(self, tokens: torch.Tensor, logits: torch.Tensor, packed: _Packed) -> list[SampledToken]:
        """The ids, and the asked-for log-probs in the same tensor, to the host in one copy."""
        if not self.logprob_rows:
            ids = tokens.tolist()
            return [SampledToken(t, None) for t in ids]
        rows = packed.index("logprob_rows")
        chosen, top_ids, top_values = logprob_rows(logits[rows], tokens[rows], self.num_top)
        parts = [tokens.double(), chosen.double(), top_ids.double().flatten(), top_values.double().flatten()]
        host = torch.cat(parts).tolist()
        num_rows, n, width = len(self.rows), len(self.logprob_rows), self.num_top
        ids = [int(t) for t in host[:num_rows]]
        out = [SampledToken(t, None) for t in ids]
        # host: ids [R] | chosen log-prob [n] | top ids [n, width] | top log-probs [n, width]
        top_ids, top_values = num_rows + n, num_rows + n + n * width
        for i, r in enumerate(self.logprob_rows):
            params = self.rows[r][0].sampling
            lp = host[num_rows + i] if params.return_logprobs else None
            k = params.num_top_logprobs
            a, b = top_ids + i * width, top_values + i * width
            top = tuple((int(t), v) for t, v in zip(host[a : a + k], host[b : b + k]))
            out[r] = SampledToken(ids[r], lp, top)
        return out


_INT_FIELDS = (
    "prompt_slots",
    "prompt_tokens",
    "count_slots",
    "count_tokens",
    "row_slots",
    "pen_rows",
    "draft_rows",
    "draft_tokens",
    "sampled_rows",
    "top_k",
    "logprob_rows",
    "bias_rows",
    "bias_tokens",
    "masked_rows",
    "masked_tokens",
)
