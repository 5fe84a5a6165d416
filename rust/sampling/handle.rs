//! A chain with the buffers its calls reuse, and the bookkeeping of a batch
//! run without holding it: what a binding keeps per `SamplerChain` object.
//!
//! A batch runs on a copy of the chain and on buffers taken out of the
//! handle ([`ChainHandle::start_batch`]), so the caller can let other
//! threads use the handle meanwhile (the Python binding releases the GIL);
//! [`ChainHandle::finish_batch`] gives the buffers back and moves the
//! handle's chain on, counting whatever those threads did in between.

use super::batch::Batch;
use super::chain::{History, LogprobMode, Sampled, SamplerChain, Scratch, Selector};
use crate::error::{CoreError, CoreResult};

/// A chain and its buffers.
#[derive(Debug)]
pub struct ChainHandle {
    chain: SamplerChain,
    scratch: Scratch,
    /// One buffer set per share of a parallel batch, kept between batches.
    batch_scratch: Vec<Scratch>,
}

/// A batch in flight: a copy of the chain as it was when the batch started,
/// and the handle's batch buffers.
#[derive(Debug)]
pub struct BatchJob {
    chain: SamplerChain,
    scratches: Vec<Scratch>,
}

impl History<'_> {
    /// A history whose first `prompt_len` tokens are the prompt; refused
    /// when the prompt is longer than the history.
    pub fn with_prompt(tokens: &[u32], prompt_len: usize) -> CoreResult<History<'_>> {
        if prompt_len > tokens.len() {
            return Err(CoreError::option(
                "prompt_len",
                format!(
                    "{prompt_len} is longer than the history ({} tokens)",
                    tokens.len()
                ),
            ));
        }
        Ok(History { tokens, prompt_len })
    }
}

impl Selector {
    /// The selector's name, as `SamplerChain.stages` lists it last.
    pub fn name(self) -> &'static str {
        match self {
            Selector::Argmax => "argmax",
            Selector::Dist => "dist",
            Selector::MirostatV1 => "mirostat_v1",
            Selector::MirostatV2 => "mirostat_v2",
        }
    }
}

impl ChainHandle {
    pub fn new(chain: SamplerChain) -> Self {
        ChainHandle {
            chain,
            scratch: Scratch::default(),
            batch_scratch: Vec::new(),
        }
    }

    pub fn chain(&self) -> &SamplerChain {
        &self.chain
    }

    pub fn chain_mut(&mut self) -> &mut SamplerChain {
        &mut self.chain
    }

    /// The running stages' names, then the selector's.
    pub fn stage_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.chain.stages().iter().map(|s| s.name()).collect();
        names.push(self.chain.selector().name());
        names
    }

    /// One row, accepted ([`SamplerChain::sample`]) or, unless `advance`,
    /// peeked ([`SamplerChain::peek`]), with the handle's buffers.
    pub fn sample(
        &mut self,
        row: &[f32],
        history: History<'_>,
        uniform: Option<f64>,
        logprobs: Option<(usize, LogprobMode)>,
        advance: bool,
    ) -> CoreResult<Sampled> {
        let scratch = &mut self.scratch;
        if advance {
            self.chain.sample(row, history, uniform, logprobs, scratch)
        } else {
            self.chain.peek(row, history, uniform, logprobs, scratch)
        }
    }

    /// Start a batch: a copy of the chain as it is now, and the batch
    /// buffers (the handle keeps none until [`Self::finish_batch`]).
    pub fn start_batch(&mut self) -> BatchJob {
        BatchJob {
            chain: self.chain.clone(),
            scratches: std::mem::take(&mut self.batch_scratch),
        }
    }

    /// End a batch: keep its buffers (the larger set, when another batch
    /// ran meanwhile), and move the chain one step on if the batch gave
    /// tokens and `advance` asks for it. The batch's result is returned.
    pub fn finish_batch(
        &mut self,
        job: BatchJob,
        result: CoreResult<Vec<i64>>,
        vocab: usize,
        advance: bool,
    ) -> CoreResult<Vec<i64>> {
        if self.batch_scratch.len() < job.scratches.len() {
            self.batch_scratch = job.scratches;
        }
        let out = result?;
        if advance {
            self.chain.advance(vocab);
        }
        Ok(out)
    }
}

impl BatchJob {
    /// The sequence ids of `rows` rows when the caller gives none: the
    /// chain's own, then the next ones.
    pub fn default_sequences(&self, rows: usize) -> Vec<u64> {
        (0..rows as u64)
            .map(|r| self.chain.sequence.wrapping_add(r))
            .collect()
    }

