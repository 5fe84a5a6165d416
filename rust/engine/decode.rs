//! One decode step of one sequence (one new token) as a single elastic job
//! of the model's [`Team`]: every member takes claimed row chunks of each
//! product and (KV head, span) tasks of attention, stage by stage (q/k/v,
//! attention, o, gate/up, down: five a block), instead of a thread-pool
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

use crate::engine::attention::{attend_span, combine, slice_rows, span_of, spans};
use crate::engine::forward::{
    head_major, rms_heads, rms_rows, rope, rope_tables, silu, window_start, Model,
};
use crate::engine::linear::RowPrep;
use crate::engine::team::{Member, Team};
use crate::engine::weights::Tensor;
use crate::kv::{convert_f32_to_f16, f16_to_f32, Dtype, Half, KvCache, Rows};
use crate::{CoreError, CoreResult};

/// Weight rows a claimed chunk holds (a multiple of the kernels' 4-row tile).
const CHUNK: usize = 64;
/// Rows a claimed chunk of the output head holds.
const HEAD_CHUNK: usize = 512;
/// Work counters a block uses (one per stage).
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
            m.wait_for(&prev.done, prev.total);
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

/// The buffers of one step.
#[derive(Clone, Copy)]
struct Bufs {
    /// The residual stream (`hidden`).
    x: Shared,
    /// q, k and v of the block, back to back.
    qkv: Shared,
    /// Each query head's span partials of attention: `(m, l)` pairs
    /// (`n_heads x spans x 2`) and outputs (`n_heads x spans x head_dim`).
    parts: Shared,
    outs: Shared,
    /// `silu(gate) * up` (`intermediate`).
    act: Shared,
    /// Every block's new key and value rows (after RoPE), `layers x 2 x kv_width`.
    newkv: Shared,
    logits: Shared,
}

impl Model {
    /// One new token `token` at position `start` of `cache` (validated by
    /// the caller), on `team`; the logits of the token.
    pub(crate) fn decode_team(
        &self,
        team: &Team,
        cache: &mut KvCache,
        token: i64,
        start: usize,
    ) -> CoreResult<Vec<f32>> {
        let cfg = &self.cfg;
        let (qw, kvw) = (cfg.q_width(), cfg.kv_width());
        let layers = cfg.n_layers;
        let mut x = self.embed(&[token])?;
        let mut qkv = vec![0.0f32; qw + 2 * kvw];
        let (from, hd) = (window_start(cfg.sliding_window, start), cfg.head_dim);
        let n_spans = spans(start + 1 - from);
        let mut parts = vec![0.0f32; cfg.n_heads * n_spans * 2];
        let mut outs = vec![0.0f32; cfg.n_heads * n_spans * hd];
        let mut act = vec![0.0f32; cfg.intermediate_size];
        let mut newkv = vec![0.0f32; layers * 2 * kvw];
        let mut logits = vec![0.0f32; self.weights.head().rows];
        let qkv_chunks: usize = [qw, kvw, kvw].iter().map(|r| r.div_ceil(CHUNK)).sum();
        let mut stages = Vec::with_capacity(layers * STAGES + 1);
        for _ in 0..layers {
            stages.push(Stage::new(qkv_chunks));
            stages.push(Stage::new(cfg.n_kv_heads * n_spans));
            stages.push(Stage::new(cfg.hidden_size.div_ceil(CHUNK)));
            stages.push(Stage::new(cfg.intermediate_size.div_ceil(CHUNK)));
            stages.push(Stage::new(cfg.hidden_size.div_ceil(CHUNK)));
        }
        stages.push(Stage::new(self.weights.head().rows.div_ceil(HEAD_CHUNK)));
        let bufs = Bufs {
            x: Shared::of(&mut x),
            qkv: Shared::of(&mut qkv),
            parts: Shared::of(&mut parts),
            outs: Shared::of(&mut outs),
            act: Shared::of(&mut act),
            newkv: Shared::of(&mut newkv),
            logits: Shared::of(&mut logits),
        };
        let failure: Mutex<Option<CoreError>> = Mutex::new(None);
        let view: &KvCache = cache;
        let ran = team.run_elastic(|m| {
            if let Err(e) = self.member(m, view, start, bufs, &stages) {
                failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                // Leave the job: the others stop waiting for its work.
                std::panic::resume_unwind(Box::new("a team member failed"));
            }
        });
        if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        ran?;
        let nkv = cfg.n_kv_heads;
        for li in 0..layers {
            let row = &newkv[li * 2 * kvw..(li + 1) * 2 * kvw];
            cache.append(
                li,
                head_major(&row[..kvw], 0, 1, nkv, hd)?,
                head_major(&row[kvw..], 0, 1, nkv, hd)?,
            )?;
        }
        Ok(logits)
    }

