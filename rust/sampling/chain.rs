//! The sampler chain: a built sequence of stages with its selector and
//! per-sequence state, and one sampling call from a logits row to a token.

use super::candidates::{Cand, Order, RowRef, Work};
use super::deferred::{self, Edits, Plan};
use super::dense::{self, Gathered};
use super::dist::{self, Stream};
use super::dry::Dry;
use super::logprobs::{dense_logprobs, final_logprobs};
use super::mirostat::{self, Surprises};
use super::order::preset_order;
use super::penalties::Penalties;
use super::stages::{MinKeep, Pass};
use super::temperature;
use super::window_counts::WindowCounts;
use crate::error::{CoreError, CoreResult};

pub use super::knobs::{Knobs, Mirostat};
pub use super::logprobs::{LogprobMode, Logprobs};
pub use super::order::{Flavor, OrderSpec, Stage, PRESETS};
pub use super::state::ChainState;

/// The stage that picks the token at the end of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selector {
    /// An argmax over the raw row: the chain is pure greedy.
    Argmax,
    /// The seeded draw.
    Dist,
    MirostatV1,
    MirostatV2,
}

/// How a sampling call first reads the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FirstPass {
    /// Find the maximum (and NaN).
    Scan,
    /// The first stage edits logits: copy the row while scanning it.
    Copy,
}

/// The tokens so far: the prompt's `prompt_len` first, then the output.
///
/// Every stage sees all of `tokens` (within the penalty window), except
/// under vLLM's rule, where frequency and presence count the output only.
#[derive(Clone, Copy, Debug, Default)]
pub struct History<'a> {
    pub tokens: &'a [u32],
    pub prompt_len: usize,
}

impl<'a> History<'a> {
    /// A history that is all output (`prompt_len` 0).
    pub fn output(tokens: &'a [u32]) -> Self {
        History {
            tokens,
            prompt_len: 0,
        }
    }
}

/// The result of one sampling call.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Mirostat's surprises, for `accept`.
    pub surprises: Option<Surprises>,
    pub logprobs: Option<Logprobs>,
}

/// Reusable buffers for sampling calls (one per thread); contents never
/// affect results.
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    pub(crate) row: Vec<f32>,
    pub(crate) exps: Vec<f32>,
    pub(crate) cands: Vec<Cand>,
    pub(crate) cands2: Vec<Cand>,
    pub(crate) floats: Vec<f32>,
    pub(crate) counts: Vec<u32>,
    pub(crate) probs: Vec<f64>,
    pub(crate) window_counts: WindowCounts,
    pub(crate) gathered: Gathered,
    /// Masses of the candidates, when the last stage left them for the draw.
    pub(crate) masses: Vec<f32>,
    pub(crate) delta_top_k: f32,
    pub(crate) delta_top_p: f32,
}

/// A built chain: knobs, stage order, selector, and the per-sequence state
/// (`step`, mirostat's `mu`).
#[derive(Clone, Debug)]
pub struct SamplerChain {
    knobs: Knobs,
    stages: Vec<Stage>,
    selector: Selector,
    pub(crate) flavor: Flavor,
    order_name: String,
    /// Top-k's k, with min_keep folded in where the order honours it.
    pub(crate) top_k: usize,
    /// The order as asked for (kept so a state can rebuild the chain).
    order_spec: OrderSpec,
    pub(crate) penalties: Penalties,
    pub(crate) dry: Dry,
    pub(crate) bias: Vec<(u32, f32)>,
    max_bias_token: Option<u32>,
    /// Tokens accepted so far (the draw's counter).
    pub step: u64,
    /// The sequence id keyed into the draw.
    pub sequence: u64,
    mu: f32,
    pending: Option<Surprises>,
    /// The length of the last row sampled (bounds `accept`'s token).
    vocab: Option<usize>,
    first_pass: FirstPass,
    /// Leading edits run on the top-k's candidates rather than the row.
    deferred: Option<Plan>,
}

