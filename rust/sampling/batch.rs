//! Many rows at one step: each row is its own sequence, sampled in parallel
//! on the process's shared pool ([`crate::per_process::shared_pool`], made
//! again in a forked child) when the batch is large enough to pay for
//! waking it.

use super::chain::{History, SamplerChain, Scratch, Selector};
use crate::error::{CoreError, CoreResult};

/// One batch: `rows` rows of `vocab` logits, row-major, with one history
/// and one sequence id per row, and optionally one uniform per row.
pub struct Batch<'a, H: AsRef<[u32]> + Sync> {
    pub logits: &'a [f32],
    pub vocab: usize,
    pub histories: &'a [H],
    /// Each history's prompt length (`None`: all output).
    pub prompt_lens: Option<&'a [usize]>,
    pub sequences: &'a [u64],
    pub uniforms: Option<&'a [f64]>,
}

/// Below about a million logits the pool's wake-up costs more than it saves.
const PARALLEL_LOGITS: usize = 1 << 20;

impl SamplerChain {
    /// Sample every row of `batch` at the chain's current step (the chain
    /// itself is not moved on: see [`Self::sample_batch`]). `scratches`
    /// grows to one buffer set per share and is kept for the next call.
    pub fn sample_rows<H: AsRef<[u32]> + Sync>(
        &self,
        batch: &Batch<'_, H>,
        scratches: &mut Vec<Scratch>,
    ) -> CoreResult<Vec<i64>> {
        if matches!(self.selector(), Selector::MirostatV1 | Selector::MirostatV2) {
            return Err(CoreError::Unsupported(
                "sample_batch: mirostat keeps one mu per sequence; use one chain per sequence"
                    .into(),
            ));
        }
        let vocab = batch.vocab;
        if vocab == 0 || !batch.logits.len().is_multiple_of(vocab) {
            return Err(CoreError::Shape(format!(
                "logits must be (rows, vocab) with vocab > 0, got {} values for vocab {vocab}",
                batch.logits.len()
            )));
        }
        let rows = batch.logits.len() / vocab;
        for (what, n) in [
            ("histories", batch.histories.len()),
            ("sequence_ids", batch.sequences.len()),
            ("uniforms", batch.uniforms.map_or(rows, |u| u.len())),
            ("prompt_lens", batch.prompt_lens.map_or(rows, |u| u.len())),
        ] {
            if n != rows {
                return Err(CoreError::Shape(format!(
                    "{what} has {n} entries for {rows} rows of logits"
                )));
            }
        }
        if let Some(p) = batch.prompt_lens {
            if let Some(r) = (0..rows).find(|&r| p[r] > batch.histories[r].as_ref().len()) {
                return Err(CoreError::option(
                    "prompt_lens",
                    format!(
                        "row {r}: {} is longer than its history ({} tokens)",
                        p[r],
                        batch.histories[r].as_ref().len()
                    ),
                ));
            }
        }
        if let Some(u) = batch.uniforms {
            if let Some(x) = u.iter().find(|x| !(0.0..1.0).contains(*x)) {
                return Err(CoreError::option(
                    "uniform",
                    format!("must be in [0, 1), got {x}"),
                ));
            }
        }
        let pool = if rows >= 2 && rows * vocab >= PARALLEL_LOGITS {
            Some(crate::per_process::shared_pool()?)
        } else {
            None
        };
        let threads = pool
            .as_ref()
            .map_or(1, |p| p.current_num_threads().min(rows).min(16));
        if scratches.len() < threads {
            scratches.resize_with(threads, Scratch::default);
        }
        let scratches = &mut scratches[..threads];
        let mut out = vec![0i64; rows];
        let per = rows.div_ceil(threads.max(1)).max(1);
        let run = |lo: usize, out: &mut [i64], scratch: &mut Scratch| -> CoreResult<()> {
            for (j, o) in out.iter_mut().enumerate() {
                let r = lo + j;
                let row = &batch.logits[r * vocab..(r + 1) * vocab];
                let u = batch.uniforms.map(|u| u[r]);
                *o = self
                    .sample_row(
                        row,
                        History {
                            tokens: batch.histories[r].as_ref(),
                            prompt_len: batch.prompt_lens.map_or(0, |p| p[r]),
                        },
                        batch.sequences[r],
                        u,
                        None,
                        scratch,
                    )?
                    .token as i64;
            }
            Ok(())
        };
        let pool = match pool {
            Some(p) if threads > 1 => p,
            _ => {
                run(0, &mut out, &mut scratches[0])?;
                return Ok(out);
            }
        };
        // The calling thread takes the first share; the others go to the
        // pool, whose threads are kept between calls (starting a thread per
        // call cost 25-70 us here).
        let mut shares: Vec<(&mut [i64], &mut Scratch)> =
            out.chunks_mut(per).zip(scratches.iter_mut()).collect();
        let (first, rest) = shares.split_at_mut(1);
        let mut rest_results: Vec<CoreResult<()>> = (0..rest.len()).map(|_| Ok(())).collect();
        let mut first_result = Ok(());
        pool.in_place_scope(|s| {
            for (i, ((chunk, scratch), slot)) in
                rest.iter_mut().zip(rest_results.iter_mut()).enumerate()
            {
                let run = &run;
                s.spawn(move |_| *slot = run((i + 1) * per, chunk, scratch));
            }
            let (chunk, scratch) = &mut first[0];
            first_result = run(0, chunk, scratch);
        });
        first_result?;
        for r in rest_results {
            r?;
        }
        Ok(out)
    }

