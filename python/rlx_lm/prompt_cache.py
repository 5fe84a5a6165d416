"""A prefix prompt cache: session snapshots keyed by tokens, under a byte budget.

Entries live in a compressed radix tree over token ids, so `PromptCache.lookup`
finds the longest prefix a prompt shares with any cached snapshot in
O(len(prompt)). Memory is counted in blocks of the shared KV storage (a prefix
shared by several snapshots is counted once) and the budget holds after every
insert, evicting least recently used entries. With a directory, entries are
saved as files and survive a restart. See docs/kv_cache.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings
from collections import Counter, OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from rlx_lm._core import KV_BLOCK_TOKENS, KvSnapshot
from rlx_lm.errors import InvalidOptionError, RlxError, SnapshotMismatchError
from rlx_lm.runner import Logits
from rlx_lm.session import ModelFingerprint, SessionSnapshot, read_header, reclaim_temp_files

__all__ = ["PromptCache", "PromptCacheStats", "SessionRunner", "cached_prefill_logits"]

BLOCK_TOKENS = KV_BLOCK_TOKENS
"""Token granularity of storage accounting (the KV core's block size, defined there)."""

SUFFIX = ".rlxkv"
"""File name suffix of persisted entries; other files in the directory are never touched."""

_Storage = list[tuple[Hashable, int, int]]  # (storage key, blocks, block_bytes)


@dataclass(frozen=True)
class PromptCacheStats:
    """Counters of a PromptCache."""

    entries: int
    tokens: int
    bytes: int
    blocks: int
    hits: int
    misses: int
    evictions: int
    disk_bytes: int
    write_failures: int = 0
    """Inserts whose file could not be written (kept in memory only, with a warning)."""


class _Entry:
    __slots__ = (
        "block_bytes",
        "disk_bytes",
        "n_layers",
        "node",
        "path",
        "snapshot",
        "storage",
        "tokens",
    )

    def __init__(
        self,
        tokens: tuple[int, ...],
        snapshot: SessionSnapshot | None,
        path: Path | None,
        storage: _Storage,
        disk_bytes: int,
        n_layers: int = 0,
        block_bytes: int = 0,
    ) -> None:
        self.tokens = tokens
        self.snapshot = snapshot  # None while only on disk
        self.path = path
        self.storage = storage
        self.disk_bytes = disk_bytes
        self.n_layers = n_layers
        self.block_bytes = block_bytes
        self.node: _Node | None = None


class _Node:
    __slots__ = ("children", "edge", "entry", "parent")

    def __init__(self, edge: tuple[int, ...], parent: _Node | None) -> None:
        self.edge = edge
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.entry: _Entry | None = None


def _common(edge: tuple[int, ...], tokens: Sequence[int], start: int) -> int:
    """Length of the common prefix of `edge` and `tokens[start:]`."""
    n = min(len(edge), len(tokens) - start)
    if tuple(tokens[start : start + n]) == edge[:n]:
        return n
    i = 0
    while i < n and edge[i] == tokens[start + i]:
        i += 1
    return i


class _RadixTree:
    """Compressed trie of token sequences; leaves always hold an entry."""

    def __init__(self) -> None:
        self.root = _Node((), None)

    def insert(self, entry: _Entry) -> None:
        tokens, node, i = entry.tokens, self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                leaf = _Node(tokens[i:], node)
                node.children[tokens[i]] = leaf
                node, i = leaf, len(tokens)
                break
            m = _common(child.edge, tokens, i)
            if m < len(child.edge):
                mid = _Node(child.edge[:m], node)
                node.children[tokens[i]] = mid
                child.edge = child.edge[m:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                child = mid
            node, i = child, i + m
        assert node.entry is None, "the caller removes an entry with the same tokens first"
        node.entry = entry
        entry.node = node

    def remove(self, entry: _Entry) -> None:
        node = entry.node
        assert node is not None
        assert node.entry is entry
        node.entry = None
        entry.node = None
        while node.parent is not None and node.entry is None and not node.children:
            parent = node.parent
            del parent.children[node.edge[0]]
            node = parent
        if node.parent is not None and node.entry is None and len(node.children) == 1:
            (child,) = node.children.values()
            child.edge = node.edge + child.edge
            child.parent = node.parent
            node.parent.children[child.edge[0]] = child

    def longest_prefix(self, prompt: Sequence[int]) -> tuple[_Entry | None, int]:
        """An entry sharing the longest prefix with `prompt`, and that length."""
        node, i = self.root, 0
        target = self.root
        while i < len(prompt):
            child = node.children.get(prompt[i])
            if child is None:
                break
            m = _common(child.edge, prompt, i)
            i += m
            target = child
            if m < len(child.edge):
                break
            node = child
        if i == 0:
            return None, 0
        # Every entry below `target` starts with prompt[:i]; prefer the shallowest.
        while target.entry is None:
            target = min(target.children.values(), key=lambda c: len(c.edge))
        return target.entry, i


class _Usage:
    """Bytes of shared storage: each slab counted once, at the most blocks any entry needs."""

    def __init__(self) -> None:
        self._slabs: dict[Hashable, Counter[int]] = {}
        self.bytes = 0
        self.blocks = 0

    def add(self, storage: _Storage) -> None:
        for key, blocks, block_bytes in storage:
            counts = self._slabs.setdefault(key, Counter())
            old = max(counts, default=0)
            counts[blocks] += 1
            self._moved(old, max(old, blocks), block_bytes)

    def remove(self, storage: _Storage) -> None:
        for key, blocks, block_bytes in storage:
            counts = self._slabs[key]
            old = max(counts)
            counts[blocks] -= 1
            if counts[blocks] == 0:
                del counts[blocks]
            if not counts:
                del self._slabs[key]
            self._moved(old, max(counts, default=0), block_bytes)

    def _moved(self, old: int, new: int, block_bytes: int) -> None:
        self.blocks += new - old
        self.bytes += (new - old) * block_bytes


def _alone(storage: _Storage) -> int:
    return sum(blocks * block_bytes for _, blocks, block_bytes in storage)


def _layout(kv: KvSnapshot) -> tuple[int, int]:
    itemsize = 4 if kv.dtype == "float32" else 2
    return kv.n_layers, BLOCK_TOKENS * 2 * kv.n_kv_heads * kv.head_dim * itemsize


def _chain_leaf(node: _Node) -> _Node:
    """The leaf reached from `node` by always taking the smallest next token."""
    while node.children:
        node = node.children[min(node.children)]
    return node


class PromptCache:
    """Session snapshots keyed by token prefix, with an LRU byte budget and optional persistence.

    Not thread-safe: use one per runner or guard it with a lock.
    """

    def __init__(
        self,
        budget_bytes: int,
        *,
        fingerprint: ModelFingerprint | None = None,
        directory: str | os.PathLike[str] | None = None,
        durable: bool = True,
    ) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1:
            raise InvalidOptionError(
                f"budget_bytes must be a positive integer, got {budget_bytes!r}"
            )
        if directory is not None and fingerprint is None:
            raise InvalidOptionError(
                "a persistent PromptCache needs fingerprint=: files of other models in the "
                "directory must be told apart"
            )
        self.budget_bytes = budget_bytes
        self.fingerprint = fingerprint
        self.directory = None if directory is None else Path(directory)
        self.durable = durable
        self.refused: dict[Path, str] = {}
        """Files in the directory that were refused, with the reason; they are left untouched."""
        self._bound = fingerprint is not None
        self._tree = _RadixTree()
        self._lru: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._usage = _Usage()
        self._hits = self._misses = self._evictions = self._write_failures = 0
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._scan()

    # ----------------------------------------------------------------- public

    def lookup(self, prompt: Sequence[int]) -> tuple[SessionSnapshot | None, int]:
        """The snapshot sharing the longest prefix with `prompt`, and that prefix's length."""
        tokens = [int(t) for t in prompt]
        while True:
            entry, n = self._tree.longest_prefix(tokens)
            if entry is None:
                self._misses += 1
                return None, 0
            snapshot = entry.snapshot if entry.snapshot is not None else self._load(entry)
            if snapshot is None:
                continue  # the file was refused and dropped from the index; look again
            self._lru.move_to_end(entry.tokens)
            if entry.path is not None:  # recency survives a restart through the mtime
                with contextlib.suppress(OSError):
                    os.utime(entry.path)
            self._hits += 1
            return snapshot, n

    def insert(self, snapshot: SessionSnapshot) -> bool:
        """Cache `snapshot` under its tokens; False if it alone exceeds the budget or is empty.

        With a directory, a file that cannot be written (a full disk, a
        snapshot no file could hold) costs nothing but persistence: the entry
        is kept in memory, a RuntimeWarning says why, and
        ``stats().write_failures`` counts it.
        """
        if not isinstance(snapshot, SessionSnapshot) or not isinstance(snapshot.kv, KvSnapshot):
            raise TypeError("PromptCache.insert needs a SessionSnapshot whose kv is a KvSnapshot")
        self._check_fingerprint(snapshot.fingerprint)
        tokens = snapshot.tokens
        storage: _Storage = list(snapshot.kv.storage())
        if not tokens or _alone(storage) > self.budget_bytes:
            return False
        path = None
        old = self._lru.get(tokens)
        if self.directory is not None:
            path = self.directory / self._file_name(tokens)
            try:
                snapshot.save(path, durable=self.durable)  # before any state changes
            except (OSError, InvalidOptionError) as e:
                self._write_failures += 1
                warnings.warn(
                    f"prompt cache: could not write {path}: {e} (the entry is kept in memory only)",
                    RuntimeWarning,
                    stacklevel=2,
                )
                path = None
        if old is not None:
            self._drop(old, delete_file=old.path is not None and old.path != path)
        self.fingerprint, self._bound = snapshot.fingerprint, True
        disk = 0
        if path is not None:
            with contextlib.suppress(OSError):
                disk = path.stat().st_size
        n_layers, block_bytes = _layout(snapshot.kv)
        entry = _Entry(tokens, snapshot, path, storage, disk, n_layers, block_bytes)
        self._add(entry)
        self._share_from(entry)
        self._enforce_budget(keep=entry)
        return True

    def stats(self) -> PromptCacheStats:
        """Entries, tokens, bytes, blocks, hits, misses, evictions and bytes on disk."""
        return PromptCacheStats(
            entries=len(self._lru),
            tokens=sum(len(t) for t in self._lru),
            bytes=self._usage.bytes,
            blocks=self._usage.blocks,
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            disk_bytes=sum(e.disk_bytes for e in self._lru.values()),
            write_failures=self._write_failures,
        )

    def kv_store_stats(self) -> tuple[int, int, int]:
        """``(blocks, tokens, disk_bytes)`` for a runner's `kv_store_stats`.

        Blocks are 16-token blocks of one layer's keys and values, shared ones
        counted once; tokens sum over entries; disk_bytes sums their files.
        """
        s = self.stats()
        return (s.blocks, s.tokens, s.disk_bytes)

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, tokens: object) -> bool:
        if not isinstance(tokens, Sequence):
            return False
        return tuple(int(t) for t in tokens) in self._lru

    # ---------------------------------------------------------------- private

    def _check_fingerprint(self, fingerprint: ModelFingerprint | None) -> None:
        if not self._bound:
            return
        if self.fingerprint is None:
            if fingerprint is not None:
                raise SnapshotMismatchError(
                    f"this cache holds snapshots without a fingerprint, not {fingerprint}"
                )
            return
        why = self.fingerprint.mismatch(fingerprint)
        if why is not None:
            raise SnapshotMismatchError(why)

    def _file_name(self, tokens: tuple[int, ...]) -> str:
        fp = self.fingerprint.to_json() if self.fingerprint is not None else "null"
        digest = hashlib.sha256(fp.encode())
        digest.update(np.asarray(tokens, dtype="<u8").tobytes())
        return digest.hexdigest()[:40] + SUFFIX

    def _add(self, entry: _Entry) -> None:
        self._tree.insert(entry)
        self._lru[entry.tokens] = entry
        self._usage.add(entry.storage)

    def _drop(self, entry: _Entry, *, delete_file: bool) -> None:
        self._tree.remove(entry)
        del self._lru[entry.tokens]
        self._usage.remove(entry.storage)
        if delete_file and entry.path is not None:
            with contextlib.suppress(FileNotFoundError):
                entry.path.unlink()

    def _set_storage(self, entry: _Entry, storage: _Storage) -> None:
        self._usage.remove(entry.storage)
        entry.storage = storage
        self._usage.add(storage)

    def _disk_storage(self, entry: _Entry) -> _Storage:
        """What an entry only on disk would pin once loaded, counted as memory would be.

        An entry whose tokens begin another's is loaded as a prefix of that one
        (see `_load`), so its storage is counted as part of a chain: the entry
        reached by always taking the smallest next token. A prefix is thus
        counted once before and after a restart, as it was when inserted.
        """
        assert entry.node is not None
        leaf = _chain_leaf(entry.node).entry
        key = str(leaf.path if leaf is not None and leaf.path is not None else entry.path)
        blocks = -(-len(entry.tokens) // BLOCK_TOKENS)
        return [
            (("file", key, layer), blocks, entry.block_bytes) for layer in range(entry.n_layers)
        ]

    def _share_from(self, entry: _Entry) -> None:
        """Make every cached prefix of `entry` a view of its rows (no copy, counted once)."""
        assert entry.snapshot is not None
        assert entry.node is not None
        kv = entry.snapshot.kv
        node = entry.node.parent
        while node is not None:
            other = node.entry
            if other is not None:
                fingerprint = entry.snapshot.fingerprint
                other.snapshot = SessionSnapshot(
                    kv.prefix(len(other.tokens)), other.tokens, fingerprint
                )
                self._set_storage(other, list(other.snapshot.kv.storage()))
            node = node.parent

    def _loaded_extension(self, entry: _Entry) -> _Entry | None:
        """An entry in memory whose tokens begin with `entry`'s, if any."""
        assert entry.node is not None
        stack = list(entry.node.children.values())
        while stack:
            node = stack.pop()
            if node.entry is not None and node.entry.snapshot is not None:
                return node.entry
            stack.extend(node.children.values())
        return None

    def _unload(self, entry: _Entry) -> None:
        """Keep a persisted entry on disk only: its memory is released, its file stays."""
        entry.snapshot = None
        self._set_storage(entry, self._disk_storage(entry))

    def _enforce_budget(self, keep: _Entry | None, *, delete: bool = True) -> None:
        """Bring the bytes within budget: release persisted entries' memory first (their
        files stay), then, if `delete`, evict least recently used entries."""
        for loaded in list(self._lru.values()):
            if self._usage.bytes <= self.budget_bytes:
                return
            if loaded is not keep and loaded.snapshot is not None and loaded.path is not None:
                self._unload(loaded)
        if not delete:
            return
        while self._usage.bytes > self.budget_bytes:
            victim = next((e for e in self._lru.values() if e is not keep), None)
            if victim is None:
                break
            self._drop(victim, delete_file=True)
            self._evictions += 1

    def _refuse(self, path: Path, reason: str) -> None:
        self.refused[path] = reason
        warnings.warn(
            f"prompt cache: refusing {path}: {reason} (file left untouched)",
            RuntimeWarning,
            stacklevel=3,
        )

    def _scan(self) -> None:
        assert self.directory is not None
        reclaim_temp_files(self.directory)
        files = sorted(
            (p for p in self.directory.iterdir() if p.name.endswith(SUFFIX) and p.is_file()),
            key=lambda p: p.stat().st_mtime_ns,
        )
        found: list[_Entry] = []
        for path in files:
            try:
                info = read_header(path)
                if self.fingerprint is not None:
                    why = self.fingerprint.mismatch(info.fingerprint)
                    if why is not None:
                        raise SnapshotMismatchError(why)
                disk = path.stat().st_size
            except (RlxError, OSError) as e:
                self._refuse(path, str(e))
                continue
            tokens = info.tokens
            if not tokens:
                self._refuse(path, "snapshot holds no tokens")
                continue
            old = self._lru.get(tokens)
            if old is not None:  # two files with the same tokens: keep the newer one
                self._drop(old, delete_file=False)
                found.remove(old)
            itemsize = 4 if info.dtype == "float32" else 2
            block_bytes = BLOCK_TOKENS * 2 * info.n_kv_heads * info.head_dim * itemsize
            entry = _Entry(tokens, None, path, [], disk, info.n_layers, block_bytes)
            self._add(entry)
            found.append(entry)
        for entry in found:  # once the tree is whole, so prefixes find their chains
            self._set_storage(entry, self._disk_storage(entry))
        self._enforce_budget(keep=None)

    def _load(self, entry: _Entry) -> SessionSnapshot | None:
        """Bring an entry only on disk into memory, sharing rows as its accounting assumed:
        as a prefix of a loaded extension, else of the end of its chain, else alone."""
        assert entry.path is not None
        assert entry.node is not None
        longer = self._loaded_extension(entry)
        if longer is not None and longer.snapshot is not None:
            entry.snapshot = SessionSnapshot(
                longer.snapshot.kv.prefix(len(entry.tokens)),
                entry.tokens,
                longer.snapshot.fingerprint,
            )
            self._set_storage(entry, list(entry.snapshot.kv.storage()))
        else:
            leaf = _chain_leaf(entry.node).entry
            if leaf is not None and leaf is not entry and leaf.path is not None:
                self._read(leaf)  # on success, `entry` becomes a view of its rows
            if entry.snapshot is None and self._read(entry) is None:
                return None
        assert entry.snapshot is not None
        self._enforce_budget(keep=entry, delete=False)  # a lookup never deletes a file
        return entry.snapshot

    def _read(self, entry: _Entry) -> SessionSnapshot | None:
        """Read an entry's file; a refused file is dropped from the index (left on disk)."""
        assert entry.path is not None
        try:
            snapshot = SessionSnapshot.load(entry.path, fingerprint=self.fingerprint)
            if snapshot.tokens != entry.tokens:
                raise SnapshotMismatchError("the file changed since the cache indexed it")
        except (RlxError, OSError) as e:
            self._drop(entry, delete_file=False)
            self._refuse(entry.path, str(e))
            return None
        entry.snapshot = snapshot
        self._set_storage(entry, list(snapshot.kv.storage()))
        self._share_from(entry)
        return snapshot


class SessionRunner(Protocol):
    """What `cached_prefill_logits` needs: `SupportsHostDriven.prefill_logits` and
    `SupportsPromptCache.prefill_logits_reusing` / `export_session`."""

    def prefill_logits(self, prompt_ids: Sequence[int], /) -> Logits:
        """Start a sequence from `prompt_ids`; the last position's logits."""
        ...

    def prefill_logits_reusing(
        self, prompt_ids: Sequence[int], snapshot: SessionSnapshot, reuse_len: int, /
    ) -> Logits:
        """Prefill `prompt_ids` whose first `reuse_len` tokens `snapshot` covers."""
        ...

    def export_session(self) -> SessionSnapshot | None:
        """Snapshot the current session."""
        ...


def cached_prefill_logits(
    runner: SessionRunner, prompt: Sequence[int], cache: PromptCache
) -> Logits:
    """Prefill `prompt` reusing the longest cached prefix, then cache the new session.

    Returns what ``runner.prefill_logits(prompt)`` returns; at least the last
    prompt token is always recomputed so there are logits to return.
    """
    tokens = [int(t) for t in prompt]
    if not tokens:
        raise InvalidOptionError("prompt is empty; a prompt needs at least one token")
    snapshot, reuse = cache.lookup(tokens)
    reuse = min(reuse, len(tokens) - 1)
    if snapshot is not None and reuse > 0:
        logits = runner.prefill_logits_reusing(tokens, snapshot, reuse)
    else:
        logits = runner.prefill_logits(tokens)
    fresh = runner.export_session()
    if fresh is not None:
        cache.insert(fresh)
    return logits
