"""Train / eval samplers that visit examples in exactly the reference's order (R3.1-R3.6).

Ports of accelerate's `SeedableRandomSampler` and `BatchSamplerShard` and of transformers'
`LengthGroupedSampler` and `BatchRebalanceSampler`; neither library is imported here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any

import torch
from torch.utils.data import RandomSampler, Sampler


def _default_device_generator() -> torch.Generator:
    # accelerate builds the sampler's generator on the default device (CPU unless the user changed it).
    device = torch.get_default_device() if hasattr(torch, "get_default_device") else "cpu"
    return torch.Generator(device=device)


class SeedableRandomSampler(RandomSampler):
    """Random order `randperm(N, Generator(seed + epoch))`, the same on every process (R3.2).

    `seed=None` reads `torch.initial_seed()` now, as accelerate does when the loader is prepared. Like
    accelerate, a completed iteration advances the epoch by one; `set_epoch` overrides it.
    """

    def __init__(
        self,
        data_source: Sized,
        seed: int | None = None,
        *,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)
        self.initial_seed = seed if seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        # accelerate's generator, as C iterators (no Python frame per index: this sits on every sample the loader
        # fetches). `chain` calls each part's `iter()` only when it gets there, so the permutation is drawn when
        # the first index is asked for, and the epoch advances once it is exhausted, as the generator does.
        return itertools.chain(_Deferred(self._permutation), _Deferred(self._advance_epoch))

    def _permutation(self) -> list[int]:
        if self.generator is None:
            self.generator = _default_device_generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        return list(super().__iter__())

    def _advance_epoch(self) -> tuple[()]:
        self.set_epoch(self.epoch + 1)
        return ()

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of epoch `epoch` (seed `initial_seed + epoch`)."""
        self.epoch = epoch


def made_seedable(sampler: Any, data_seed: int | None) -> Any:
    """accelerate's `use_seedable_sampler` on a prepared loader: a torch `RandomSampler` becomes a
    `SeedableRandomSampler` over the same data (`data_seed`, else torch's initial seed); any other as it is."""
    if type(sampler) is not RandomSampler:
        return sampler
    return SeedableRandomSampler(
        sampler.data_source, seed=data_seed, replacement=sampler.replacement, num_samples=sampler._num_samples,
        generator=sampler.generator,
    )


class _Deferred:
    """An iterable over what `produce()` returns, called when iteration reaches it (`chain` asks late)."""

    __slots__ = ("produce",)

    def __init__(self, produce: Callable[[], Iterable[int]]) -> None:
        self.produce = produce

    def __iter__(self) -> Iterator[int]:
        return iter(self.produce())