    /// Member `m`'s part of the step: every stage in order, each begun when
    /// the one before it is done; the per-row work a stage needs (norms,
    /// biases, RoPE, combining attention's spans, quantising activations)
    /// is done on a private copy by each member that claims part of it.
    fn member(
        &self,
        m: &Member<'_>,
        cache: &KvCache,
        start: usize,
        b: Bufs,
        stages: &[Stage],
    ) -> CoreResult<()> {
        let cfg = &self.cfg;
        let (hdim, hd, nh) = (cfg.hidden_size, cfg.head_dim, cfg.n_heads);
        let (qw, kvw, inter) = (cfg.q_width(), cfg.kv_width(), cfg.intermediate_size);
        let group = cfg.group();
        let eps = cfg.rms_norm_eps;
        let (cos, sin) = rope_tables(cfg, &[start]);
        let f16 = cache.geometry().dtype == Dtype::F16;
        let scale = 1.0 / (hd as f32).sqrt();
        let from = window_start(cfg.sliding_window, start);
        let mut h = vec![0.0f32; hdim];
        let mut tmp = vec![0.0f32; hdim.max(qw)];
        let (mut gate, mut up) = (vec![0.0f32; inter], vec![0.0f32; inter]);
        let (mut q, mut k, mut v) = (vec![0.0f32; qw], vec![0.0f32; kvw], vec![0.0f32; kvw]);
        let mut halves = vec![0u16; kvw];
        let n_spans = spans(start + 1 - from);
        let mut ctx = vec![0.0f32; qw];
        let mut scores = Vec::with_capacity(crate::engine::attention::SPAN);
        let mut at = 0usize;
        let mut open = || {
            at += 1;
            Claims::open(m, stages, at - 1)
        };
        for (li, lw) in self.weights.layers.iter().enumerate() {
            // q, k, v.
            let parts: [(&Tensor, usize); 3] = [(&lw.q, 0), (&lw.k, qw), (&lw.v, qw + kvw)];
            let chunks: Vec<(usize, usize)> = parts
                .iter()
                .enumerate()
                .flat_map(|(i, (t, _))| (0..t.rows.div_ceil(CHUNK)).map(move |c| (i, c)))
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
                    let (t, off) = parts[i];
                    let (lo, hi) = (c0 * CHUNK, ((c0 + 1) * CHUNK).min(t.rows));
                    // SAFETY: rows lo..hi of this part of qkv are this member's claim.
                    unsafe { self.rows(&mut prep, t, lo, hi, b.qkv.ptr().add(off))? };
                    c = cl.next();
                }
            }
            cl.finish();
            // Attention in (KV head, span) tasks: the query heads of a KV
            // head read each span of its keys once (GQA), and the spans
            // split a head's work evenly over the members.
            let mut cl = open();
            if let Some(first) = cl.next() {
                // Private copies: biases, norms, RoPE.
                {
                    // SAFETY: qkv is written again in the next block's first
                    // stage only, which waits for this one.
                    let all = unsafe { b.qkv.read() };
                    q.copy_from_slice(&all[..qw]);
                    k.copy_from_slice(&all[qw..qw + kvw]);
                    v.copy_from_slice(&all[qw + kvw..]);
                }
                for (buf, bias) in [
                    (&mut q, &lw.q_bias),
                    (&mut k, &lw.k_bias),
                    (&mut v, &lw.v_bias),
                ] {
                    if let Some(bias) = bias {
                        buf.iter_mut().zip(bias).for_each(|(y, &c)| *y += c);
                    }
                }
                if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                    rms_heads(&mut q, qn, eps);
                    rms_heads(&mut k, kn, eps);
                }
                rope(cfg.rope_style, &mut q, hd, &cos, &sin);
                rope(cfg.rope_style, &mut k, hd, &cos, &sin);
                if first == 0 {
                    // SAFETY: block li's rows of newkv are the taker of task 0's.
                    let dst = unsafe { b.newkv.part(li * 2 * kvw, (li + 1) * 2 * kvw) };
                    dst[..kvw].copy_from_slice(&k);
                    dst[kvw..].copy_from_slice(&v);
                }
                if f16 {
                    // Attention sees the new row as the cache will store it.
                    for buf in [&mut k, &mut v] {
                        convert_f32_to_f16(buf, &mut halves);
                        buf.iter_mut()
                            .zip(&halves)
                            .for_each(|(y, &bits)| *y = f16_to_f32(bits));
                    }
                }
                let mut c = Some(first);
                while let Some(task) = c {
                    let (j, sp) = (task / n_spans, task % n_spans);
                    let (kc, vc) = (
                        slice_rows(cache.head_rows(li, Half::Keys, j)?, from, start, hd),
                        slice_rows(cache.head_rows(li, Half::Values, j)?, from, start, hd),
                    );
                    let own = (
                        Rows::F32(&k[j * hd..(j + 1) * hd]),
                        Rows::F32(&v[j * hd..(j + 1) * hd]),
                    );
                    let span = span_of(&[(kc, vc), own], sp, hd);
                    for head in j * group..(j + 1) * group {
                        let at = head * n_spans + sp;
                        // SAFETY: span `sp` of head `head` is this member's claim.
                        let (pair, dst) = unsafe {
                            (
                                b.parts.part(at * 2, at * 2 + 2),
                                b.outs.part(at * hd, (at + 1) * hd),
                            )
                        };
                        let (mx, l) = attend_span(
                            &q[head * hd..(head + 1) * hd],
                            span.get(),
                            hd,
                            scale,
                            &mut scores,
                            dst,
                        );
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
                for head in 0..nh {
                    let base = head * n_spans;
                    combine(
                        &parts[base * 2..(base + n_spans) * 2],
                        &outs[base * hd..(base + n_spans) * hd],
                        hd,
                        &mut ctx[head * hd..(head + 1) * hd],
                    );
                }
                let mut prep = RowPrep::new(self.activations, &ctx);
                self.residual(&mut cl, first, &mut prep, &lw.o, &mut tmp, b.x)?;
            }
            cl.finish();
            // gate and up, then silu(gate) * up.
            let mut cl = open();
            if let Some(first) = cl.next() {
                // SAFETY: as for q, k, v.
                rms_rows(unsafe { b.x.read() }, &lw.ffn_norm, eps, &mut h);
                let mut prep = RowPrep::new(self.activations, &h);
                let mut c = Some(first);
                while let Some(ci) = c {
                    let (lo, hi) = (ci * CHUNK, ((ci + 1) * CHUNK).min(inter));
                    // SAFETY: private buffers of `inter` floats.
                    unsafe {
                        self.rows(&mut prep, &lw.gate, lo, hi, gate.as_mut_ptr())?;
                        self.rows(&mut prep, &lw.up, lo, hi, up.as_mut_ptr())?;
                    }
                    // SAFETY: rows lo..hi of act are this member's claim.
                    let dst = unsafe { b.act.part(lo, hi) };
                    for ((d, &g), &u) in dst.iter_mut().zip(&gate[lo..hi]).zip(&up[lo..hi]) {
                        *d = silu(g) * u;
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
                self.residual(&mut cl, first, &mut prep, &lw.down, &mut tmp, b.x)?;
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
                let (lo, hi) = (ci * HEAD_CHUNK, ((ci + 1) * HEAD_CHUNK).min(head.rows));
                // SAFETY: rows lo..hi of the logits are this member's claim.
                unsafe { self.rows(&mut prep, head, lo, hi, b.logits.ptr())? };
                c = cl.next();
            }
        }
        cl.finish();
        Ok(())
    }

    /// Chunk `first` and the further claims of `cl` of `x += prep @ t.T`.
    fn residual(
        &self,
        cl: &mut Claims<'_, '_>,
        first: usize,
        prep: &mut RowPrep<'_>,
        t: &Tensor,
        tmp: &mut [f32],
        x: Shared,
    ) -> CoreResult<()> {
        let mut c = Some(first);
        while let Some(ci) = c {
            let (lo, hi) = (ci * CHUNK, ((ci + 1) * CHUNK).min(t.rows));
            // SAFETY: tmp holds t.rows floats and is private.
            unsafe { self.rows(prep, t, lo, hi, tmp.as_mut_ptr())? };
            // SAFETY: rows lo..hi of x are this member's claim; nobody reads x
            // in this stage.
            let dst = unsafe { x.part(lo, hi) };
            dst.iter_mut().zip(&tmp[lo..hi]).for_each(|(a, b)| *a += b);
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
