//! One decode step of one or more sequences (one new token each) as a single elastic job
//! of the model's [`Team`]: every member takes claimed row chunks of each
//! product and (KV head, span) tasks of attention, stage by stage (q/k/v,
//! attention, o, gate/up, down: five a block; a mixture of experts six:
//! o, router, every pick's gate/up, down), instead of a thread-pool
//! hand-off per product.
//!
//! There are no barriers: a stage begins when the items of the stage before
//! it are *done*, whoever did them. On a loaded machine a member that lost
//! its core holds back the others only while it holds a claim (at most one
//! chunk), and a member that is late does the rest alone; a barrier made
//! every member wait for the slowest to arrive, 150 times a step.
//!
//! Each member that takes part in a stage does the small per-row work
//! (norms, biases, RoPE, combining attention's spans, quantising
//! activations) itself on a private copy, which costs less than another
//! stage. The new keys and values are kept aside and appended to the
//! cache after the job, so the cache is only read while the team runs;
//! attention takes the new row from there, rounded to the cache's storage
//! type exactly as the append rounds it.
//!
//! Every value is computed by the same functions, in the same order, as
//! [`Model::forward`]'s general path: a decode step gives the same bits
//! either way (tested), whatever the number of threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::engine::attention::{attend_span, combine, slice_rows, span_of, spans, Scoring};
use crate::engine::experts::route;
use crate::engine::forward::{
    add_scaled, finish_logits, head_major, rms_heads, rms_rows, rope, rope_tables, scale_embedding,
    window_start, Model, Step,
};
use crate::engine::glu::glu;
use crate::engine::linear::RowPrep;
use crate::engine::team::{Member, Team};
use crate::engine::weights::{Ffn, Layer, Moe, Tensor};
use crate::kv::{convert_f32_to_f16, f16_to_f32, Dtype, Half, KvCache, Rows};
use crate::{CoreError, CoreResult};

/// Weight rows a claim holds with two or more members (a multiple of the
/// kernels' 16-row band; see [`Cuts`]). 128 against 64 made one
/// sequence's step 5-12% faster (fewer calls, each with its set-up and
/// first prefetches), eight sequences' the same within the noise; 32 made
/// eight sequences' 6% slower.
const CHUNK: usize = 128;
/// Rows a claim of the output head holds.
const HEAD_CHUNK: usize = 512;

/// The row ranges a product's weight rows are claimed in: `size` rows
/// each, or the whole product in one call for a team of one. Each call has
/// its set-up and first prefetches; with one member nothing is gained by
/// cutting, and the chunks cost one member 6-7% of a decode step
/// (SmolLM2-shaped Q8_0, 103 -> 109 tok/s). With two members, guided sizes
/// (a share of what is left, at least 32, 64 or 128 rows) measured no
/// better than a fixed 128 (docs/kernels.md).
#[derive(Debug)]
struct Cuts(Vec<usize>);

impl Cuts {
    fn new(rows: usize, threads: usize, size: usize) -> Self {
        let step = if threads <= 1 { rows.max(1) } else { size };
        let mut at: Vec<usize> = (0..rows).step_by(step).collect();
        at.push(rows);
        Self(at)
    }

    /// Claims in all.
    fn len(&self) -> usize {
        self.0.len() - 1
    }

    /// Rows of claim `i`.
    fn range(&self, i: usize) -> (usize, usize) {
        (self.0[i], self.0[i + 1])
    }
}

/// Work counters a block uses (one per stage); a mixture's block one more
/// (its router).
const STAGES: usize = 5;

/// A buffer the members share; each writes only the elements it claimed,
/// and reads what others wrote only after a barrier.
#[derive(Clone, Copy)]
struct Shared(*mut f32, usize);

// SAFETY: see the type; disjoint writes, reads after barriers.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    fn of(v: &mut [f32]) -> Self {
        Self(v.as_mut_ptr(), v.len())
    }
    fn ptr(self) -> *mut f32 {
        self.0
    }
    /// The whole buffer, read-only.
    ///
    /// # Safety
    /// Nobody writes the buffer while the slice lives.
    unsafe fn read<'a>(self) -> &'a [f32] {
        // SAFETY: forwarded.
        unsafe { std::slice::from_raw_parts(self.0, self.1) }
    }
    /// Elements `lo..hi`, writable.
    ///
    /// # Safety
    /// Nobody else reads or writes `lo..hi` while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn part<'a>(self, lo: usize, hi: usize) -> &'a mut [f32] {
        debug_assert!(lo <= hi && hi <= self.1);
        // SAFETY: forwarded.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(lo), hi - lo) }
    }
}

