"""Sequence packing, shared prompts and token-budget (dynamic) micro-batching.

Packed rows lay several (prompt + response) sequences end to end under a token budget, with
position ids restarting per sequence and attention kept per sequence: a block-causal mask for
sdpa/eager, sequence boundaries (`cu_seq_lens_q`) for varlen kernels. `pack_shared` lays a GRPO
group's prompt down once and its responses after it as branches under a tree mask
(`rlvr_segments`), each branch starting with the prompt's last token so every response token keeps
its target. Only positions that predict a response token are projected to the vocabulary
(`predict_mask`); `unpack` returns results in the `[B, T]` layout the losses take. Why and how:
docs/trainer.md ("Packing, micro-batches and ranks", "A group's prompt runs once").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlvr.trainer.batch import TrainBatch
from rlvr.trainer.typed_torch import int_list

# (start, end, mask): a slice of a packed row with its own attention. mask None: causal on the
# slice; else a [1, 1, L, L] boolean tree mask (a shared prompt and its branches).
Segment = tuple[int, int, torch.Tensor | None]

VARLEN_IMPLEMENTATIONS = (
    "rlvr_packed",
    "flash_attention_2",
    "flash_attention_3",
    "flash_attention_4",
    "kernels-community/flash-attn",
)


@dataclass(slots=True)
class MicroBatch:
    """One forward pass worth of sequences, packed or padded.

    `seq_index[i]` is the row in the source `TrainBatch` of this micro-batch's sequence i;
    `out_rows`/`out_cols` say where each kept position lands in the `[b, T]` output.
    """

    input_ids: torch.Tensor  # [R, N]
    position_ids: torch.Tensor  # [R, N]
    attention_mask: torch.Tensor | None  # [R, 1, N, N] block-causal, or None (causal / flash)
    predict_mask: torch.Tensor  # [R, N] bool: next token is a response token
    targets: torch.Tensor  # [K] the response token predicted at each kept position
    out_rows: torch.Tensor  # [K] sequence index within the micro-batch
    out_cols: torch.Tensor  # [K] response token index
    seq_index: torch.Tensor  # [b] rows of the source batch
    width: int  # T of this micro-batch: its longest response
    packed: bool
    num_tokens: int  # real (non-padding) tokens: what tokens/s counts
    cu_seqlens: torch.Tensor | None = None  # [n+1] int32 sequence starts (varlen attention)
    max_seqlen: int = 0
    segments: list[Segment] | None = None  # shared-prompt layout: attention per segment

    @property
    def num_seqs(self) -> int:
        return int(self.seq_index.numel())

    def to(self, device: torch.device) -> MicroBatch:
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return t.to(device, non_blocking=True) if t is not None else None

        return MicroBatch(
            input_ids=self.input_ids.to(device),
            position_ids=self.position_ids.to(device),
            attention_mask=mv(self.attention_mask),
            predict_mask=self.predict_mask.to(device),
            targets=self.targets.to(device),
            out_rows=self.out_rows.to(device),
            out_cols=self.out_cols.to(device),
            seq_index=self.seq_index,
            width=self.width,
            packed=self.packed,
            num_tokens=self.num_tokens,
            cu_seqlens=mv(self.cu_seqlens),
            max_seqlen=self.max_seqlen,
            segments=[(a, b, mv(m)) for a, b, m in self.segments] if self.segments is not None else None,
        )

    def model_kwargs(self) -> dict[str, torch.Tensor | int | list[Segment] | None]:
        """What a transformers forward takes for this layout (varlen arguments when packed)."""
        kwargs: dict[str, torch.Tensor | int | list[Segment] | None] = {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "attention_mask": self.attention_mask,
        }
        if self.segments is not None:
            kwargs["rlvr_segments"] = self.segments  # read by rlvr_packed
        elif self.cu_seqlens is not None:
            kwargs |= {
                "cu_seq_lens_q": self.cu_seqlens,
                "cu_seq_lens_k": self.cu_seqlens,
                "max_length_q": self.max_seqlen,
                "max_length_k": self.max_seqlen,
            }
        return kwargs


def first_fit_decreasing(lengths: Sequence[int], *, budget: int) -> list[list[int]]:
    """Bin indices so each bin's total length stays within `budget` (dynamic batching).

    Longest first, each into the first bin with room; a sequence longer than the budget
    gets a bin of its own rather than being dropped. Deterministic (ties keep index order),
    and each bin lists its indices ascending.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for k, load in enumerate(loads):
            if load + lengths[i] <= budget:
                bins[k].append(i)
                loads[k] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return [sorted(b) for b in bins]


