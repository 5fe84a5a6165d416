"""rlx_lm: drive a language model token by token from Python.

Runner protocols any backend can meet, a Rust sampler chain and KV cache, and
a reference Llama-family runner.
"""

from __future__ import annotations

from rlx_lm._core import (
    KvCache,
    KvSnapshot,
    SamplerChain,
    SampleResult,
    __version__,
    argmax,
    build_profile,
)
from rlx_lm.builder import LmRunnerBuilder
from rlx_lm.chat_template import ChatTemplate, ChatTemplates
from rlx_lm.config import ConfigSource, Device
from rlx_lm.default_model import load_default
from rlx_lm.errors import (
    CapacityError,
    ChatTemplateError,
    DtypeError,
    InternalError,
    InvalidLogitsError,
    InvalidOptionError,
    RlxError,
    SequenceStateError,
    ShapeError,
    SnapshotMismatchError,
    TokenOutOfRangeError,
    UnknownArchitectureError,
    UnsupportedError,
    WeightFormatError,
)
from rlx_lm.generation import (
    GenerationChunk,
    GenerationEvent,
    GenerationResult,
    TokenLogprob,
    generate,
    load_model,
    stream,
)
from rlx_lm.host_driven import HostDriven
from rlx_lm.prompt_cache import PromptCache, PromptCacheStats, cached_prefill_logits
from rlx_lm.registry import (
    ModelRegistration,
    auto_runner_name,
    find_registration,
    match_architectures,
    register_model,
    registered_models,
)
from rlx_lm.runner import (
    FullLmRunner,
    LmCore,
    LmRunner,
    Logits,
    RunnerAdapter,
    SupportsBatchedDecode,
    SupportsHostDriven,
    SupportsKvStats,
    SupportsMultimodal,
    SupportsPromptCache,
    as_logits,
    greedy_generate,
    supports_batched_decode,
    supports_generate,
    supports_host_driven,
    supports_kv_stats,
    supports_multimodal,
    supports_prompt_cache,
    with_defaults,
)
from rlx_lm.sample_opts import MirostatMode, SampleOpts
from rlx_lm.session import ModelFingerprint, SessionSnapshot
from rlx_lm.tokenizer import IncrementalDetokenizer, Tokenizer
from rlx_lm.weight_report import WeightReport, inspect
from rlx_lm.weights import WeightFormat

__all__ = [
    "CapacityError",
    "ChatTemplate",
    "ChatTemplateError",
    "ChatTemplates",
    "ConfigSource",
    "Device",
    "DtypeError",
    "FullLmRunner",
    "GenerationChunk",
    "GenerationEvent",
    "GenerationResult",
    "HostDriven",
    "IncrementalDetokenizer",
    "InternalError",
    "InvalidLogitsError",
    "InvalidOptionError",
    "KvCache",
    "KvSnapshot",
    "LmCore",
    "LmRunner",
    "LmRunnerBuilder",
    "Logits",
    "MirostatMode",
    "ModelFingerprint",
    "ModelRegistration",
    "PromptCache",
    "PromptCacheStats",
    "RlxError",
    "RunnerAdapter",
    "SampleOpts",
    "SampleResult",
    "SamplerChain",
    "SequenceStateError",
    "SessionSnapshot",
    "ShapeError",
    "SnapshotMismatchError",
    "SupportsBatchedDecode",
    "SupportsHostDriven",
    "SupportsKvStats",
    "SupportsMultimodal",
    "SupportsPromptCache",
    "TokenLogprob",
    "TokenOutOfRangeError",
    "Tokenizer",
    "UnknownArchitectureError",
    "UnsupportedError",
    "WeightFormat",
    "WeightFormatError",
    "WeightReport",
    "__version__",
    "argmax",
    "as_logits",
    "auto_runner_name",
    "build_profile",
    "cached_prefill_logits",
    "find_registration",
    "generate",
    "greedy_generate",
    "inspect",
    "load_default",
    "load_model",
    "match_architectures",
    "register_model",
    "registered_models",
    "stream",
    "supports_batched_decode",
    "supports_generate",
    "supports_host_driven",
    "supports_kv_stats",
    "supports_multimodal",
    "supports_prompt_cache",
    "with_defaults",
]
