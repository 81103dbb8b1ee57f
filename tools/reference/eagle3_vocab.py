#!/usr/bin/env python3
"""EAGLE-3's draft vocabulary (d2t / t2d) exactly as SpecForge derives it from offline data (docs/eagle3-step.md §2).

    /usr/bin/python3 tools/reference/eagle3_vocab.py DATA_PATH --draft-vocab-size D --target-vocab-size V
        [--max-length L] [--out vocab.safetensors]

Runs under /usr/bin/python3 and the venv python (numpy and h5py for the shards; the mapping itself is plain Python).

SpecForge (a6b6b023): an offline run whose `model.vocab_mapping_path` is empty and whose draft vocabulary is smaller
than the target's derives the mapping from the training features (`_ensure_offline_vocab_mapping`,
specforge/training/assembly.py:468-507):

1. `count_effective_feature_tokens` (specforge/training/vocab_mapping.py:17-68): for every sample in data order,
   truncated to `data.max_length`, the supervised tokens (loss_mask != 0; the raw mask, before the EAGLE-3 normalizer
   zeroes the last position) are counted with `unique(return_counts=True)` and added to a Counter in ascending token
   order. The Counter's insertion order (first appearance by sample, then ascending id) is the tie-break below.
2. `process_token_dict_to_mappings` (specforge/data/preprocessing.py:720-768):
   - fewer than D distinct tokens: tokens of `set(range(D)) - set(counted ids)` are added with count 0, in that
     set's iteration order, until there are D (CPython's set order: `missing_fill_order` emulates it);
   - the D most frequent (`Counter.most_common(D)`: by count, ties to the earlier-inserted token) are kept and
     sorted ascending: used[0] < ... < used[D−1];
   - d2t[i] = used[i] − i (int64, [D]); t2d[t] = t ∈ used (bool, [V]).
A draft that predicts draft id i means target id i + d2t[i]."""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tools/, for hidden_states.py


def count_supervised_tokens(samples: Iterable[Tuple[Sequence[int], Sequence[int]]],
                            max_length: Optional[int] = None) -> Counter:
    """SpecForge's count_effective_feature_tokens over (input_ids, loss_mask) pairs in data order."""
    counts: Counter = Counter()
    for ids, mask in samples:
        ids, mask = np.asarray(ids).reshape(-1), np.asarray(mask).reshape(-1)
        if ids.shape != mask.shape:
            raise ValueError(f"{ids.size} input ids but {mask.size} loss-mask entries")
        if max_length is not None:
            ids, mask = ids[:max_length], mask[:max_length]
        selected = ids[mask.astype(bool)]
        if selected.size and selected.min() < 0:
            raise ValueError(f"negative token id {int(selected.min())}")
        tokens, freqs = np.unique(selected, return_counts=True)  # ascending, as torch.unique
        for t, c in zip(tokens.tolist(), freqs.tolist()):
            counts[int(t)] += int(c)
    return counts


def count_dataset(path: str, max_length: Optional[int] = None) -> Counter:
    """count_supervised_tokens over a draftforge hidden-state data path (docs/data-format.md), in sample order."""
    import hidden_states

    ds = hidden_states.Dataset(path)
    return count_supervised_tokens(((ds[i]["input_ids"], ds[i]["loss_mask"]) for i in range(len(ds))), max_length)


# ---- CPython's set iteration order -------------------------------------------------------------------------

_DUMMY = object()
_LINEAR_PROBES, _PERTURB_SHIFT, _MINSIZE = 9, 5, 8


