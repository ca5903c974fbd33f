"""A driver that calls a Model Runner V2 logits processor as vLLM's runner and sampler do, on a tiny Llama.

Read from vLLM 0.32.0 (`v1/worker/gpu/model_runner.py`, `states.py`, `sample/sampler.py`; 0.33.0's are
the same for these calls): a request enters a slot popped from a free list (`RequestState.add_request`:
`prompt_len` / `prefill_len` written on the host, the prefill ids and `total_len` staged), then the
sampler's `add_request(slot, params)` asks each processor whether it takes the request; the staged
writes are applied once per step, the processors' `apply_staged_writes` after the runner's; a step
builds a `LogitsContext` (rows in the step's own order, `idx_mapping_np` on the host,
`seq_lens_upper_bound_np` = computed + scheduled) and calls `apply(logits, ctx)` on a float32 copy
when some request of the step needs processing; the token drawn is written at `total_len`, which
grows. Finished and preempted requests just leave their slot (no call); a preempted request comes
back with its prompt and its output so far as the prefill (`prefill_len` > `prompt_len`). A prompt
may be prefilled in chunks: each chunk gets a logits row, and only the last one's token is kept.

The model's logits come from transformers (the whole history recomputed per step). Greedy requests
(`temperature=0`) take the argmax; sampled ones (`temperature=1`) draw `torch.multinomial` from the
softmax with a generator of their own, as hfbridge's `generate` does with `generator=`. Several
processors may be driven at once, one per tensor-parallel rank, each with its own request state;
they must give the same scores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

try:  # vLLM's own dataclasses where vLLM is installed; the same fields otherwise
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState
except ImportError:  # pragma: no cover - depends on what is installed
    LogitsContext = LogitsProcRequestState = SimpleNamespace  # type: ignore[misc, assignment]


class DeviceBuffer:
    """vLLM's `StagedWriteTensor` as a processor sees it: `.gpu`; writes staged, then applied once per step."""

    def __init__(self, tensor: torch.Tensor):
        self.gpu = tensor
        self._staged: list[tuple[int, int, list[int]]] = []

    def stage_write(self, index: int, start: int, values: list[int]) -> None:
        self._staged.append((index, start, list(values)))

    def stage_write_elem(self, index: int, value: int) -> None:
        self._staged.append((index, -1, [value]))

    def apply_write(self) -> None:
        for index, start, values in self._staged:
            if start < 0:
                self.gpu[index] = values[0]
            else:
                self.gpu[index, start:start + len(values)] = torch.tensor(values, dtype=self.gpu.dtype)
        self._staged.clear()


class HostBuffer:
    """vLLM's `UvaBackedTensor`: `.np` on the host is the truth, `.gpu` a copy made once per step."""

    def __init__(self, slots: int):
        self.np = np.zeros(slots, dtype=np.int32)
        self.gpu = torch.from_numpy(self.np.copy())

    def copy_to_uva(self) -> None:
        self.gpu = torch.from_numpy(self.np.copy())


@dataclasses.dataclass
class Request:
    name: str
    prompt: list[int]
    params: Any  # vLLM's SamplingParams, or anything with its fields
    max_tokens: int
    stops: tuple[int, ...]
    generator: torch.Generator | None = None  # sampled requests: their draw
    output: list[int] = dataclasses.field(default_factory=list)
    slot: int | None = None
    computed: int = 0  # tokens whose KV the runner holds
    chunk: int | None = None  # prefill at most this many tokens per step

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_tokens or bool(self.output and self.output[-1] in self.stops)


