//! The sampler chain (filled in by the sampler-chain issue).