class _SetSim:
    """CPython 3.11's setobject.c table for small non-negative ints (hash(i) = i): insertion with linear probing and
    perturbation, dummies on discard, and its resize rules. Only what `set(range(D)) - other` needs."""

    def __init__(self) -> None:
        self.mask, self.fill, self.used = _MINSIZE - 1, 0, 0
        self.table: List[object] = [None] * _MINSIZE

    def _probe(self, key: int):
        """Slots visited in order: runs of LINEAR_PROBES + 1 while they fit, then the perturbed jump."""
        mask, i, perturb = self.mask, key & self.mask, key
        while True:
            n = _LINEAR_PROBES + 1 if i + _LINEAR_PROBES <= mask else 1
            for j in range(n):
                yield i + j
            perturb >>= _PERTURB_SHIFT
            i = (i * 5 + 1 + perturb) & mask

    def add(self, key: int) -> None:  # set_add_entry
        free = None
        for s in self._probe(key):
            e = self.table[s]
            if e is None:
                break
            if e is _DUMMY:
                free = s if free is None else free
            elif e == key:
                return
        if free is not None:
            self.table[free] = key
            self.used += 1
            return
        self.table[s] = key
        self.fill += 1
        self.used += 1
        if self.fill * 5 >= self.mask * 3:
            self.resize(self.used * 2 if self.used > 50000 else self.used * 4)

    def _insert_clean(self, key: int) -> None:  # set_insert_clean
        for s in self._probe(key):
            if self.table[s] is None:
                self.table[s] = key
                return

    def resize(self, minused: int) -> None:  # set_table_resize
        size = _MINSIZE
        while size <= minused:
            size <<= 1
        old = [e for e in self.table if e is not None and e is not _DUMMY]
        self.mask, self.table, self.fill = size - 1, [None] * size, len(old)
        for k in old:
            self._insert_clean(k)

    def discard(self, key: int) -> None:  # set_discard_entry
        for s in self._probe(key):
            e = self.table[s]
            if e is None:
                return
            if e is not _DUMMY and e == key:
                self.table[s] = _DUMMY
                self.used -= 1
                return

    def keys(self) -> List[int]:
        return [e for e in self.table if e is not None and e is not _DUMMY]  # type: ignore[misc]

    def copy(self) -> "_SetSim":  # set_copy -> set_merge into an empty set
        new = _SetSim()
        if self.used * 5 >= new.mask * 3:
            new.resize(self.used * 2)
        if new.mask == self.mask and self.fill == self.used:
            new.table, new.fill, new.used = list(self.table), self.fill, self.used
        else:
            new.fill = new.used = self.used
            for k in self.keys():
                new._insert_clean(k)
        return new


def missing_fill_order(counted: Iterable[int], draft_vocab_size: int) -> List[int]:
    """The iteration order of `set(range(D)) - set(counted)` in CPython 3.11 (setobject.c: set_difference, which
    copies and discards when len(range set) / 4 > len(other), else inserts the survivors into a fresh set; a discard
    pass that leaves more than mask / 4 dummies resizes to used * 4 and may wrap keys past the table size)."""
    other = set(int(t) for t in counted)
    whole = _SetSim()
    for k in range(draft_vocab_size):
        whole.add(k)
    if (draft_vocab_size >> 2) > len(other):
        result = whole.copy()
        for k in (k for k in range(draft_vocab_size) if k in other):
            result.discard(k)
        if result.fill - result.used > result.mask // 4:
            result.resize(result.used * 2 if result.used > 50000 else result.used * 4)
    else:
        result = _SetSim()
        for k in whole.keys():
            if k not in other:
                result.add(k)
    return result.keys()


# ---- the mapping -------------------------------------------------------------------------------------------


def mapping_from_counts(counts: Counter, draft_vocab_size: int, target_vocab_size: int,
                        use_python_set: bool = False) -> Tuple[np.ndarray, np.ndarray, List[int]]:
    """(d2t int64 [D], t2d bool [V], the padding tokens added) by process_token_dict_to_mappings' rules; `counts`
    is not modified. use_python_set takes the padding order from a real Python set instead of the emulation."""
    d = Counter()
    for k, v in counts.items():  # keeps the insertion order
        d[k] = v
    added: List[int] = []
    if len(d) < draft_vocab_size:
        order = (list(set(range(draft_vocab_size)) - set(d.keys())) if use_python_set
                 else missing_fill_order(d.keys(), draft_vocab_size))
        for t in order:
            d[t] = 0
            added.append(t)
            if len(d) >= draft_vocab_size:
                break
    # most_common(n) is heapq.nlargest(n, ..., key=count): ties go to the earlier-inserted entry
    ranked = sorted(enumerate(d.items()), key=lambda e: (-e[1][1], e[0]))[:draft_vocab_size]
    used = sorted(k for _, (k, _) in ranked)
    if used and used[-1] >= target_vocab_size:
        raise ValueError(f"token {used[-1]} is outside the target vocabulary of {target_vocab_size}")
    d2t = np.asarray([u - i for i, u in enumerate(used)], np.int64)
    t2d = np.zeros(target_vocab_size, bool)
    t2d[used] = True
    return d2t, t2d, added


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data")
    ap.add_argument("--draft-vocab-size", type=int, required=True)
    ap.add_argument("--target-vocab-size", type=int, required=True)
    ap.add_argument("--max-length", type=int)
    ap.add_argument("--out", help="write d2t (I64) and t2d (U8) to this .safetensors file")
    a = ap.parse_args(argv)
    counts = count_dataset(a.data, a.max_length)
    d2t, t2d, added = mapping_from_counts(counts, a.draft_vocab_size, a.target_vocab_size)
    print(f"{len(counts)} distinct supervised tokens; {len(added)} padding tokens added; "
          f"draft ids -> target ids: {(np.arange(len(d2t)) + d2t).tolist()}")
    if a.out:
        import dflash_io as dio

        dio.write_safetensors(a.out, {"d2t": d2t, "t2d": t2d.astype(np.uint8)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
