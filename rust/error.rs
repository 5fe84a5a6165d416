//! The one error type of the core: what went wrong, with the offending value.

use std::fmt;

/// Result alias used across the core.
pub type CoreResult<T> = Result<T, CoreError>;

/// Every way core work can refuse its input.
///
/// Each variant maps to one Python exception class in `rlx_lm.errors`
/// (see `py/errors.rs`); nothing user-supplied reaches a panic.
#[derive(Debug, Clone, PartialEq)]
pub enum CoreError {
    /// A logits row with no entries.
    EmptyLogits,
    /// A NaN logit, at this index.
    NanLogit { index: usize },
    /// Every logit is `-inf`: no token is allowed.
    AllBanned,
    /// A bug: a panic inside the core, caught at the binding's boundary
    /// (the message says where). Never the answer to bad input.
    Internal(String),
    /// A token id outside `0..vocab`.
    TokenOutOfRange { token: i64, vocab: usize },
    /// A value given as a token id that no vocabulary holds (negative, or
    /// beyond `u32`); the message names where it was given.
    TokenId(String),
    /// A call out of order or on an object that is busy (for example a
    /// sampler chain re-entered from its own arguments).
    SequenceState(String),
    /// An option or argument with an invalid value; `field` names it.
    InvalidOption { field: String, reason: String },
    /// An array of the wrong shape.
    Shape(String),
    /// A write that would exceed a fixed capacity.
    Capacity { needed: usize, capacity: usize },
    /// A snapshot that does not belong to this model or cache.
    SnapshotMismatch(String),
    /// A malformed, truncated or hostile weight or snapshot file.
    Format(String),
    /// A call this object cannot serve (for example a batch of mirostat rows).
    Unsupported(String),
    /// An array of the wrong dtype or memory layout (the message says how to convert).
    Dtype(String),
    /// An argument of the wrong Python type altogether.
    Type(String),
    /// The operating system refused a read or write (a full disk, a closed file).
    Io(String),
    /// Memory or threads for a result could not be had.
    OutOfMemory(String),
}

impl CoreError {
    /// Shorthand for [`CoreError::InvalidOption`].
    pub fn option(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidOption {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyLogits => write!(f, "logits row is empty"),
            Self::NanLogit { index } => write!(f, "logits contain NaN at position {index}"),
            Self::AllBanned => write!(
                f,
                "every logit is -inf: all tokens are banned, there is nothing to pick"
            ),
            Self::TokenOutOfRange { token, vocab } => {
                write!(
                    f,
                    "token id {token} is out of range for a vocabulary of {vocab}"
                )
            }
            Self::Internal(msg) => write!(
                f,
                "internal error in rlx_lm's core (please report it): {msg}"
            ),
            Self::InvalidOption { field, reason } => write!(f, "{field}: {reason}"),
            Self::Shape(msg)
            | Self::SnapshotMismatch(msg)
            | Self::Format(msg)
            | Self::Unsupported(msg)
            | Self::Dtype(msg)
            | Self::TokenId(msg)
            | Self::SequenceState(msg)
            | Self::Type(msg)
            | Self::Io(msg)
            | Self::OutOfMemory(msg) => f.write_str(msg),
            Self::Capacity { needed, capacity } => write!(
                f,
                "capacity exceeded: {needed} tokens needed, capacity is {capacity}"
            ),
        }
    }
}

impl std::error::Error for CoreError {}
