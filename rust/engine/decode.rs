//! One decode step of one sequence (one new token) as a single job of the
//! model's [`Team`]: every member takes claimed row chunks of each product
//! and query heads of attention, with one barrier after each of the five
//! stages of a block (q/k/v, attention, o, gate/up, down) instead of a
//! thread-pool hand-off per product.
//!
//! Each member does the small per-row work (norms, biases, RoPE, quantising
//! activations) itself on a private copy, which costs less than another
//! barrier. The new keys and values are kept aside and appended to the
//! cache after the job, so the cache is only read while the team runs;
//! attention takes the new row from there, rounded to the cache's storage
//! type exactly as the append rounds it.
//!
//! Every value is computed by the same functions, in the same order, as
//! [`Model::forward`]'s general path: a decode step gives the same bits
//! either way (tested), whatever the number of threads.

use std::sync::atomic::AtomicUsize;
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
        let counters: Vec<AtomicUsize> = (0..layers * STAGES + 1)
            .map(|_| AtomicUsize::new(0))
            .collect();
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
        let ran = team.run(|m| {
            if let Err(e) = self.member(m, view, start, bufs, &counters) {
                failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                // Leave the job: the other members leave their barriers.
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

    /// Member `m`'s part of the step.
    fn member(
        &self,
        m: &Member<'_>,
        cache: &KvCache,
        start: usize,
        b: Bufs,
        counters: &[AtomicUsize],
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
        let mut stage = 0usize;
        let mut next = || {
            stage += 1;
            &counters[stage - 1]
        };
        for (li, lw) in self.weights.layers.iter().enumerate() {
            // q, k, v.
            // SAFETY: x is only written in the o and down stages, between barriers.
            rms_rows(unsafe { b.x.read() }, &lw.attn_norm, eps, &mut h);
            let mut prep_qkv = RowPrep::new(self.activations, &h);
            let parts: [(&Tensor, usize); 3] = [(&lw.q, 0), (&lw.k, qw), (&lw.v, qw + kvw)];
            let counter = next();
            let chunks: Vec<(usize, usize)> = parts
                .iter()
                .enumerate()
                .flat_map(|(i, (t, _))| (0..t.rows.div_ceil(CHUNK)).map(move |c| (i, c)))
                .collect();
            while let Some(c) = m.claim(counter, chunks.len()) {
                let (i, c) = chunks[c];
                let (t, at) = parts[i];
                let (lo, hi) = (c * CHUNK, ((c + 1) * CHUNK).min(t.rows));
                // SAFETY: rows lo..hi of this part of qkv are this member's claim.
                unsafe { self.rows(&mut prep_qkv, t, lo, hi, b.qkv.ptr().add(at))? };
            }
            drop(prep_qkv);
            m.barrier();
            // Private copies: biases, norms, RoPE.
            {
                // SAFETY: qkv is not written again before the next block's barrier.
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
            if m.id == 0 {
                // SAFETY: block li's rows of newkv are member 0's alone.
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
            // Attention in (KV head, span) tasks: the query heads of a KV
            // head read each span of its keys once (GQA), and the spans
            // split a head's work evenly over the members; each member then
            // combines every head's spans itself (cheaper than a barrier).
            let counter = next();
            while let Some(task) = m.claim(counter, cfg.n_kv_heads * n_spans) {
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
            }
            m.barrier();
            {
                // SAFETY: parts and outs are not written again before the
                // next block's barrier.
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
            }
            // o, added to the residual.
            let mut prep_o = RowPrep::new(self.activations, &ctx);
            self.residual(m, &mut prep_o, &lw.o, next(), &mut tmp, b.x)?;
            drop(prep_o);
            m.barrier();
            // gate and up, then silu(gate) * up.
            // SAFETY: as for q, k, v.
            rms_rows(unsafe { b.x.read() }, &lw.ffn_norm, eps, &mut h);
            let mut prep_ffn = RowPrep::new(self.activations, &h);
            let counter = next();
            while let Some(c) = m.claim(counter, inter.div_ceil(CHUNK)) {
                let (lo, hi) = (c * CHUNK, ((c + 1) * CHUNK).min(inter));
                // SAFETY: private buffers of `inter` floats.
                unsafe {
                    self.rows(&mut prep_ffn, &lw.gate, lo, hi, gate.as_mut_ptr())?;
                    self.rows(&mut prep_ffn, &lw.up, lo, hi, up.as_mut_ptr())?;
                }
                // SAFETY: rows lo..hi of act are this member's claim.
                let dst = unsafe { b.act.part(lo, hi) };
                for ((d, &g), &u) in dst.iter_mut().zip(&gate[lo..hi]).zip(&up[lo..hi]) {
                    *d = silu(g) * u;
                }
            }
            drop(prep_ffn);
            m.barrier();
            // down, added to the residual.
            // SAFETY: act is not written again before the next block's barrier.
            let mut prep_down = RowPrep::new(self.activations, unsafe { b.act.read() });
            self.residual(m, &mut prep_down, &lw.down, next(), &mut tmp, b.x)?;
            drop(prep_down);
            m.barrier();
        }
        // The head.
        // SAFETY: x is final.
        rms_rows(unsafe { b.x.read() }, &self.weights.norm, eps, &mut h);
        let mut prep = RowPrep::new(self.activations, &h);
        let head = self.weights.head();
        let counter = next();
        while let Some(c) = m.claim(counter, head.rows.div_ceil(HEAD_CHUNK)) {
            let (lo, hi) = (c * HEAD_CHUNK, ((c + 1) * HEAD_CHUNK).min(head.rows));
            // SAFETY: rows lo..hi of the logits are this member's claim.
            unsafe { self.rows(&mut prep, head, lo, hi, b.logits.ptr())? };
        }
        Ok(())
    }

    /// Claimed chunks of `x += prep @ t.T`.
    fn residual(
        &self,
        m: &Member<'_>,
        prep: &mut RowPrep<'_>,
        t: &Tensor,
        counter: &AtomicUsize,
        tmp: &mut [f32],
        x: Shared,
    ) -> CoreResult<()> {
        while let Some(c) = m.claim(counter, t.rows.div_ceil(CHUNK)) {
            let (lo, hi) = (c * CHUNK, ((c + 1) * CHUNK).min(t.rows));
            // SAFETY: tmp holds t.rows floats and is private.
            unsafe { self.rows(prep, t, lo, hi, tmp.as_mut_ptr())? };
            // SAFETY: rows lo..hi of x are this member's claim; nobody reads x
            // in this stage.
            let dst = unsafe { x.part(lo, hi) };
            dst.iter_mut().zip(&tmp[lo..hi]).for_each(|(a, b)| *a += b);
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