/// What the team probes (tests) read.
#[cfg(test)]
pub(crate) mod probe {
    use std::sync::atomic::AtomicU64;
    /// Nanoseconds members spent waiting for the stage before theirs.
    pub(crate) static WAITED_NS: AtomicU64 = AtomicU64::new(0);
}

/// The work counters of one stage of a step.
pub(crate) struct Stage {
    /// Items of the stage.
    total: usize,
    /// Items handed out (may run past `total`).
    claim: AtomicUsize,
    /// Items finished; the next stage begins at `total`.
    done: AtomicUsize,
}

impl Stage {
    fn new(total: usize) -> Self {
        Self {
            total,
            claim: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
        }
    }
}

/// A member's claims in one stage, opened once the stage before is done.
struct Claims<'m, 'a> {
    m: &'m Member<'a>,
    stage: &'m Stage,
    mine: usize,
}

impl<'m, 'a> Claims<'m, 'a> {
    /// Stage `i` of `stages`, after waiting for stage `i - 1` to be done.
    fn open(m: &'m Member<'a>, stages: &'m [Stage], i: usize) -> Self {
        if let Some(prev) = i.checked_sub(1).map(|p| &stages[p]) {
            #[cfg(test)]
            let t0 = std::time::Instant::now();
            m.wait_for(&prev.done, prev.total);
            #[cfg(test)]
            probe::WAITED_NS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        Self {
            m,
            stage: &stages[i],
            mine: 0,
        }
    }

    /// The next item this member takes (the one before it is finished).
    fn next(&mut self) -> Option<usize> {
        let i = self.m.claim(&self.stage.claim, self.stage.total)?;
        self.mine += 1;
        Some(i)
    }

    /// Every item taken is finished.
    fn finish(self) {
        if self.mine > 0 {
            self.stage.done.fetch_add(self.mine, Ordering::Release);
        }
    }
}

/// The buffers of one step (`n` sequences, one row each).
#[derive(Clone, Copy)]
struct Bufs {
    /// The residual stream (`n x hidden`).
    x: Shared,
    /// q, k and v of the block (`n x q_width`, `n x kv_width` twice).
    q: Shared,
    k: Shared,
    v: Shared,
    /// Each sequence's query heads' span partials of attention: `(m, l)`
    /// pairs (2 a span) and outputs (`head_dim` a span), at [`Plan::span_at`].
    parts: Shared,
    outs: Shared,
    /// `act(gate) * up` (`n x intermediate`; a mixture's: `n x used x
    /// expert_ff`, one row a pick).
    act: Shared,
    /// A mixture's router logits (`n x experts`) and its shared expert's
    /// `act(gate) * up` (`n x shared_ff`).
    route: Shared,
    shared_act: Shared,
    /// Every block's new key and value rows (after RoPE),
    /// `layers x n x 2 x kv_width`.
    newkv: Shared,
    logits: Shared,
}

/// Where each sequence's attention lies.
struct Plan {
    /// Per sequence: first key position, spans, first span slot.
    seqs: Vec<(usize, usize, usize)>,
    /// Attention tasks: (sequence, KV head, span).
    tasks: Vec<(usize, usize, usize)>,
    /// Span slots in all.
    slots: usize,
    /// The claims of the q, k/v, o/down, gate/up and head products.
    q_cuts: Cuts,
    kv_cuts: Cuts,
    hidden_cuts: Cuts,
    inter_cuts: Cuts,
    head_cuts: Cuts,
    /// A mixture's claims: its router's rows, an expert's gate/up rows, the
    /// shared expert's.
    router_cuts: Cuts,
    expert_cuts: Cuts,
    shared_cuts: Cuts,
}

impl Plan {
    fn new(
        cfg: &crate::engine::config::Config,
        starts: &[usize],
        threads: usize,
        head_rows: usize,
    ) -> Self {
        let mut seqs = Vec::with_capacity(starts.len());
        let mut tasks = Vec::new();
        let mut slots = 0;
        for (si, &start) in starts.iter().enumerate() {
            let from = window_start(cfg.sliding_window, start);
            let n = spans(start + 1 - from);
            seqs.push((from, n, slots));
            slots += cfg.n_heads * n;
            for j in 0..cfg.n_kv_heads {
                tasks.extend((0..n).map(|sp| (si, j, sp)));
            }
        }
        Self {
            seqs,
            tasks,
            slots,
            q_cuts: Cuts::new(cfg.q_width(), threads, CHUNK),
            kv_cuts: Cuts::new(cfg.kv_width(), threads, CHUNK),
            hidden_cuts: Cuts::new(cfg.hidden_size, threads, CHUNK),
            inter_cuts: Cuts::new(cfg.intermediate_size, threads, CHUNK),
            head_cuts: Cuts::new(head_rows, threads, HEAD_CHUNK),
            router_cuts: Cuts::new(cfg.experts.map_or(0, |e| e.count), threads, CHUNK),
            expert_cuts: Cuts::new(cfg.experts.map_or(0, |e| e.ff), threads, CHUNK),
            shared_cuts: Cuts::new(cfg.experts.map_or(0, |e| e.shared_ff), threads, CHUNK),
        }
    }