impl SamplerChain {
    /// Build a chain from knobs and an order.
    pub fn new(knobs: Knobs, order: &OrderSpec, sequence: u64) -> CoreResult<Self> {
        knobs.validate()?;
        let mut force_temperature = false;
        let (stages, flavor, order_name) = match order {
            OrderSpec::Preset(name) => {
                let (all, flavor) = preset_order(name).ok_or_else(|| {
                    CoreError::option(
                        "order",
                        format!(
                            "unknown preset {name:?}; expected one of {} or a list of stage names",
                            PRESETS.map(|p| format!("{p:?}")).join(", ")
                        ),
                    )
                })?;
                let stages = if name == "llama.cpp" && knobs.mirostat != Mirostat::Off {
                    let dropped: Vec<&str> = all
                        .iter()
                        .filter(|s| {
                            !matches!(s, Stage::LogitBias | Stage::Temperature)
                                && knobs.enables(**s)
                        })
                        .map(|s| s.name())
                        .collect();
                    if !dropped.is_empty() || knobs.dynamic_temp.is_some() {
                        return Err(CoreError::option(
                            "order",
                            format!(
                                "llama.cpp runs mirostat after temperature alone; these knobs would be ignored: {}",
                                if dropped.is_empty() { "dynamic_temp".to_owned() } else { dropped.join(", ") }
                            ),
                        ));
                    }
                    // llama.cpp's mirostat chain: logit bias, temperature
                    // (at 0 it keeps only the argmax), mirostat.
                    force_temperature = true;
                    vec![Stage::LogitBias, Stage::Temperature]
                } else {
                    all
                };
                (stages, flavor, name.clone())
            }
            OrderSpec::Custom(names) => {
                let mut stages = Vec::new();
                for n in names {
                    let s = Stage::parse(n).ok_or_else(|| {
                        CoreError::option(
                            "order",
                            format!(
                                "unknown stage {n:?}; stages are {}",
                                Stage::DEFAULT_ORDER.map(|s| s.name()).join(", ")
                            ),
                        )
                    })?;
                    if stages.contains(&s) {
                        return Err(CoreError::option(
                            "order",
                            format!("stage {n:?} is listed twice"),
                        ));
                    }
                    stages.push(s);
                }
                for s in Stage::DEFAULT_ORDER {
                    if knobs.enables(s) && !stages.contains(&s) {
                        return Err(CoreError::option(
                            "order",
                            format!(
                                "stage {:?} is set by the options but missing from the order",
                                s.name()
                            ),
                        ));
                    }
                }
                (stages, Flavor::OURS, "custom".to_owned())
            }
        };
        let stages: Vec<Stage> = stages
            .into_iter()
            .filter(|s| knobs.enables(*s) || (force_temperature && *s == Stage::Temperature))
            .collect();
        // Top-k keeps at least min_keep where the engine's does (Hugging Face,
        // and the default order); elsewhere a min_keep no stage reads is refused.
        let top_k_min_keep = flavor.top_k_min_keep;
        let top_k = if top_k_min_keep && knobs.top_k > 0 {
            knobs.top_k.max(knobs.min_keep)
        } else {
            knobs.top_k
        };
        if knobs.min_keep > 1 {
            let reads = |s: &Stage| match s.spec().min_keep {
                MinKeep::Always => true,
                MinKeep::Flavor => top_k_min_keep,
                MinKeep::Never => false,
            };
            if !stages.iter().any(reads) {
                return Err(CoreError::option(
                    "min_keep",
                    format!(
                        "{} but no stage of this chain reads it (top_p, min_p, typical, xtc{}); \
                         leave it at 1 or set one of them",
                        knobs.min_keep,
                        if top_k_min_keep { ", top_k" } else { "" }
                    ),
                ));
            }
        }
        let selector = match knobs.mirostat {
            Mirostat::V1 => Selector::MirostatV1,
            Mirostat::V2 => Selector::MirostatV2,
            Mirostat::Off => {
                if stages == [Stage::Temperature]
                    && knobs.temperature <= 0.0
                    && knobs.dynamic_temp.is_none()
                {
                    Selector::Argmax
                } else {
                    Selector::Dist
                }
            }
        };
        let penalties = knobs.penalties(&flavor);
        // vLLM's prompt/output split needs two counts per token, which the
        // deferred edits do not keep: such chains edit the row itself.
        let deferred = if penalties.output_only
            && (knobs.frequency_penalty != 0.0 || knobs.presence_penalty != 0.0)
        {
            None
        } else {
            Plan::for_chain(&stages, &knobs)
        };
        let first_pass = match stages.first() {
            Some(s) if s.spec().edits && deferred.is_none() => FirstPass::Copy,
            _ => FirstPass::Scan,
        };
        let mut bias = knobs.logit_bias.clone();
        bias.sort_unstable_by_key(|&(t, _)| t);
        let max_bias_token = bias.last().map(|&(t, _)| t);
        Ok(SamplerChain {
            penalties,
            dry: knobs.dry(),
            top_k,
            bias,
            max_bias_token,
            mu: bounded_mu(2.0 * knobs.mirostat_tau as f64, 0.0),
            knobs,
            stages,
            selector,
            flavor,
            order_name,
            order_spec: order.clone(),
            step: 0,
            sequence,
            pending: None,
            vocab: None,
            first_pass,
            deferred,
        })
    }