class Runner:
    """Model Runner V2's calls into `processors` (one per tensor-parallel rank); see the module.

    `make(state)` builds a rank's processor from its `LogitsProcRequestState`.
    """

    def __init__(self, make: Callable[[Any], Any], model: Any, *, vocab_size: int, slots: int = 4,
                 max_model_len: int = 64, ranks: int = 1, order_seed: int = 0):
        self.model = model
        self.vocab_size = vocab_size
        self.states = [LogitsProcRequestState(
            device=torch.device("cpu"), max_num_reqs=slots, vocab_size=vocab_size,
            all_token_ids=DeviceBuffer(torch.zeros(slots, max_model_len, dtype=torch.int32)),
            prompt_len=HostBuffer(slots), prefill_len=HostBuffer(slots),
            total_len=DeviceBuffer(torch.zeros(slots, dtype=torch.int32))) for _ in range(ranks)]
        self.processors = [make(state) for state in self.states]
        self.free = list(range(slots))
        self.needs = np.zeros(slots, dtype=bool)
        self.running: list[Request] = []
        self.order = np.random.default_rng(order_seed)
        self.log: list[dict[str, Any]] = []  # per step: the slots in order, the logits before and after
        self.added: list[tuple[str, int, int, int]] = []  # (name, slot, prompt_len, prefill_len)

    # -- the scheduler's side ---------------------------------------------------------------------

    def add(self, request: Request) -> None:
        """`RequestState.add_request`, then the sampler's `add_request`: the slot recycled, no removal before."""
        slot = self.free.pop()
        tokens = request.prompt + request.output  # with output: resumed after preemption
        for state, processor in zip(self.states, self.processors):
            state.prompt_len.np[slot] = len(request.prompt)
            state.prefill_len.np[slot] = len(tokens)
            state.total_len.stage_write_elem(slot, len(tokens))
            state.all_token_ids.stage_write(slot, 0, tokens)
            self.needs[slot] = processor.add_request(slot, request.params)
        request.slot, request.computed = slot, 0
        self.added.append((request.name, slot, len(request.prompt), len(tokens)))
        self.running.append(request)

    def leave(self, request: Request) -> None:
        """A request finishes or is preempted: its slot goes back to the free list; the processors hear nothing."""
        self.running.remove(request)
        self.free.append(request.slot)
        request.slot = None

    def run(self, waiting: list[Request], *, preempt: dict[str, int] | None = None) -> None:
        """Run `waiting` to the end, admitting requests as slots free up; `preempt[name] = n`: preempt after n tokens."""
        waiting = list(waiting)
        preempt = dict(preempt or {})
        while waiting or self.running:
            while waiting and self.free:
                self.add(waiting.pop(0))
            self.step()
            for request in list(self.running):
                if request.done:
                    self.leave(request)
                elif preempt.get(request.name) == len(request.output):
                    del preempt[request.name]
                    self.leave(request)
                    waiting.insert(0, request)

    # -- one step, as `GPUModelRunner.execute_model` and `Sampler.__call__` make it ---------------------

    def step(self) -> None:
        for state, processor in zip(self.states, self.processors):
            state.prompt_len.copy_to_uva()
            state.prefill_len.copy_to_uva()
            state.total_len.apply_write()
            state.all_token_ids.apply_write()
            getattr(processor, "apply_staged_writes", lambda: None)()  # vLLM's interface; `Slots` stages nothing
        order = [self.running[i] for i in self.order.permutation(len(self.running))]  # rows reordered every step
        state = self.states[0]
        seq_lens = []
        for request in order:
            prefill = int(state.prefill_len.np[request.slot])
            if request.computed < prefill:  # prefill, whole or one chunk
                seq_lens.append(min(prefill, request.computed + (request.chunk or prefill)))
            else:
                seq_lens.append(request.computed + 1)
        slots = np.array([request.slot for request in order], dtype=np.int32)
        logits = torch.stack([self._model_logits(request.slot, length) for request, length in zip(order, seq_lens)])
        ctx = LogitsContext(
            expanded_idx_mapping=torch.from_numpy(slots).long(), idx_mapping=torch.from_numpy(slots).long(),
            idx_mapping_np=slots, expanded_local_pos=torch.zeros(len(order), dtype=torch.int32),
            input_ids=torch.stack([state.all_token_ids.gpu[r.slot, n - 1] for r, n in zip(order, seq_lens)]),
            pos=torch.tensor(seq_lens) - 1, seq_lens_upper_bound_np=np.array(seq_lens, dtype=np.int32))
        processed = logits
        if np.any(self.needs[slots]):  # `Sampler.apply_sampling_params`: a float32 copy, then the processors
            results = [processor.apply(logits.clone(), ctx) for processor in self.processors]
            for other in results[1:]:
                assert torch.equal(other, results[0]), "tensor-parallel ranks disagree"
            processed = results[0]
        self.log.append({"slots": slots.tolist(), "seq_lens": seq_lens, "raw": logits, "processed": processed})
        for row, (request, length) in enumerate(zip(order, seq_lens)):
            prefill = int(state.prefill_len.np[request.slot])
            request.computed = length
            if length < prefill:
                continue  # a chunk before the last: its token is dropped
            token = self._choose(request, processed[row])
            for each in self.states:  # `post_update`: the token at `total_len`, which grows
                total = int(each.total_len.gpu[request.slot])
                each.all_token_ids.gpu[request.slot, total] = token
                each.total_len.gpu[request.slot] = total + 1
            request.output.append(token)

    def _model_logits(self, slot: int, length: int) -> torch.Tensor:
        ids = self.states[0].all_token_ids.gpu[slot, :length].long()[None]  # [1, T]
        with torch.no_grad():
            return self.model(ids).logits[0, -1].float()  # [V]

    def _choose(self, request: Request, scores: torch.Tensor) -> int:
        if request.generator is None:
            return int(scores.argmax())
        probs = torch.softmax(scores[None], dim=-1)  # [1, V]
        return int(torch.multinomial(probs, 1, generator=request.generator))