    /// The slot of span `sp` of query head `head` of sequence `si`.
    fn span_at(&self, si: usize, head: usize, sp: usize) -> usize {
        let (_, n, base) = self.seqs[si];
        base + head * n + sp
    }

    /// Claims of a mixture's gate/up stage for `picks` (sequence, pick)
    /// pairs: each pick's expert cut by `expert_cuts`, then the shared
    /// expert's cuts.
    fn moe_items(&self, picks: usize) -> usize {
        picks * self.expert_cuts.len() + self.shared_cuts.len()
    }
}

impl Model {
    /// One new token for each of `steps` (each with exactly one, validated
    /// by the caller; `starts` their caches' lengths), on `team`; the
    /// logits `[steps, vocab]`.
    pub(crate) fn decode_team(
        &self,
        team: &Team,
        steps: &mut [Step<'_>],
        starts: &[usize],
    ) -> CoreResult<Vec<f32>> {
        let cfg = &self.cfg;
        let (qw, kvw, hd) = (cfg.q_width(), cfg.kv_width(), cfg.head_dim);
        let (layers, n) = (cfg.n_layers, steps.len());
        let ids: Vec<i64> = steps.iter().map(|s| s.tokens[0]).collect();
        let mut x = self.embed(&ids)?;
        scale_embedding(cfg, &mut x);
        let (mut q, mut k, mut v) = (
            vec![0.0f32; n * qw],
            vec![0.0f32; n * kvw],
            vec![0.0f32; n * kvw],
        );
        let plan = Plan::new(cfg, starts, team.threads(), self.weights.head().rows);
        let mut parts = vec![0.0f32; plan.slots * 2];
        let mut outs = vec![0.0f32; plan.slots * hd];
        let (used, ff, shared_ff, experts) = cfg
            .experts
            .map_or((0, 0, 0, 0), |e| (e.used, e.ff, e.shared_ff, e.count));
        let mut act = vec![0.0f32; (n * cfg.intermediate_size).max(n * used * ff)];
        let mut route = vec![0.0f32; n * experts];
        let mut shared_act = vec![0.0f32; n * shared_ff];
        let mut newkv = vec![0.0f32; layers * n * 2 * kvw];
        let mut logits = vec![0.0f32; n * self.weights.head().rows];
        let qkv_chunks = plan.q_cuts.len() + 2 * plan.kv_cuts.len();
        let mut stages = Vec::with_capacity(layers * STAGES + 1);
        for _ in 0..layers {
            stages.push(Stage::new(qkv_chunks));
            stages.push(Stage::new(plan.tasks.len()));
            stages.push(Stage::new(plan.hidden_cuts.len()));
            if cfg.experts.is_some() {
                stages.push(Stage::new(plan.router_cuts.len()));
                stages.push(Stage::new(plan.moe_items(n * used)));
            } else {
                stages.push(Stage::new(plan.inter_cuts.len()));
            }
            stages.push(Stage::new(plan.hidden_cuts.len()));
        }
        stages.push(Stage::new(plan.head_cuts.len()));
        let bufs = Bufs {
            x: Shared::of(&mut x),
            q: Shared::of(&mut q),
            k: Shared::of(&mut k),
            v: Shared::of(&mut v),
            parts: Shared::of(&mut parts),
            outs: Shared::of(&mut outs),
            act: Shared::of(&mut act),
            route: Shared::of(&mut route),
            shared_act: Shared::of(&mut shared_act),
            newkv: Shared::of(&mut newkv),
            logits: Shared::of(&mut logits),
        };
        let failure: Mutex<Option<CoreError>> = Mutex::new(None);
        let views: Vec<&KvCache> = steps.iter().map(|s| &*s.cache).collect();
        let ran = team.run_elastic(|m| {
            if let Err(e) = self.member(m, &views, starts, &plan, bufs, &stages) {
                failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                // Leave the job: the others stop waiting for its work.
                std::panic::resume_unwind(Box::new("a team member failed"));
            }
        });
        drop(views);
        if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        ran?;
        let nkv = cfg.n_kv_heads;
        for li in 0..layers {
            for (si, s) in steps.iter_mut().enumerate() {
                let row = &newkv[(li * n + si) * 2 * kvw..(li * n + si + 1) * 2 * kvw];
                s.cache.append(
                    li,
                    head_major(&row[..kvw], 0, 1, nkv, hd)?,
                    head_major(&row[kvw..], 0, 1, nkv, hd)?,
                )?;
            }
        }
        finish_logits(cfg, &mut logits);
        Ok(logits)
    }

    /// Member `m`'s part of the step: every stage in order, each begun when
    /// the one before it is done; the per-row work a stage needs (norms,
    /// biases, RoPE, combining attention's spans, quantising activations)
    /// is done on a private copy by each member that claims part of it.
    fn member(
        &self,
        m: &Member<'_>,
        caches: &[&KvCache],
        starts: &[usize],
        plan: &Plan,
        b: Bufs,
        stages: &[Stage],
    ) -> CoreResult<()> {
        let cfg = &self.cfg;
        let n = starts.len();
        let (hdim, hd, nh) = (cfg.hidden_size, cfg.head_dim, cfg.n_heads);
        let (qw, kvw, inter) = (cfg.q_width(), cfg.kv_width(), cfg.intermediate_size);
        let group = cfg.group();
        let eps = cfg.rms_norm_eps;
        let (cos, sin) = rope_tables(cfg, starts);
        let sc = Scoring {
            scale: cfg.attn_scale,
            softcap: cfg.attn_softcap,
        };
        let act = self.act();
        let mut h = vec![0.0f32; n * hdim];
        let mut tmp = vec![0.0f32; n * hdim];
        let (mut gate, mut up) = (vec![0.0f32; n * inter], vec![0.0f32; n * inter]);
        let (mut q, mut k, mut v) = (
            vec![0.0f32; n * qw],
            vec![0.0f32; n * kvw],
            vec![0.0f32; n * kvw],
        );
        let mut halves = vec![0u16; n * kvw];
        let mut ctx = vec![0.0f32; n * qw];
        let mut scores = Vec::with_capacity(crate::engine::attention::SPAN);
        let mut at = 0usize;
        let mut open = || {
            at += 1;
            Claims::open(m, stages, at - 1)
        };
        for (li, lw) in self.weights.layers.iter().enumerate() {
            // q, k, v.
            let parts: [(&Tensor, Shared); 3] = [(&lw.q, b.q), (&lw.k, b.k), (&lw.v, b.v)];
            let chunks: Vec<(usize, usize)> = parts
                .iter()
                .enumerate()
                .flat_map(|(i, _)| {
                    let cuts = if i == 0 { &plan.q_cuts } else { &plan.kv_cuts };
                    (0..cuts.len()).map(move |c| (i, c))
                })
                .collect();
            let mut cl = open();
            if let Some(first) = cl.next() {
                // SAFETY: x is written in the o and down stages only, which
                // wait for this one.
                rms_rows(unsafe { b.x.read() }, &lw.attn_norm, eps, &mut h);
                let mut prep = RowPrep::new(self.activations, &h);
                let mut c = Some(first);
                while let Some(ci) = c {
                    let (i, c0) = chunks[ci];
                    let (t, out) = parts[i];
                    let cuts = if i == 0 { &plan.q_cuts } else { &plan.kv_cuts };
                    let (lo, hi) = cuts.range(c0);
                    // SAFETY: columns lo..hi of this part are this member's claim.
                    unsafe { self.rows(&mut prep, t, lo, hi, out.ptr())? };
                    c = cl.next();
                }
            }
            cl.finish();
            // Attention in (sequence, KV head, span) tasks: the query heads
            // of a KV head read each span of its keys once (GQA), and the
            // spans split a head's work evenly over the members.
            let mut cl = open();
            if let Some(first) = cl.next() {
                // Private copies: biases, norms, RoPE.
                // SAFETY: q, k, v are written again in the next block's
                // first stage only, which waits for this one.
                unsafe {
                    q.copy_from_slice(b.q.read());
                    k.copy_from_slice(b.k.read());
                    v.copy_from_slice(b.v.read());
                }
                for (buf, bias) in [
                    (&mut q, &lw.q_bias),
                    (&mut k, &lw.k_bias),
                    (&mut v, &lw.v_bias),
                ] {
                    if let Some(bias) = bias {
                        for row in buf.chunks_exact_mut(bias.len()) {
                            row.iter_mut().zip(bias).for_each(|(y, &c)| *y += c);
                        }
                    }
                }
                if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                    rms_heads(&mut q, qn, eps);
                    rms_heads(&mut k, kn, eps);
                }
                rope(cfg.rope_style, &mut q, hd, cfg.rope_pairs(), &cos, &sin);
                rope(cfg.rope_style, &mut k, hd, cfg.rope_pairs(), &cos, &sin);
                if first == 0 {
                    for si in 0..n {
                        let r = li * n + si;
                        // SAFETY: block li's rows of newkv are the taker of task 0's.
                        let dst = unsafe { b.newkv.part(r * 2 * kvw, (r + 1) * 2 * kvw) };
                        dst[..kvw].copy_from_slice(&k[si * kvw..(si + 1) * kvw]);
                        dst[kvw..].copy_from_slice(&v[si * kvw..(si + 1) * kvw]);
                    }
                }
                for (si, cache) in caches.iter().enumerate() {
                    if cache.geometry().dtype == Dtype::F16 {
                        // Attention sees the new row as the cache will store it.
                        let hv = &mut halves[si * kvw..(si + 1) * kvw];
                        for buf in [&mut k, &mut v] {
                            let row = &mut buf[si * kvw..(si + 1) * kvw];
                            convert_f32_to_f16(row, hv);
                            row.iter_mut()
                                .zip(hv.iter())
                                .for_each(|(y, &bits)| *y = f16_to_f32(bits));
                        }
                    }
                }
                let mut c = Some(first);
                while let Some(task) = c {
                    let (si, j, sp) = plan.tasks[task];
                    let (from, start) = (plan.seqs[si].0, starts[si]);
                    let cache = caches[si];
                    let (kc, vc) = (
                        slice_rows(cache.head_rows(li, Half::Keys, j)?, from, start, hd),
                        slice_rows(cache.head_rows(li, Half::Values, j)?, from, start, hd),
                    );
                    let (ko, vo) = (si * kvw + j * hd, si * kvw + (j + 1) * hd);
                    let own = (Rows::F32(&k[ko..vo]), Rows::F32(&v[ko..vo]));
                    let span = span_of(&[(kc, vc), own], sp, hd);
                    for head in j * group..(j + 1) * group {
                        let at = plan.span_at(si, head, sp);
                        // SAFETY: this span of this head is this member's claim.
                        let (pair, dst) = unsafe {
                            (
                                b.parts.part(at * 2, at * 2 + 2),
                                b.outs.part(at * hd, (at + 1) * hd),
                            )
                        };
                        let qo = si * qw + head * hd;
                        let (mx, l) =
                            attend_span(&q[qo..qo + hd], span.get(), hd, sc, &mut scores, dst);
                        pair[0] = mx;
                        pair[1] = l;
                    }
                    c = cl.next();
                }
            }
            cl.finish();
            // o, added to the residual.
            let mut cl = open();
            if let Some(first) = cl.next() {
                // Every head's spans combined, in a private ctx.
                // SAFETY: parts and outs are written again in the next
                // block's attention only, after this stage.
                let (parts, outs) = unsafe { (b.parts.read(), b.outs.read()) };
                for si in 0..n {
                    let spans = plan.seqs[si].1;
                    for head in 0..nh {
                        let base = plan.span_at(si, head, 0);
                        let o = si * qw + head * hd;
                        combine(
                            &parts[base * 2..(base + spans) * 2],
                            &outs[base * hd..(base + spans) * hd],
                            hd,
                            &mut ctx[o..o + hd],
                        );
                    }
                }
                let mut prep = RowPrep::new(self.activations, &ctx);
                let cuts = &plan.hidden_cuts;
                self.residual(&mut cl, first, &mut prep, &lw.o, &mut tmp, b.x, n, cuts)?;
            }
            cl.finish();
            let mlp = match &lw.ffn {
                Ffn::Dense(mlp) => mlp,
                Ffn::Moe(moe) => {
                    self.member_moe(&mut open, moe, lw, n, b, &mut h, &mut tmp, plan)?;
                    continue;
                }
            };
            // gate and up, then act(gate) * up.
            let mut cl = open();
            if let Some(first) = cl.next() {
                // SAFETY: as for q, k, v.
                rms_rows(unsafe { b.x.read() }, &lw.ffn_norm, eps, &mut h);
                let mut prep = RowPrep::new(self.activations, &h);
                let mut c = Some(first);
                while let Some(ci) = c {
                    let (lo, hi) = plan.inter_cuts.range(ci);
                    // SAFETY: private buffers of `n x inter` floats.
                    unsafe {
                        self.rows(&mut prep, &mlp.gate, lo, hi, gate.as_mut_ptr())?;
                        self.rows(&mut prep, &mlp.up, lo, hi, up.as_mut_ptr())?;
                    }
                    for r in 0..n {
                        let (a, z) = (r * inter + lo, r * inter + hi);
                        // SAFETY: columns lo..hi of act are this member's claim.
                        let dst = unsafe { b.act.part(a, z) };
                        glu(act, &gate[a..z], &up[a..z], dst);
                    }
                    c = cl.next();
                }
            }
            cl.finish();
            // down, added to the residual.
            let mut cl = open();
            if let Some(first) = cl.next() {
                // SAFETY: act is written again in the next block's gate/up
                // stage only, after this one.
                let mut prep = RowPrep::new(self.activations, unsafe { b.act.read() });
                let cuts = &plan.hidden_cuts;
                self.residual(&mut cl, first, &mut prep, &mlp.down, &mut tmp, b.x, n, cuts)?;
            }
            cl.finish();
        }
        // The head.
        let head = self.weights.head();
        let mut cl = open();
        if let Some(first) = cl.next() {
            // SAFETY: x is final.
            rms_rows(unsafe { b.x.read() }, &self.weights.norm, eps, &mut h);
            let mut prep = RowPrep::new(self.activations, &h);
            let mut c = Some(first);
            while let Some(ci) = c {
                let (lo, hi) = plan.head_cuts.range(ci);
                // SAFETY: columns lo..hi of the logits are this member's claim.
                unsafe { self.rows(&mut prep, head, lo, hi, b.logits.ptr())? };
                c = cl.next();
            }
        }
        cl.finish();
        Ok(())
    }