def balance_partition(lengths: Sequence[int], *, parts: int) -> list[list[int]]:
    """Split indices into `parts` groups of near-equal total length (greedy LPT).

    Used to share a mini-batch between data-parallel ranks: the gradient does not depend
    on who gets which sequence (global loss denominators), so we balance tokens instead.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for i in order:
        k = min(range(parts), key=lambda p: (loads[p], len(groups[p]), p))
        groups[k].append(i)
        loads[k] += lengths[i]
    return [sorted(g) for g in groups]


def block_causal_mask(seq_lens: Sequence[int], *, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """[1, 1, N, N] mask letting each token see only earlier tokens of its own sequence.

    `dtype=torch.bool`: True where attention is allowed (sdpa). A float dtype gives the
    additive form, 0 allowed and the dtype's min elsewhere (eager attention).
    """
    seg = torch.repeat_interleave(torch.arange(len(seq_lens)), torch.as_tensor(list(seq_lens), dtype=torch.long))
    n = int(seg.numel())
    allowed = (seg[:, None] == seg[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()
    if dtype == torch.bool:
        return allowed[None, None]
    mask = torch.zeros(n, n, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def pack_sequences(
    batch: TrainBatch, index: Sequence[int], *, attn_implementation: str = "sdpa", mask_dtype: torch.dtype | None = None
) -> MicroBatch:
    """Lay the sequences `index` of `batch` end to end in one row (see the module docstring)."""
    idx = list(index)
    seqs = [batch.tokens(i) for i in idx]
    lens = [int(s.numel()) for s in seqs]
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    seq_of = torch.full_like(ids, -1)
    col_of = torch.full_like(ids, -1)
    start = 0
    for k, i in enumerate(idx):
        p, r = int(batch.prompt_lens[i]), int(batch.response_lens[i])
        # position p-1+j predicts response token j
        seq_of[0, start + p - 1 : start + p - 1 + r] = k
        col_of[0, start + p - 1 : start + p - 1 + r] = torch.arange(r)
        start += lens[k]
    mb = _finish(batch, idx, ids, pos, None, seq_of, col_of, packed=True, real=sum(lens))
    if attn_implementation in VARLEN_IMPLEMENTATIONS:
        mb.cu_seqlens = torch.tensor([0, *int_list(torch.tensor(lens).cumsum(0))], dtype=torch.int32)
        mb.max_seqlen = max(lens)
    else:
        dtype = mask_dtype or (torch.bool if attn_implementation == "sdpa" else torch.float32)
        mb.attention_mask = block_causal_mask(lens, dtype=dtype)
    return mb


def pad_sequences(batch: TrainBatch, index: Sequence[int]) -> MicroBatch:
    """One right-padded row per sequence: the plain layout, and the reference for packing.

    No attention mask is needed: with right padding and causal attention, real tokens never
    see the padding after them, and padded positions are never read.
    """
    idx = list(index)
    lens = [int(batch.seq_lens[i]) for i in idx]
    n = max(lens)
    ids = torch.full((len(idx), n), batch.pad_id, dtype=torch.long)
    seq_of = torch.full_like(ids, -1)
    col_of = torch.full_like(ids, -1)
    for k, i in enumerate(idx):
        ids[k, : lens[k]] = batch.tokens(i)
        p, r = int(batch.prompt_lens[i]), int(batch.response_lens[i])
        seq_of[k, p - 1 : p - 1 + r] = k
        col_of[k, p - 1 : p - 1 + r] = torch.arange(r)
    pos = torch.arange(n).expand(len(idx), n).clone()
    return _finish(batch, idx, ids, pos, None, seq_of, col_of, packed=False, real=sum(lens))


def _finish(
    batch: TrainBatch,
    idx: list[int],
    ids: torch.Tensor,
    pos: torch.Tensor,
    mask: torch.Tensor | None,
    seq_of: torch.Tensor,
    col_of: torch.Tensor,
    *,
    packed: bool,
    real: int,
) -> MicroBatch:
    predict = seq_of >= 0
    next_ids = torch.roll(ids, shifts=-1, dims=1)
    width = max([1, *(int(batch.response_lens[i]) for i in idx)])
    return MicroBatch(
        input_ids=ids,
        position_ids=pos,
        attention_mask=mask,
        predict_mask=predict,
        targets=next_ids[predict],
        out_rows=seq_of[predict],
        out_cols=col_of[predict],
        seq_index=torch.tensor(idx, dtype=torch.long),
        width=width,
        packed=packed,
        num_tokens=real,
    )


def make_micro_batches(
    batch: TrainBatch,
    *,
    packing: bool,
    max_tokens: int,
    micro_batch_size: int,
    attn_implementation: str = "sdpa",
    share_prompts: bool = False,
) -> list[MicroBatch]:
    """Packed micro-batches under a token budget (first-fit-decreasing), or padded ones of
    `micro_batch_size` sequences in batch order. `share_prompts` (packed rows under
    `rlvr_packed` only) runs each group's prompt once (see the module docstring)."""
    if len(batch) == 0:
        return []
    if packing and share_prompts and attn_implementation == SHARED_PREFIX_IMPLEMENTATION:
        units = prompt_units(batch, range(len(batch)), budget=max_tokens)
        cost = [unit_tokens(batch, u) for u in units]
        return [pack_shared(batch, [units[k] for k in b]) for b in first_fit_decreasing(cost, budget=max_tokens)]
    if packing:
        lens = [int(x) for x in batch.seq_lens]
        return [
            pack_sequences(batch, b, attn_implementation=attn_implementation)
            for b in first_fit_decreasing(lens, budget=max_tokens)
        ]
    rows = list(range(len(batch)))
    return [pad_sequences(batch, rows[i : i + micro_batch_size]) for i in range(0, len(rows), micro_batch_size)]