    /// The knobs the chain was built from.
    pub fn knobs(&self) -> &Knobs {
        &self.knobs
    }

    /// The stages that run, in order (disabled ones are left out).
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// The selector at the end of the chain.
    pub fn selector(&self) -> Selector {
        self.selector
    }

    /// The order's name ("default", a preset, or "custom").
    pub fn order_name(&self) -> &str {
        &self.order_name
    }

    /// Mirostat's current `mu` (`None` without mirostat).
    pub fn mu(&self) -> Option<f32> {
        (self.knobs.mirostat != Mirostat::Off).then_some(self.mu)
    }

    /// Sample one row at the chain's step and accept the token, as
    /// llama.cpp's `llama_sampler_sample` does: the step (and mirostat's
    /// `mu`) move on, so the next call draws a fresh random number. The
    /// token is still a pure function of (row, history, seed, sequence, step).
    pub fn sample(
        &mut self,
        row: &[f32],
        history: History<'_>,
        uniform: Option<f64>,
        logprobs: Option<(usize, LogprobMode)>,
        scratch: &mut Scratch,
    ) -> CoreResult<Sampled> {
        let out = self.sample_row(row, history, self.sequence, uniform, logprobs, scratch)?;
        self.vocab = Some(row.len());
        self.pending = None;
        self.learn(out.token, out.surprises.as_deref());
        Ok(out)
    }

    /// The token [`Self::sample`] would return, without moving the chain on:
    /// for callers that choose the token themselves (speculative decoding,
    /// constrained search). What mirostat needs is kept for a later
    /// [`Self::accept`] of whichever token is emitted.
    pub fn peek(
        &mut self,
        row: &[f32],
        history: History<'_>,
        uniform: Option<f64>,
        logprobs: Option<(usize, LogprobMode)>,
        scratch: &mut Scratch,
    ) -> CoreResult<Sampled> {
        let mut out = self.sample_row(row, history, self.sequence, uniform, logprobs, scratch)?;
        self.vocab = Some(row.len());
        self.pending = out.surprises.take();
        Ok(out)
    }