    /// A mixture's three stages of a block: the router's rows; each pick's
    /// expert's gate and up rows (and the shared expert's), `act(gate) *
    /// up` into its row of `act`; then each claim of hidden columns takes
    /// every pick's down rows there, sums them by weight in pick order
    /// (then the shared expert's times its gate) and adds the sum to the
    /// residual: the general path's arithmetic, element by element.
    #[allow(clippy::too_many_arguments)]
    fn member_moe<'m, 'a: 'm>(
        &self,
        open: &mut dyn FnMut() -> Claims<'m, 'a>,
        moe: &Moe,
        lw: &Layer,
        n: usize,
        b: Bufs,
        h: &mut [f32],
        tmp: &mut [f32],
        plan: &Plan,
    ) -> CoreResult<()> {
        let cfg = &self.cfg;
        let e = cfg.experts.as_ref().expect("a mixture has its config");
        let (hdim, k, ff, eps) = (cfg.hidden_size, e.used, e.ff, cfg.rms_norm_eps);
        let act = self.act();
        let mut normed = false;
        let norm = |h: &mut [f32], normed: &mut bool| {
            if !*normed {
                // SAFETY: x is written in this block's down stage only, which
                // waits for the stages before it.
                rms_rows(unsafe { b.x.read() }, &lw.ffn_norm, eps, h);
                *normed = true;
            }
        };
        // The router's logits.
        let mut cl = open();
        if let Some(first) = cl.next() {
            norm(h, &mut normed);
            let mut prep = RowPrep::new(self.activations, h);
            let mut c = Some(first);
            while let Some(ci) = c {
                let (lo, hi) = plan.router_cuts.range(ci);
                // SAFETY: columns lo..hi of route are this member's claim.
                unsafe { self.rows(&mut prep, &moe.router, lo, hi, b.route.ptr())? };
                c = cl.next();
            }
        }
        cl.finish();
        let mut picks: Vec<(usize, f32)> = Vec::new();
        let route_all = |picks: &mut Vec<(usize, f32)>| {
            if picks.is_empty() {
                // SAFETY: route is written in the router stage only, done.
                let logits = unsafe { b.route.read() };
                let mut one = Vec::with_capacity(k);
                for z in logits.chunks_exact(e.count) {
                    route(z, e, &mut one);
                    picks.extend_from_slice(&one);
                }
            }
        };
        // Every pick's gate and up, and the shared expert's.
        let per = plan.expert_cuts.len();
        let mut cl = open();
        if let Some(first) = cl.next() {
            norm(h, &mut normed);
            route_all(&mut picks);
            let mut preps: Vec<RowPrep<'_>> = h
                .chunks_exact(hdim)
                .map(|row| RowPrep::new(self.activations, row))
                .collect();
            let mut shared_prep = RowPrep::new(self.activations, h);
            let sff = e.shared_ff;
            let (mut gate, mut up) = (vec![0.0f32; n * ff.max(sff)], vec![0.0f32; n * ff.max(sff)]);
            let mut c = Some(first);
            while let Some(ci) = c {
                if ci < n * k * per {
                    let (s, (lo, hi)) = (ci / per, plan.expert_cuts.range(ci % per));
                    let mlp = &moe.experts[picks[s].0];
                    let prep = &mut preps[s / k];
                    // SAFETY: private buffers of at least ff floats.
                    unsafe {
                        self.rows(prep, &mlp.gate, lo, hi, gate.as_mut_ptr())?;
                        self.rows(prep, &mlp.up, lo, hi, up.as_mut_ptr())?;
                    }
                    // SAFETY: columns lo..hi of pick s's row of act are this claim's.
                    let dst = unsafe { b.act.part(s * ff + lo, s * ff + hi) };
                    glu(act, &gate[lo..hi], &up[lo..hi], dst);
                } else if let Some((shared, _)) = &moe.shared {
                    let (lo, hi) = plan.shared_cuts.range(ci - n * k * per);
                    // SAFETY: private buffers of n x shared_ff floats.
                    unsafe {
                        self.rows(&mut shared_prep, &shared.gate, lo, hi, gate.as_mut_ptr())?;
                        self.rows(&mut shared_prep, &shared.up, lo, hi, up.as_mut_ptr())?;
                    }
                    for r in 0..n {
                        let (a, z) = (r * sff + lo, r * sff + hi);
                        // SAFETY: columns lo..hi of shared_act are this claim's.
                        let dst = unsafe { b.shared_act.part(a, z) };
                        glu(act, &gate[a..z], &up[a..z], dst);
                    }
                }
                c = cl.next();
            }
        }
        cl.finish();
        // down: weighted sums added to the residual.
        let mut cl = open();
        if let Some(first) = cl.next() {
            norm(h, &mut normed);
            route_all(&mut picks);
            // SAFETY: act and shared_act are written again in the next
            // block's gate/up stage only, after this one.
            let (acts, shared_acts) = unsafe { (b.act.read(), b.shared_act.read()) };
            let mut preps: Vec<RowPrep<'_>> = (0..n * k)
                .map(|s| RowPrep::new(self.activations, &acts[s * ff..(s + 1) * ff]))
                .collect();
            let mut shared_prep = RowPrep::new(self.activations, shared_acts);
            let gates: Vec<f32> = match &moe.shared {
                Some((_, w)) => h
                    .chunks_exact(hdim)
                    .map(|hr| {
                        let z: f32 = hr.iter().zip(w).map(|(a, b)| a * b).sum();
                        1.0 / (1.0 + (-z).exp())
                    })
                    .collect(),
                None => Vec::new(),
            };
            let (mut acc, mut one) = (vec![0.0f32; hdim], vec![0.0f32; hdim]);
            let mut c = Some(first);
            while let Some(ci) = c {
                let (lo, hi) = plan.hidden_cuts.range(ci);
                if let Some((shared, _)) = &moe.shared {
                    // SAFETY: tmp holds n x hidden floats and is private.
                    unsafe { self.rows(&mut shared_prep, &shared.down, lo, hi, tmp.as_mut_ptr())? };
                }
                for r in 0..n {
                    let acc = &mut acc[lo..hi];
                    for slot in 0..k {
                        let s = r * k + slot;
                        let (x, w) = picks[s];
                        // SAFETY: one's hidden floats are private.
                        unsafe {
                            self.rows(
                                &mut preps[s],
                                &moe.experts[x].down,
                                lo,
                                hi,
                                one.as_mut_ptr(),
                            )?
                        };
                        let v = &one[lo..hi];
                        if slot == 0 {
                            acc.iter_mut().zip(v).for_each(|(a, &v)| *a = v * w);
                        } else {
                            acc.iter_mut().zip(v).for_each(|(a, &v)| *a += v * w);
                        }
                    }
                    if moe.shared.is_some() {
                        let g = gates[r];
                        let sr = &tmp[r * hdim + lo..r * hdim + hi];
                        acc.iter_mut().zip(sr).for_each(|(a, &v)| *a += v * g);
                    }
                    // SAFETY: columns lo..hi of x are this member's claim; nobody
                    // reads x in this stage.
                    let dst = unsafe { b.x.part(r * hdim + lo, r * hdim + hi) };
                    add_scaled(dst, acc, cfg.residual_scale);
                }
                c = cl.next();
            }
        }
        cl.finish();
        Ok(())
    }

