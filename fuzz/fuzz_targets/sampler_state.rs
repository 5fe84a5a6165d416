//! A pickled SamplerChain state from arbitrary bytes: refused with a typed
//! error or rebuilt, never a panic, and never an allocation larger than the
//! input can justify (libFuzzer's -rss_limit_mb / -malloc_limit_mb catch one).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlx_lm::sampling::chain::{ChainState, SamplerChain};

fuzz_target!(|data: &[u8]| {
    let Ok(state) = ChainState::from_bytes(data) else {
        return;
    };
    // What decodes re-encodes to something that decodes to the same state.
    let again = ChainState::from_bytes(&state.to_bytes()).expect("a state's own bytes decode");
    assert_eq!(again.to_bytes(), state.to_bytes());
    if let Ok(chain) = SamplerChain::from_state(state) {
        assert!(chain.mu().is_none_or(f32::is_finite));
    }
});