    /// Record that `token` was emitted after a [`Self::peek`]: advance the
    /// step and mirostat's `mu`. A token outside the vocabulary of the last
    /// row is refused and changes nothing.
    ///
    /// `mu` learns from the surprise of `token` under the distribution of the
    /// last `peek`; a token outside that distribution leaves `mu` as is.
    pub fn accept(&mut self, token: u32) -> CoreResult<()> {
        if let Some(v) = self.vocab {
            if token as usize >= v {
                return Err(CoreError::TokenOutOfRange {
                    token: token as i64,
                    vocab: v,
                });
            }
        }
        let pending = self.pending.take();
        self.learn(token, pending.as_deref());
        Ok(())
    }

    /// Advance the step, and move `mu` by `token`'s surprise in `s`.
    fn learn(&mut self, token: u32, s: Option<&[(u32, f32)]>) {
        if let Some(s) = s {
            if let Ok(i) = s.binary_search_by_key(&token, |&(t, _)| t) {
                let k = &self.knobs;
                let step = k.mirostat_eta as f64 * (s[i].1 as f64 - k.mirostat_tau as f64);
                self.mu = bounded_mu(self.mu as f64 - step, self.mu);
            }
        }
        self.step += 1;
    }

    /// Move one step on after a batch drawn at this step.
    pub(crate) fn advance(&mut self, vocab: usize) {
        self.vocab = Some(vocab);
        self.pending = None;
        self.step += 1;
    }

    /// The vocabulary size of the last row sampled, if any.
    pub fn vocab(&self) -> Option<usize> {
        self.vocab
    }

    /// Back to step 0 and the initial `mu` (the seed is kept, so the same
    /// tokens come out again).
    pub fn reset(&mut self) {
        self.step = 0;
        self.mu = bounded_mu(2.0 * self.knobs.mirostat_tau as f64, 0.0);
        self.pending = None;
    }

    /// Everything needed to rebuild this chain where it is ([`Self::from_state`]).
    pub fn state(&self) -> ChainState {
        ChainState {
            knobs: self.knobs.clone(),
            order: self.order_spec.clone(),
            sequence: self.sequence,
            step: self.step,
            mu: self.mu,
            pending: self.pending.clone(),
            vocab: self.vocab.map(|v| v as u64),
        }
    }

    /// Rebuild a chain from [`Self::state`], validating the knobs and order
    /// as [`Self::new`] does.
    pub fn from_state(state: ChainState) -> CoreResult<Self> {
        let mut c = SamplerChain::new(state.knobs, &state.order, state.sequence)?;
        if !state.mu.is_finite() {
            return Err(CoreError::Format(format!(
                "not a sampler chain state: mu is {}",
                state.mu
            )));
        }
        if let Some(p) = &state.pending {
            if !p.windows(2).all(|w| w[0].0 < w[1].0) {
                return Err(CoreError::Format(
                    "not a sampler chain state: pending surprises are not sorted by token".into(),
                ));
            }
        }
        c.step = state.step;
        c.mu = state.mu;
        c.pending = state.pending;
        c.vocab = match state.vocab {
            None => None,
            Some(v) => Some(usize::try_from(v).map_err(|_| {
                CoreError::Format("not a sampler chain state: vocab too large".into())
            })?),
        };
        Ok(c)
    }