    /// Chunk `first` and the further claims of `cl` of `x += prep @ t.T`
    /// (`n` rows).
    #[allow(clippy::too_many_arguments)]
    fn residual(
        &self,
        cl: &mut Claims<'_, '_>,
        first: usize,
        prep: &mut RowPrep<'_>,
        t: &Tensor,
        tmp: &mut [f32],
        x: Shared,
        n: usize,
        cuts: &Cuts,
    ) -> CoreResult<()> {
        let mut c = Some(first);
        while let Some(ci) = c {
            let (lo, hi) = cuts.range(ci);
            // SAFETY: tmp holds n x t.rows floats and is private.
            unsafe { self.rows(prep, t, lo, hi, tmp.as_mut_ptr())? };
            for r in 0..n {
                let (a, z) = (r * t.rows + lo, r * t.rows + hi);
                // SAFETY: columns lo..hi of x are this member's claim; nobody
                // reads x in this stage.
                let dst = unsafe { x.part(a, z) };
                add_scaled(dst, &tmp[a..z], self.cfg.residual_scale);
            }
            c = cl.next();
        }
        Ok(())
    }

    /// Rows `lo..hi` of `prep @ t.T` into `out[lo..hi]`.
    ///
    /// # Safety
    /// As [`RowPrep::rows`].
    unsafe fn rows(
        &self,
        prep: &mut RowPrep<'_>,
        t: &Tensor,
        lo: usize,
        hi: usize,
        out: *mut f32,
    ) -> CoreResult<()> {
        // SAFETY: forwarded.
        unsafe { prep.rows(t.kind, self.weights.bytes(t), t.rows, t.cols, lo, hi, out) }
    }
}

#[cfg(test)]
mod cut_tests {
    use super::{Cuts, CHUNK};

    #[test]
    fn cuts_tile_the_rows_whole_for_one_member_in_chunks_for_more() {
        for rows in [0usize, 1, 127, 128, 129, 576, 1536, 49_152] {
            for threads in 1..4 {
                let c = Cuts::new(rows, threads, CHUNK);
                let ranges: Vec<(usize, usize)> = (0..c.len()).map(|i| c.range(i)).collect();
                let mut at = 0;
                for &(lo, hi) in &ranges {
                    assert_eq!(lo, at, "contiguous");
                    assert!(hi > lo, "no empty claim");
                    at = hi;
                }
                assert_eq!(at, rows, "every row claimed once");
                let want = if threads == 1 {
                    usize::from(rows > 0)
                } else {
                    rows.div_ceil(CHUNK)
                };
                assert_eq!(c.len(), want, "{rows} rows, {threads} threads");
            }
        }
    }
}