def get_length_grouped_indices(
    lengths: Sequence[int],
    batch_size: int,
    mega_batch_mult: int | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Shuffle, sort each mega-batch by length (descending), longest example first (R3.5).

    Uses the global torch RNG when `generator` is None, as the reference does.
    """
    if mega_batch_mult is None:
        mega_batch_mult = min(len(lengths) // (batch_size * 4), 50)
        if mega_batch_mult == 0:  # tiny datasets
            mega_batch_mult = 1

    indices = torch.randperm(len(lengths), generator=generator)
    megabatch_size = mega_batch_mult * batch_size
    megabatches = [indices[i : i + megabatch_size].tolist() for i in range(0, len(lengths), megabatch_size)]
    megabatches = [sorted(megabatch, key=lambda i: lengths[i], reverse=True) for megabatch in megabatches]

    # Put the longest element of all first, so an out-of-memory error shows up at the first step.
    megabatch_maximums = [lengths[megabatch[0]] for megabatch in megabatches]
    max_idx = torch.argmax(torch.tensor(megabatch_maximums)).item()
    megabatches[0][0], megabatches[max_idx][0] = megabatches[max_idx][0], megabatches[0][0]
    return [i for megabatch in megabatches for i in megabatch]


def lengths_from_items(dataset: Any, model_input_name: str | None) -> list[int]:
    """`len(item[model_input_name])` for every item; items must be mappings holding that key."""
    model_input_name = model_input_name if model_input_name is not None else "input_ids"
    if not isinstance(dataset[0], Mapping) or model_input_name not in dataset[0]:
        raise ValueError(
            "Can only automatically infer lengths for datasets whose items are dictionaries with an "
            f"'{model_input_name}' key. The `train_sampling_strategy` 'group_by_length' / 'batch_rebalance' "
            "needs the length of each sample: give the dataset a `length_column_name` column, items holding "
            f"'{model_input_name}', or choose 'random'."
        )
    return [len(feature[model_input_name]) for feature in dataset]


class LengthGroupedSampler(Sampler[int]):
    """Groups examples of similar length while keeping some randomness (the reference's sampler)."""

    def __init__(
        self,
        batch_size: int,
        dataset: Any = None,
        lengths: Sequence[int] | torch.Tensor | None = None,
        model_input_name: str | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if dataset is None and lengths is None:
            raise ValueError("One of dataset and lengths must be provided.")
        self.batch_size = batch_size
        if lengths is None:
            lengths = lengths_from_items(dataset, model_input_name)
        elif isinstance(lengths, torch.Tensor):
            lengths = lengths.tolist()
        self.lengths = list(lengths)
        self.generator = generator

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=self.generator))


class BatchRebalanceSampler(Sampler[list[int]]):
    """Cost-balanced micro-batches per (rank, accumulation slot); a batch sampler (R3.6).

    Port of the reference's sampler: each chunk of `effective_batch_size` shuffled indices is sorted by
    length and split into `dp_size * grad_accum` contiguous groups of near-equal cost
    `bs * L + 0.001 * bs * L**2`; this rank yields its `grad_accum` groups per chunk.
    """

    QUADRATIC_COST_COEF = 0.001

    def __init__(
        self,
        lengths: Sequence[int],
        effective_batch_size: int,
        dp_size: int,
        grad_accum: int,
        shuffle: bool = True,
        seed: int = 42,
        rank: int = 0,
        drop_last: bool = True,
    ) -> None:
        if dp_size < 1 or grad_accum < 1 or effective_batch_size < dp_size * grad_accum:
            raise ValueError(
                f"BatchRebalanceSampler needs dp_size >= 1, grad_accum >= 1 and effective_batch_size >= "
                f"dp_size * grad_accum; got dp_size={dp_size}, grad_accum={grad_accum}, "
                f"effective_batch_size={effective_batch_size}."
            )
        self.lengths = list(lengths)
        self.effective_batch_size = effective_batch_size
        self.dp_size = dp_size
        self.grad_accum = grad_accum
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.drop_last = drop_last
        self.epoch = 0
        self.num_full_batches = len(self.lengths) // effective_batch_size
        self.remainder = len(self.lengths) % effective_batch_size
        # drop_last=False keeps the tail chunk, padded from the epoch order when too small.
        self.has_tail = (not drop_last) and self.remainder > 0
        self.num_global_batches = self.num_full_batches + (1 if self.has_tail else 0)

    def set_epoch(self, epoch: int) -> None:
        """The shuffle of epoch `epoch` uses seed `seed + epoch`."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_global_batches * self.grad_accum

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        n = len(self.lengths)
        order = torch.randperm(n, generator=generator).tolist() if self.shuffle else list(range(n))
        groups_needed = self.dp_size * self.grad_accum
        for chunk in range(self.num_global_batches):
            chunk_indices = order[chunk * self.effective_batch_size : (chunk + 1) * self.effective_batch_size]
            is_tail = self.has_tail and chunk == self.num_global_batches - 1
            if is_tail and len(chunk_indices) < groups_needed:
                pad = groups_needed - len(chunk_indices)
                chunk_indices = chunk_indices + (order * math.ceil(pad / len(order)))[:pad]
            rank_micro_batches = self._assign(chunk_indices, [self.lengths[i] for i in chunk_indices])
            yield from rank_micro_batches[self.rank]

    def _cost(self, bs: int, max_len: int) -> float:
        return bs * max_len + self.QUADRATIC_COST_COEF * bs * max_len * max_len

    def _group_cost(self, group: list[tuple[int, int]]) -> float:
        return self._cost(len(group), group[0][1]) if group else 0.0

    def _groups_and_costs(self, counts: list[int], sorted_pairs: list[tuple[int, int]]):
        groups, start = [], 0
        for count in counts:
            groups.append(sorted_pairs[start : start + count])
            start += count
        return groups, [self._group_cost(g) for g in groups]

    def _assign(self, indices: list[int], lengths: list[int]) -> list[list[list[int]]]:
        # Groups sorted by cost descending are dealt slot by slot: slot k gets ranks' groups
        # [k * dp_size, (k + 1) * dp_size), so every slot costs about the same on every rank.
        sorted_pairs = sorted(zip(indices, lengths), key=lambda pair: pair[1], reverse=True)
        all_groups = self._balance_groups(sorted_pairs)
        group_costs = sorted(
            ((i, self._group_cost(g)) for i, g in enumerate(all_groups)), key=lambda x: x[1], reverse=True
        )
        rank_mbs: list[list[list[int]]] = [[[] for _ in range(self.grad_accum)] for _ in range(self.dp_size)]
        for slot in range(self.grad_accum):
            for r in range(self.dp_size):
                group_index = group_costs[slot * self.dp_size + r][0]
                rank_mbs[r][slot] = [idx for idx, _ in all_groups[group_index]]
        return rank_mbs

    def _balance_groups(self, sorted_pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        # Hill climbing on group sizes: move one sample from the costliest group to the cheapest one that
        # can take it; stop on a cycle or when balanced; keep the lowest-spread state seen.
        n = len(sorted_pairs)
        k = self.dp_size * self.grad_accum
        min_per_group = 1
        if n < k * min_per_group:
            raise ValueError(
                f"Not enough samples ({n}) to fill {k} groups with at least {min_per_group} sample(s) each. "
                f"Reduce effective_batch_size or increase the dataset size."
            )
        base, remainder = divmod(n, k)
        counts = [base + (1 if i < remainder else 0) for i in range(k)]
        frozen: set[int] = set()
        seen: set[tuple[int, ...]] = set()
        best_spread = float("inf")
        best_counts = list(counts)

        for _ in range(max(k * 30, self.effective_batch_size)):
            key = tuple(counts)
            if key in seen:
                break
            seen.add(key)
            _, costs = self._groups_and_costs(counts, sorted_pairs)
            active = [i for i in range(k) if i not in frozen]
            if len(active) <= 1:
                break
            active_costs = [costs[i] for i in active]
            spread = max(active_costs) - min(active_costs)
            if spread < best_spread:
                best_spread = spread
                best_counts = list(counts)
            hi_idx = max(active, key=lambda i: costs[i])
            if costs[hi_idx] == costs[min(active, key=lambda i: costs[i])]:
                break
            transferred = False
            for lo_idx in sorted(active, key=lambda i: costs[i]):
                if lo_idx == hi_idx or costs[lo_idx] == costs[hi_idx]:
                    continue
                if counts[hi_idx] > min_per_group:
                    counts[hi_idx] -= 1
                    counts[lo_idx] += 1
                    transferred = True
                    break
            if not transferred:
                if counts[hi_idx] > min_per_group:
                    break
                slot_members = self._slot_groups(costs, hi_idx)
                self._relieve_and_freeze(counts, slot_members, hi_idx, frozen, sorted_pairs, costs[hi_idx])

        groups, _ = self._groups_and_costs(best_counts, sorted_pairs)
        return groups

    def _slot_groups(self, costs: list[float], pivot_idx: int) -> set[int]:
        ranking = sorted(range(len(costs)), key=lambda i: costs[i], reverse=True)
        slot_start = (ranking.index(pivot_idx) // self.dp_size) * self.dp_size
        return set(ranking[slot_start : min(slot_start + self.dp_size, len(costs))])

    def _relieve_and_freeze(self, counts, slot_members, pivot_idx, frozen, sorted_pairs, cap_cost) -> None:
        # The slot's costliest group is down to one sample; top up its slot mates from cheaper outside
        # groups (never above the slot's peak cost), then freeze the whole slot.
        k = len(counts)
        for gi in slot_members:
            if gi in frozen or gi == pivot_idx:
                continue
            while True:
                _, costs_now = self._groups_and_costs(counts, sorted_pairs)
                gi_max_len = sorted_pairs[sum(counts[:gi])][1] if counts[gi] > 0 else 0
                if self._cost(counts[gi] + 1, gi_max_len) > cap_cost:
                    break
                donors = [i for i in range(k) if i not in frozen and i not in slot_members and counts[i] > 1]
                if not donors:
                    break
                donor = min(donors, key=lambda i: costs_now[i])
                counts[gi] += 1
                counts[donor] -= 1
        frozen.update(slot_members)


class BatchSamplerShard(Sampler[list[int]]):
    """This process's share of a batch sampler, dealt the way accelerate does (R3.4).

    `split_batches=False`: process `k` gets whole batches `k, k+W, k+2W, ...`; with `even_batches` the
    last round is completed from the first indices of the epoch so every process gets as many full
    batches. `split_batches=True`: every batch is cut into W equal slices.
    """

    def __init__(
        self,
        batch_sampler: Any,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        if split_batches and (self.batch_size is None or self.batch_size % num_processes != 0):
            raise ValueError(
                f"accelerator_config.split_batches=True needs a batch size ({self.batch_size}) that is a "
                f"multiple of the number of processes ({num_processes}); change the batch size or set "
                "split_batches=False."
            )

    @property
    def total_length(self) -> int:
        """Number of batches of the unsharded sampler."""
        return len(self.batch_sampler)

    def __len__(self) -> int:
        total = len(self.batch_sampler)
        if self.split_batches:
            return total
        length, leftover = divmod(total, self.num_processes)
        if leftover == 0 or self.drop_last:
            return length
        if self.even_batches:
            return length + 1
        return length + 1 if self.process_index < leftover else length

    def __iter__(self) -> Iterator[list[int]]:
        return self._iter_with_split() if self.split_batches else self._iter_with_no_split()

    def _iter_with_split(self) -> Iterator[list[int]]:
        initial_data: list[int] = []
        slice_length = self.batch_size // self.num_processes
        start, end = slice_length * self.process_index, slice_length * (self.process_index + 1)
        batch: list[int] = []
        for idx, batch in enumerate(self.batch_sampler):
            if idx == 0:
                initial_data = batch
            if len(batch) == self.batch_size:
                yield batch[start:end]
        if not self.drop_last and len(initial_data) > 0 and len(batch) < self.batch_size:
            if not self.even_batches:
                if len(batch) > start:
                    yield batch[start:end]
            else:
                while len(initial_data) < self.batch_size:  # fewer samples than one batch
                    initial_data += initial_data
                batch = batch + initial_data
                yield batch[start:end]

    def _iter_with_no_split(self) -> Iterator[list[int]]:
        initial_data: list[Any] = []
        batch_to_yield = None
        batch: list[int] = []
        idx = -1
        for idx, batch in enumerate(self.batch_sampler):
            # Remember the epoch's first indices in case the last round must be completed from them.
            if not self.drop_last and idx < self.num_processes:
                if self.batch_size is None:
                    initial_data.append(batch)  # dynamic batch sizes: keep whole batches
                else:
                    initial_data += batch
            if idx % self.num_processes == self.process_index:
                batch_to_yield = batch
            # Only yield once every process of this round is sure to get a full batch.
            if idx % self.num_processes == self.num_processes - 1 and (
                self.batch_size is None or len(batch) == self.batch_size
            ):
                yield batch_to_yield
                batch_to_yield = None

        if self.drop_last or len(initial_data) == 0:
            return
        if not self.even_batches:
            if batch_to_yield:
                yield batch_to_yield
            return
        if batch_to_yield and (self.batch_size is None or len(batch_to_yield) == self.batch_size):
            yield batch_to_yield
        min_length_needed = (
            self.num_processes * self.batch_size if self.batch_size is not None else self.num_processes
        )
        while len(initial_data) < min_length_needed:  # fewer samples than one round
            initial_data += initial_data
        if self.batch_size is None or len(batch) == self.batch_size:
            # The last batch was full, so its owner has yielded it; complete the round from the next one.
            batch = []
            idx += 1
        cycle_index = 0
        while idx % self.num_processes != 0 or len(batch) > 0:
            if self.batch_size is None:
                batch = initial_data[cycle_index]
                if idx % self.num_processes == self.process_index:
                    yield batch
                cycle_index += 1
            else:
                end_index = cycle_index + self.batch_size - len(batch)
                batch += initial_data[cycle_index:end_index]
                if idx % self.num_processes == self.process_index:
                    yield batch
                cycle_index = end_index
            batch = []
            idx += 1


def shard_batches(
    batch_sampler: Any,
    num_processes: int,
    process_index: int,
    even_batches: bool = True,
    split_batches: bool = False,
) -> BatchSamplerShard:
    """Wrap `batch_sampler` so it yields only process `process_index`'s batches (R3.4)."""
    if not 0 <= process_index < num_processes:
        raise ValueError(
            f"process_index={process_index} must lie in [0, num_processes={num_processes}); pass the "
            "global rank and the world size."
        )
    return BatchSamplerShard(
        batch_sampler,
        num_processes=num_processes,
        process_index=process_index,
        split_batches=split_batches,
        even_batches=even_batches,
    )
