"""Duplicate detection: exact (hash of normalised text) and near-duplicate (MinHash LSH, `datasketch`).

`exact_key` ignores ASCII case and whitespace, so prompts that differ only in case or spacing are
exact duplicates. `NearDupIndex` holds MinHash signatures of hashed word n-gram shingles in an LSH index and
confirms every LSH candidate with the estimated Jaccard similarity, so a lucky band collision alone
never drops a sample. Memory is proportional to the number of texts indexed (the selected samples),
not to the log. Deciding which copy to keep is the caller's job (it inserts in priority order).
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np

from typing import Any


_ASCII_WHITESPACE = b" \t\n\r\x0b\x0c"


def normalize(text: str) -> str:
    """Lower case, whitespace runs collapsed: the form near-dedupe shingles and tests compare."""
    return " ".join(text.lower().split())


def exact_key(text: str) -> int:
    """64-bit key (blake2b) of the text with ASCII case and all ASCII whitespace ignored.

    Dropping whitespace instead of collapsing it is ~6x faster on bytes, and this runs once per logged
    request; it only merges texts that differ in where the spaces are, which near-dedupe would merge anyway.
    """
    data = text.encode("utf-8", "surrogatepass").lower().translate(None, _ASCII_WHITESPACE)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def shingle_hashes(text: str, n: int) -> list[int]:
    """32-bit hashes of the word n-grams of the normalised text (one shingle if shorter than n words).

    Words are hashed once (crc32) and combined per n-gram with numpy: several times faster than hashing
    each joined n-gram string, which matters because every selected sample is signed.
    """
    words = text.lower().encode("utf-8", "surrogatepass").split()
    if len(words) < n:
        return [zlib.crc32(b" ".join(words))]
    word_hashes = np.fromiter(map(zlib.crc32, words), dtype=np.uint64, count=len(words))
    count = len(words) - n + 1
    combined = np.zeros(count, dtype=np.uint64)
    for offset in range(n):
        combined = (combined * np.uint64(1_000_003) + word_hashes[offset:offset + count]) & np.uint64(0xFFFFFFFF)
    return combined.tolist()


class NearDupIndex:
    """MinHash LSH over texts; `find(text)` returns the key of an indexed near-duplicate, or None."""

    def __init__(self, threshold: float = 0.8, num_perm: int = 64, ngram: int = 3, seed: int = 1):
        # Imported here: scan workers import this module for `exact_key` and never need datasketch.
        from datasketch import MinHash, MinHashLSH

        self._minhash = MinHash
        self.threshold = threshold
        self.ngram = ngram
        self._lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        # Permutations are derived once and shared; MinHash() would otherwise rebuild them per text.
        self._template = MinHash(num_perm=num_perm, seed=seed)
        self._num_perm = num_perm
        self._signatures: dict[object, Any] = {}

    def __len__(self) -> int:
        return len(self._signatures)

    def signature(self, text: str) -> Any:
        # Shingles arrive already hashed to 32 bits, so the hash function is the identity.
        minhash = self._minhash(num_perm=self._num_perm, seed=self._template.seed, hashfunc=int,
                          permutations=self._template.permutations, scheme=self._template.scheme)
        minhash.update_batch(shingle_hashes(text, self.ngram))
        return minhash

    def find(self, signature: Any) -> object | None:
        for key in self._lsh.query(signature):
            if self._signatures[key].jaccard(signature) >= self.threshold:
                return key
        return None

    def add(self, key: object, signature: Any) -> None:
        self._lsh.insert(key, signature, check_duplication=False)
        self._signatures[key] = signature
