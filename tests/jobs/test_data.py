"""Shakespeare corpus and the world-size-independent step sampler."""

from __future__ import annotations

import numpy as np
import pytest

from tidal.jobs.data import (
    SHAKESPEARE_SHA256,
    CharBlocks,
    StepSampler,
    _sha256,
    fetch_shakespeare,
    load_shakespeare,
)


def test_corpus_is_verified_and_split() -> None:
    archive = fetch_shakespeare()
    assert _sha256(archive) == SHAKESPEARE_SHA256
    corpus = load_shakespeare()
    assert corpus.vocab_size == 84
    assert 4_000_000 < len(corpus.train) < 5_000_000
    assert 0.09 < len(corpus.val) / (len(corpus.train) + len(corpus.val)) < 0.11
    text = "To be, or not to be"
    assert corpus.decode(corpus.encode(text)) == text
    assert int(corpus.train.max()) < corpus.vocab_size


def test_char_blocks() -> None:
    tokens = np.arange(101, dtype=np.uint8)
    ds = CharBlocks(tokens, seq_len=10)
    assert len(ds) == 10
    x, y = ds[3]
    assert x.tolist() == list(range(30, 40)) and y.tolist() == list(range(31, 41))
    with pytest.raises(IndexError):
        ds[10]


def test_sampler_is_a_function_of_seed_and_step() -> None:
    a, b = StepSampler(1000, 32, seed=7), StepSampler(1000, 32, seed=7)
    for step in (5, 0, 31, 5):  # any order, any instance: same indices
        assert np.array_equal(a.indices(step), b.indices(step))
    assert not np.array_equal(a.indices(1), StepSampler(1000, 32, seed=8).indices(1))


def test_sampler_epochs_are_permutations() -> None:
    s = StepSampler(100, 8, seed=0)
    stream = np.concatenate([s.indices(k) for k in range(25)])  # 200 samples = 2 epochs
    assert sorted(stream[:100].tolist()) == list(range(100))
    assert sorted(stream[100:200].tolist()) == list(range(100))
    assert not np.array_equal(stream[:100], stream[100:200])


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_shards_partition_the_step(world: int) -> None:
    s = StepSampler(1000, 32, seed=3)
    shards = [s.shard(9, r, world) for r in range(world)]
    assert np.array_equal(np.concatenate(shards), s.indices(9))
    with pytest.raises(ValueError):
        s.shard(0, 0, 3)
