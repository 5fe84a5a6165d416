//! The KV cache and its session snapshots (filled in by the KV-cache issue).