# -- shared prompts ------------------------------------------------------------------------
SHARED_PREFIX_IMPLEMENTATION = "rlvr_packed"  # the one attention that reads `rlvr_segments`


def shared_len(batch: TrainBatch, unit: Sequence[int]) -> int:
    """Tokens laid down once for a unit: all of the prompt but its last token (which each branch
    repeats, to predict its first response token); 0 for a unit of one sequence."""
    return int(batch.prompt_lens[unit[0]]) - 1 if len(unit) > 1 else 0


def unit_tokens(batch: TrainBatch, unit: Sequence[int]) -> int:
    """Tokens a unit costs in a packed row."""
    shared = shared_len(batch, unit)
    return shared + sum(int(batch.seq_lens[i]) - shared for i in unit)


def prompt_units(batch: TrainBatch, index: Sequence[int], *, budget: int) -> list[list[int]]:
    """The rows of `index` grouped by identical prompt ids (first appearance order), each group
    split so a unit fits `budget` where it can (a longer single sequence is a unit of its own)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in index:
        prompt = batch.input_ids[i, : int(batch.prompt_lens[i])]
        groups.setdefault(tuple(int_list(prompt)), []).append(int(i))
    units: list[list[int]] = []
    for rows in groups.values():
        unit: list[int] = []
        for i in rows:
            if unit and unit_tokens(batch, [*unit, i]) > budget:
                units.append(unit)
                unit = []
            unit.append(i)
        units.append(unit)
    return units


def rank_share(batch: TrainBatch, *, parts: int, rank: int, budget: int, share_prompts: bool) -> list[int]:
    """This data-parallel rank's rows, balanced by tokens; with `share_prompts` a prompt's group
    stays on one rank (where its prompt runs once), unless there are fewer groups than ranks."""
    if share_prompts:
        units = prompt_units(batch, range(len(batch)), budget=budget)
        if len(units) >= parts:
            mine = balance_partition([unit_tokens(batch, u) for u in units], parts=parts)[rank]
            return sorted(i for k in mine for i in units[k])
    return balance_partition([int(x) for x in batch.seq_lens], parts=parts)[rank]


def tree_mask(shared: int, branch_lens: Sequence[int]) -> torch.Tensor:
    """[1, 1, L, L] boolean: the shared prompt sees itself causally; each branch sees the shared
    prompt and itself causally, never another branch."""
    seg = torch.repeat_interleave(
        torch.arange(-1, len(branch_lens)), torch.as_tensor([shared, *branch_lens], dtype=torch.long)
    )
    n = int(seg.numel())
    same = (seg[:, None] == seg[None, :]) | (seg[None, :] == -1)
    return (same & torch.ones(n, n, dtype=torch.bool).tril())[None, None]


def pack_shared(batch: TrainBatch, units: Sequence[Sequence[int]]) -> MicroBatch:
    """One packed row of units, each its shared prompt once and then every sequence's own tokens
    (see the module docstring); attention goes by `segments`."""
    idx = [i for unit in units for i in unit]
    ids: list[torch.Tensor] = []
    pos: list[torch.Tensor] = []
    seq_of: list[torch.Tensor] = []
    col_of: list[torch.Tensor] = []
    segments: list[Segment] = []
    start, k = 0, 0
    for unit in units:
        shared = shared_len(batch, unit)
        unit_start = start
        if shared:
            ids.append(batch.tokens(unit[0])[:shared])
            pos.append(torch.arange(shared))
            seq_of.append(torch.full((shared,), -1))
            col_of.append(torch.full((shared,), -1))
            start += shared
        branch_lens: list[int] = []
        for i in unit:
            own = batch.tokens(i)[shared:]
            n, p, r = int(own.numel()), int(batch.prompt_lens[i]), int(batch.response_lens[i])
            ids.append(own)
            pos.append(torch.arange(shared, shared + n))
            rows, cols = torch.full((n,), -1), torch.full((n,), -1)
            first = p - 1 - shared  # own position predicting response token 0
            rows[first : first + r] = k
            cols[first : first + r] = torch.arange(r)
            seq_of.append(rows)
            col_of.append(cols)
            branch_lens.append(n)
            start += n
            k += 1
        segments.append((unit_start, start, tree_mask(shared, branch_lens) if len(unit) > 1 else None))
    mb = _finish(
        batch,
        idx,
        torch.cat(ids)[None],
        torch.cat(pos)[None],
        None,
        torch.cat(seq_of)[None],
        torch.cat(col_of)[None],
        packed=True,
        real=sum(int(batch.seq_lens[i]) for i in idx),
    )
    mb.segments = segments
    return mb


def unpack(values: torch.Tensor, mb: MicroBatch, *, fill: float = 0.0) -> torch.Tensor:
    """Flat per-kept-position values [K] -> padded [b, width] response layout (differentiable)."""
    out = values.new_full((mb.num_seqs, mb.width), fill)
    return out.index_put((mb.out_rows, mb.out_cols), values)


def slice_rows(t: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """A `[B, T]` batch field restricted to this micro-batch: `[b, width]`."""
    return t[mb.seq_index.to(t.device)][:, : mb.width]