    /// Sample one row as sequence `sequence` at the chain's current step
    /// (the building block of [`Self::sample`], [`Self::peek`] and batches).
    ///
    /// Pure with respect to the chain: the state is read, never written
    /// (scratch buffers aside), so calling it twice gives the same token.
    /// `uniform`, when given, replaces the generator's draw.
    pub fn sample_row(
        &self,
        row: &[f32],
        history: History<'_>,
        sequence: u64,
        uniform: Option<f64>,
        logprobs: Option<(usize, LogprobMode)>,
        scratch: &mut Scratch,
    ) -> CoreResult<Sampled> {
        if row.is_empty() {
            return Err(CoreError::EmptyLogits);
        }
        let History {
            tokens: history,
            prompt_len,
        } = history;
        let mut cands = std::mem::take(&mut scratch.cands);
        cands.clear();
        let mut copy = None;
        let (best, max, nan) = match self.first_pass {
            FirstPass::Scan => dense::argmax_nan(row),
            FirstPass::Copy => {
                let mut v = std::mem::take(&mut scratch.row);
                let r = dense::copy_argmax_nan(row, &mut v);
                copy = Some(v);
                r
            }
        };
        let restore = |scratch: &mut Scratch, cands: Vec<Cand>, copy: Option<Vec<f32>>| {
            scratch.cands = cands;
            if let Some(v) = copy {
                scratch.row = v;
            }
        };
        if nan {
            restore(scratch, cands, copy);
            let index = row.iter().position(|v| v.is_nan()).unwrap_or(0);
            return Err(CoreError::NanLogit { index });
        }
        if max == f32::NEG_INFINITY {
            restore(scratch, cands, copy);
            return Err(CoreError::AllBanned);
        }
        let vocab = row.len();
        let hist_max = max_u32(history);
        let bad_token = if hist_max as usize >= vocab {
            history.iter().copied().find(|&t| t as usize >= vocab)
        } else {
            None
        }
        .or(self.max_bias_token.filter(|&t| t as usize >= vocab));
        if let Some(t) = bad_token {
            restore(scratch, cands, copy);
            return Err(CoreError::TokenOutOfRange {
                token: t as i64,
                vocab,
            });
        }
        if let Some(u) = uniform {
            if !(0.0..1.0).contains(&u) {
                restore(scratch, cands, copy);
                return Err(CoreError::option(
                    "uniform",
                    format!("must be in [0, 1), got {u}"),
                ));
            }
        }
        if self.selector == Selector::Argmax && logprobs.is_none() {
            restore(scratch, cands, copy);
            return Ok(Sampled {
                token: best as u32,
                surprises: None,
                logprobs: None,
            });
        }
        if scratch.counts.len() < vocab {
            scratch.counts.resize(vocab, 0);
        }
        let row_ref = match copy {
            Some(v) => RowRef::Owned(v),
            None => RowRef::Borrowed(row),
        };
        let mut work = Work::from_row(row_ref, best, max, cands);
        work.spare_row = Some(std::mem::take(&mut scratch.row));
        work.spare_cands = std::mem::take(&mut scratch.cands2);
        work.spare_f32 = std::mem::take(&mut scratch.floats);
        work.spare_gathered = std::mem::take(&mut scratch.gathered);
        if max == f32::INFINITY {
            // +inf logits hold all the mass, shared equally.
            work.cands.clear();
            for (i, &v) in row.iter().enumerate() {
                if v == f32::INFINITY {
                    work.cands.push(Cand {
                        id: i as u32,
                        logit: 0.0,
                    });
                }
            }
            work.release_dense();
        }
        let result = self.run(
            &mut work,
            History {
                tokens: history,
                prompt_len,
            },
            sequence,
            uniform,
            logprobs,
            row,
            scratch,
        );
        let buffers = work.into_buffers();
        scratch.cands = buffers.cands;
        scratch.cands2 = buffers.cands2;
        scratch.floats = buffers.floats;
        scratch.gathered = buffers.gathered;
        if let Some(v) = buffers.row {
            scratch.row = v;
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        work: &mut Work<'_>,
        history: History<'_>,
        sequence: u64,
        uniform: Option<f64>,
        logprobs: Option<(usize, LogprobMode)>,
        row: &[f32],
        scratch: &mut Scratch,
    ) -> CoreResult<Sampled> {
        let k = &self.knobs;
        let step = self.step;
        let History {
            tokens: history,
            prompt_len,
        } = history;
        let mut stages: &[Stage] = &self.stages;
        if let (Some(plan), Some(d)) = (&self.deferred, &work.dense) {
            if plan.edits.contains(&Stage::Penalties) {
                scratch
                    .window_counts
                    .sync(self.penalties.window(history), row.len());
            }
            let dry_lengths = if plan.edits.contains(&Stage::Dry) {
                self.dry.lengths(history, &mut scratch.counts)
            } else {
                Vec::new()
            };
            let edits = Edits {
                stages: &plan.edits,
                bias: &self.bias,
                penalties: &self.penalties,
                counts: &scratch.window_counts,
                dry: &self.dry,
                dry_lengths: &dry_lengths,
            };
            let mut out = std::mem::take(&mut work.cands);
            let found = deferred::top_k(
                d.row.as_slice(),
                d.max,
                self.top_k,
                self.flavor.top_k_keep_ties,
                &mut scratch.delta_top_k,
                &edits,
                &mut out,
            );
            work.cands = out;
            found?;
            work.order = Order::Desc;
            work.release_dense();
            if plan.temperature {
                temperature::apply(work, k.temperature);
            }
            stages = &self.stages[plan.resume..];
        }
        let mut masses_ready = false;
        for (si, &stage) in stages.iter().enumerate() {
            let spec = stage.spec();
            if !spec.edits {
                work.refresh()?;
            }
            let mut pass = Pass {
                work: &mut *work,
                history,
                prompt_len,
                sequence,
                step,
                scratch: &mut *scratch,
                last: si + 1 == stages.len() && self.selector == Selector::Dist,
            };
            masses_ready = (spec.apply)(self, &mut pass)?;
        }
        work.refresh()?;
        if work.dense.is_none() && work.cands.is_empty() {
            // No stage empties the set (each keeps min_keep >= 1); a guard,
            // not a path: an error rather than a panic in the draw.
            return Err(CoreError::AllBanned);
        }
        let u = uniform.unwrap_or_else(|| dist::uniform(k.seed, sequence, step, Stream::Draw));
        let (chosen, surprises) = match self.selector {
            Selector::Argmax | Selector::Dist => {
                let c = if masses_ready && work.dense.is_none() {
                    dist::draw_with_masses(&work.cands, &scratch.masses, u)
                } else {
                    dist::draw(work, u, &mut scratch.exps).0
                };
                (c, None)
            }
            Selector::MirostatV1 => {
                let (c, s) = mirostat::v1(
                    work,
                    self.mu,
                    k.mirostat_m,
                    row.len(),
                    u,
                    &mut scratch.delta_top_k,
                    &mut scratch.exps,
                );
                (c, Some(s))
            }
            Selector::MirostatV2 => {
                let (c, s) = mirostat::v2(
                    work,
                    self.mu,
                    u,
                    &mut scratch.delta_top_k,
                    &mut scratch.exps,
                );
                (c, Some(s))
            }
        };
        let logprobs = match logprobs {
            None => None,
            Some((n, LogprobMode::Final)) => {
                Some(final_logprobs(work, chosen.id, n, &mut scratch.delta_top_k))
            }
            Some((n, LogprobMode::Raw)) => Some(dense_logprobs(
                row,
                1.0,
                chosen.id,
                n,
                &mut scratch.delta_top_k,
            )),
            Some((n, LogprobMode::Penalized)) => {
                let (am, mx, _) = dense::argmax_nan(row);
                let mut w = Work::from_row(RowRef::Borrowed(row), am, mx, Vec::new());
                if w.max_logit() == f32::INFINITY {
                    Some(dense_logprobs(
                        row,
                        1.0,
                        chosen.id,
                        n,
                        &mut scratch.delta_top_k,
                    ))
                } else {
                    for &stage in &self.stages {
                        let spec = stage.spec();
                        if spec.edits {
                            let mut pass = Pass {
                                work: &mut w,
                                history,
                                prompt_len,
                                sequence,
                                step,
                                scratch: &mut *scratch,
                                last: false,
                            };
                            (spec.apply)(self, &mut pass)?;
                        }
                    }
                    w.refresh()?;
                    let d = w.dense.as_ref().map(|d| d.row.as_slice()).unwrap_or(row);
                    Some(dense_logprobs(
                        d,
                        1.0,
                        chosen.id,
                        n,
                        &mut scratch.delta_top_k,
                    ))
                }
            }
        };
        Ok(Sampled {
            token: chosen.id,
            surprises,
            logprobs,
        })
    }
}

/// Mirostat's `mu` as float32: finite whatever the surprises and knobs (an
/// update that overflows saturates at the float32 range, which already keeps
/// only the best token or every token; a NaN update, `0 * inf`, is dropped).
fn bounded_mu(mu: f64, previous: f32) -> f32 {
    if mu.is_nan() {
        previous
    } else {
        mu.clamp(-f32::MAX as f64, f32::MAX as f64) as f32
    }
}

/// The largest value (0 for none), lane-wise so that it vectorises.
fn max_u32(v: &[u32]) -> u32 {
    let mut m = [0u32; 16];
    let chunks = v.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            m[i] = m[i].max(c[i]);
        }
    }
    m.iter().chain(tail).fold(0u32, |a, &b| a.max(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_u32_matches_iter_max() {
        for n in [0usize, 1, 15, 16, 17, 100] {
            let v: Vec<u32> = (0..n as u32)
                .map(|i| i.wrapping_mul(2_654_435_761) >> 3)
                .collect();
            assert_eq!(max_u32(&v), v.iter().copied().max().unwrap_or(0), "n {n}");
        }
    }

    fn chain(f: impl FnOnce(&mut Knobs)) -> SamplerChain {
        let mut k = Knobs {
            seed: 1,
            ..Knobs::default()
        };
        f(&mut k);
        SamplerChain::new(k, &OrderSpec::Preset("default".into()), 0).unwrap()
    }

    fn token(c: &SamplerChain, row: &[f32], history: &[u32]) -> CoreResult<u32> {
        Ok(c.sample_row(
            row,
            History::output(history),
            0,
            None,
            None,
            &mut Scratch::default(),
        )?
        .token)
    }

    #[test]
    fn greedy_is_the_first_argmax() {
        let row = [0.0, 3.0, 1.0, 3.0];
        assert_eq!(token(&chain(|_| {}), &row, &[]), Ok(1));
    }

    #[test]
    fn a_penalised_argmax_hands_over_to_the_next_best() {
        // The edit lowers the maximum itself, so the max must be recomputed.
        let c = chain(|k| k.presence_penalty = 5.0);
        assert_eq!(token(&c, &[0.0, 3.0, 1.0, 2.5], &[1]), Ok(3));
        // And a raised token takes over without a rescan.
        let c = chain(|k| k.logit_bias = vec![(0, 10.0)]);
        assert_eq!(token(&c, &[0.0, 3.0, 1.0, 2.5], &[]), Ok(0));
    }

    #[test]
    fn banning_every_token_is_an_error_not_a_token() {
        let c = chain(|k| k.logit_bias = vec![(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)]);
        assert_eq!(token(&c, &[1.0, 2.0], &[]), Err(CoreError::AllBanned));
        let c = chain(|k| k.temperature = 1.0);
        assert_eq!(
            token(&c, &[1.0, f32::NAN], &[]),
            Err(CoreError::NanLogit { index: 1 })
        );
        assert_eq!(
            token(&c, &[1.0, 2.0], &[2]),
            Err(CoreError::TokenOutOfRange { token: 2, vocab: 2 })
        );
    }

    #[test]
    fn sampling_is_pure_and_accept_moves_the_step() {
        let mut c = chain(|k| k.temperature = 1.0);
        let row = vec![0.0f32; 1000];
        let a = token(&c, &row, &[]).unwrap();
        assert_eq!(token(&c, &row, &[]), Ok(a));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            let t = token(&c, &row, &[]).unwrap();
            seen.insert(t);
            c.accept(t).unwrap();
        }
        assert_eq!(c.step, 50);
        assert!(seen.len() > 40, "a uniform row should give varied tokens");
    }
}