    /// Sample every row at the step the chain had when the batch started.
    pub fn run<H: AsRef<[u32]> + Sync>(&mut self, batch: &Batch<'_, H>) -> CoreResult<Vec<i64>> {
        self.chain.sample_rows(batch, &mut self.scratches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::chain::{Knobs, OrderSpec};

    fn chain(temperature: f32) -> SamplerChain {
        let knobs = Knobs {
            temperature,
            seed: 9,
            ..Knobs::default()
        };
        SamplerChain::new(knobs, &OrderSpec::Preset("default".into()), 2).unwrap()
    }

    fn rows(n: usize, vocab: usize) -> Vec<f32> {
        (0..n * vocab)
            .map(|i| ((i * 7) % 11) as f32 * 0.3)
            .collect()
    }

    #[test]
    fn a_batch_keeps_its_buffers_and_moves_the_chain_on_once() {
        let mut h = ChainHandle::new(chain(1.0));
        let (n, vocab) = (3, 20);
        let logits = rows(n, vocab);
        let hists: Vec<Vec<u32>> = vec![vec![1, 2]; n];
        let mut job = h.start_batch();
        let seqs = job.default_sequences(n);
        assert_eq!(seqs, [2, 3, 4], "the chain's sequence, then the next ones");
        let batch = Batch {
            logits: &logits,
            vocab,
            histories: &hists,
            prompt_lens: None,
            sequences: &seqs,
            uniforms: None,
        };
        let got = job.run(&batch);
        // Meanwhile another caller samples one row on the handle: it counts too.
        h.sample(&logits[..vocab], History::output(&[]), None, None, true)
            .unwrap();
        let out = h.finish_batch(job, got, vocab, true).unwrap();
        assert_eq!(h.chain().step, 2, "one step for the row, one for the batch");
        assert_eq!(
            h.batch_scratch.len(),
            1,
            "the buffers are kept for the next batch"
        );
        // Each row is the row sampled alone at step 0 of its sequence.
        for (r, &tok) in out.iter().enumerate() {
            let alone = SamplerChain::new(
                h.chain().knobs().clone(),
                &OrderSpec::Preset("default".into()),
                seqs[r],
            )
            .unwrap()
            .peek(
                &logits[r * vocab..(r + 1) * vocab],
                History::output(&hists[r]),
                None,
                None,
                &mut Scratch::default(),
            )
            .unwrap();
            assert_eq!(tok, alone.token as i64, "row {r}");
        }
    }

    #[test]
    fn a_refused_or_peeked_batch_does_not_move_the_chain() {
        let mut h = ChainHandle::new(chain(1.0));
        let logits = rows(2, 10);
        let hists: Vec<Vec<u32>> = vec![Vec::new(); 2];
        let mut job = h.start_batch();
        let seqs = job.default_sequences(1); // one id for two rows: refused
        let bad = Batch {
            logits: &logits,
            vocab: 10,
            histories: &hists,
            prompt_lens: None,
            sequences: &seqs,
            uniforms: None,
        };
        let got = job.run(&bad);
        assert!(matches!(
            h.finish_batch(job, got, 10, true),
            Err(CoreError::Shape(_))
        ));
        assert_eq!(h.chain().step, 0);
        let mut job = h.start_batch();
        let seqs = job.default_sequences(2);
        let ok = Batch {
            sequences: &seqs,
            ..bad
        };
        let got = job.run(&ok);
        h.finish_batch(job, got, 10, false).unwrap();
        assert_eq!(h.chain().step, 0, "advance=false peeks");
    }

    #[test]
    fn peek_then_sample_and_the_stage_names() {
        let mut h = ChainHandle::new(chain(0.0));
        assert_eq!(h.stage_names(), ["temperature", "argmax"]);
        let row = [0.1f32, 2.0, 0.3];
        let t = h
            .sample(&row, History::output(&[]), None, None, false)
            .unwrap()
            .token;
        assert_eq!((t, h.chain().step), (1, 0));
        h.sample(&row, History::output(&[]), None, None, true)
            .unwrap();
        assert_eq!(h.chain().step, 1);
        assert_eq!(
            ChainHandle::new(chain(1.0)).stage_names(),
            ["temperature", "dist"]
        );
    }

    #[test]
    fn a_prompt_longer_than_its_history_is_refused_by_name() {
        assert!(History::with_prompt(&[1, 2], 2).is_ok());
        match History::with_prompt(&[1, 2], 3) {
            Err(e @ CoreError::InvalidOption { .. }) => {
                assert!(e.to_string().starts_with("prompt_len: 3 is longer"), "{e}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