    /// [`Self::sample_rows`], then move the chain one step on (every row
    /// was drawn at the same step), so the next batch draws fresh numbers.
    pub fn sample_batch<H: AsRef<[u32]> + Sync>(
        &mut self,
        batch: &Batch<'_, H>,
        scratches: &mut Vec<Scratch>,
    ) -> CoreResult<Vec<i64>> {
        let out = self.sample_rows(batch, scratches)?;
        self.advance(batch.vocab);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::chain::{Knobs, OrderSpec};

    #[test]
    fn a_batch_row_is_the_row_sampled_alone_and_the_batch_advances() {
        let knobs = Knobs {
            temperature: 1.0,
            seed: 3,
            ..Knobs::default()
        };
        let mut chain = SamplerChain::new(knobs, &OrderSpec::Preset("default".into()), 0).unwrap();
        let vocab = 50;
        let logits: Vec<f32> = (0..4 * vocab)
            .map(|i| ((i * 7) % 13) as f32 * 0.1)
            .collect();
        let hists: Vec<Vec<u32>> = vec![Vec::new(); 4];
        let seqs = [0u64, 1, 2, 3];
        let batch = Batch {
            logits: &logits,
            vocab,
            histories: &hists,
            prompt_lens: None,
            sequences: &seqs,
            uniforms: None,
        };
        let mut scratch = Vec::new();
        let got = chain.sample_batch(&batch, &mut scratch).unwrap();
        assert_eq!(chain.step, 1);
        for r in 0..4 {
            let alone = SamplerChain::new(
                chain.knobs().clone(),
                &OrderSpec::Preset("default".into()),
                seqs[r],
            )
            .unwrap()
            .sample_row(
                &logits[r * vocab..(r + 1) * vocab],
                History::output(&[]),
                seqs[r],
                None,
                None,
                &mut Scratch::default(),
            )
            .unwrap();
            assert_eq!(got[r], alone.token as i64);
        }
        let bad = Batch {
            sequences: &seqs[..3],
            ..batch
        };
        assert!(matches!(
            chain.sample_batch(&bad, &mut scratch),
            Err(CoreError::Shape(_))
        ));
        assert_eq!(chain.step, 1, "a refused batch changes nothing");
    }
}
