//! One decode step of one or more sequences (one new token each) as a single elastic job
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
    head_major, rms_heads, rms_rows, rope, rope_tables, silu, window_start, Model, Step,
};
use crate::engine::linear::RowPrep;
use crate::engine::team::{Member, Team};
use crate::engine::weights::Tensor;
use crate::kv::{convert_f32_to_f16, f16_to_f32, Dtype, Half, KvCache, Rows};
use crate::{CoreError, CoreResult};

/// The kernels' row tile: chunks begin at a multiple of it.
const TILE: usize = 4;
/// Weight rows a claimed chunk holds, about (see [`Split`]).
const CHUNK: usize = 64;
/// Rows a claimed chunk of the output head holds, about.
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

/// How the rows of a stage's products (one or more, side by side) are cut
/// into chunks: a multiple of the team's size in number, every chunk within
/// one tile of the others, each a whole number of tiles of each product.
///
/// With a fixed chunk of 64 rows a 576-row product was 9 chunks, and one
/// member of two sat idle for the ninth at the end of each of ~90 stages a
/// step. Only rows are cut: each row's reduction stays whole in one kernel
/// call, so the bits do not depend on the cut.
#[derive(Clone, Debug)]
struct Split {
    /// Tiles of each product, in order.
    parts: Vec<usize>,
    /// Rows of each product.
    rows: Vec<usize>,
    /// Chunks.
    chunks: usize,
}

impl Split {
    /// Products of `rows` rows each, in chunks of about `chunk` rows for a
    /// team of `threads`.
    fn new(rows: &[usize], chunk: usize, threads: usize) -> Self {
        let parts: Vec<usize> = rows.iter().map(|r| r.div_ceil(TILE)).collect();
        let tiles: usize = parts.iter().sum();
        let chunks = tiles
            .div_ceil((chunk / TILE).max(1))
            .next_multiple_of(threads.max(1))
            .min(tiles)
            .max(1);
        Self {
            parts,
            rows: rows.to_vec(),
            chunks,
        }
    }

    /// The one row range of chunk `i` of a split of one product.
    fn one(&self, i: usize) -> (usize, usize, usize) {
        debug_assert_eq!(self.parts.len(), 1);
        self.ranges(i).next().unwrap_or((0, 0, 0))
    }

    /// The row ranges `(product, lo, hi)` of chunk `i` (none empty).
    fn ranges(&self, i: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let tiles: usize = self.parts.iter().sum();
        let (a, b) = (i * tiles / self.chunks, (i + 1) * tiles / self.chunks);
        let mut off = 0;
        self.parts.iter().enumerate().filter_map(move |(p, &n)| {
            let (lo, hi) = (a.max(off), b.min(off + n));
            let base = off;
            off += n;
            (lo < hi).then(|| {
                (
                    p,
                    (lo - base) * TILE,
                    ((hi - base) * TILE).min(self.rows[p]),
                )
            })
        })
    }
}

/// What the team probes (tests) read and set.
#[cfg(test)]
pub(crate) mod probe {
    use std::sync::atomic::{AtomicU64, AtomicUsize};
    /// Nanoseconds members spent waiting for a stage before theirs.
    pub(crate) static WAITED_NS: AtomicU64 = AtomicU64::new(0);
    /// Split the stages for this many threads instead of the team's (0: the team's).
    pub(crate) static SPLIT_FOR: AtomicUsize = AtomicUsize::new(0);
}

/// The splits of a step's stages (every block has the same shapes).
struct Splits {
    qkv: Split,
    o: Split,
    gate_up: Split,
    down: Split,
    head: Split,
}

impl Splits {
    fn new(model: &Model, threads: usize) -> Self {
        let cfg = &model.cfg;
        let (qw, kvw, h) = (cfg.q_width(), cfg.kv_width(), cfg.hidden_size);
        Self {
            qkv: Split::new(&[qw, kvw, kvw], CHUNK, threads),
            o: Split::new(&[h], CHUNK, threads),
            gate_up: Split::new(&[cfg.intermediate_size], CHUNK, threads),
            down: Split::new(&[h], CHUNK, threads),
            head: Split::new(&[model.weights.head().rows], HEAD_CHUNK, threads),
        }
    }
}

/// The work counters of one stage of a step (a cache line pair of its own:
/// one member's claims must not take the line another spins on).
#[repr(align(128))]
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
    /// `silu(gate) * up` (`n x intermediate`).
    act: Shared,
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
}

impl Plan {
    fn new(cfg: &crate::engine::config::Config, starts: &[usize]) -> Self {
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
        Self { seqs, tasks, slots }
    }

    /// The slot of span `sp` of query head `head` of sequence `si`.
    fn span_at(&self, si: usize, head: usize, sp: usize) -> usize {
        let (_, n, base) = self.seqs[si];
        base + head * n + sp
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
        let (mut q, mut k, mut v) = (
            vec![0.0f32; n * qw],
            vec![0.0f32; n * kvw],
            vec![0.0f32; n * kvw],
        );
        let plan = Plan::new(cfg, starts);
        let mut parts = vec![0.0f32; plan.slots * 2];
        let mut outs = vec![0.0f32; plan.slots * hd];
        let mut act = vec![0.0f32; n * cfg.intermediate_size];
        let mut newkv = vec![0.0f32; layers * n * 2 * kvw];
        let mut logits = vec![0.0f32; n * self.weights.head().rows];
        #[cfg(not(test))]
        let split_for = team.threads();
        #[cfg(test)]
        let split_for = match probe::SPLIT_FOR.load(Ordering::Relaxed) {
            0 => team.threads(),
            t => t,
        };
        let splits = Splits::new(self, split_for);
        let mut stages = Vec::with_capacity(layers * STAGES + 1);
        for _ in 0..layers {
            stages.push(Stage::new(splits.qkv.chunks));
            stages.push(Stage::new(plan.tasks.len()));
            stages.push(Stage::new(splits.o.chunks));
            stages.push(Stage::new(splits.gate_up.chunks));
            stages.push(Stage::new(splits.down.chunks));
        }
        stages.push(Stage::new(splits.head.chunks));
        let bufs = Bufs {
            x: Shared::of(&mut x),
            q: Shared::of(&mut q),
            k: Shared::of(&mut k),
            v: Shared::of(&mut v),
            parts: Shared::of(&mut parts),
            outs: Shared::of(&mut outs),
            act: Shared::of(&mut act),
            newkv: Shared::of(&mut newkv),
            logits: Shared::of(&mut logits),
        };
        let failure: Mutex<Option<CoreError>> = Mutex::new(None);
        let views: Vec<&KvCache> = steps.iter().map(|s| &*s.cache).collect();
        let ran = team.run_elastic(|m| {
            if let Err(e) = self.member(m, &views, starts, &plan, &splits, bufs, &stages) {
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
        Ok(logits)
    }

    /// Member `m`'s part of the step: every stage in order, each begun when
    /// the one before it is done; the per-row work a stage needs (norms,
    /// biases, RoPE, combining attention's spans, quantising activations)
    /// is done on a private copy by each member that claims part of it.
    #[allow(clippy::too_many_arguments)]
    fn member(
        &self,
        m: &Member<'_>,
        caches: &[&KvCache],
        starts: &[usize],
        plan: &Plan,
        splits: &Splits,
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
        let scale = 1.0 / (hd as f32).sqrt();
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
            let mut cl = open();
            if let Some(first) = cl.next() {
                // SAFETY: x is written in the o and down stages only, which
                // wait for this one.
                rms_rows(unsafe { b.x.read() }, &lw.attn_norm, eps, &mut h);
                let mut prep = RowPrep::new(self.activations, &h);
                let mut c = Some(first);
                while let Some(ci) = c {
                    for (i, lo, hi) in splits.qkv.ranges(ci) {
                        let (t, out) = parts[i];
                        // SAFETY: columns lo..hi of this part are this member's claim.
                        unsafe { self.rows(&mut prep, t, lo, hi, out.ptr())? };
                    }
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
                rope(cfg.rope_style, &mut q, hd, &cos, &sin);
                rope(cfg.rope_style, &mut k, hd, &cos, &sin);
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
                            attend_span(&q[qo..qo + hd], span.get(), hd, scale, &mut scores, dst);
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
                self.residual(
                    &mut cl, first, &splits.o, &mut prep, &lw.o, &mut tmp, b.x, n,
                )?;
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
                    let (_, lo, hi) = splits.gate_up.one(ci);
                    // SAFETY: private buffers of `n x inter` floats.
                    unsafe {
                        self.rows(&mut prep, &lw.gate, lo, hi, gate.as_mut_ptr())?;
                        self.rows(&mut prep, &lw.up, lo, hi, up.as_mut_ptr())?;
                    }
                    for r in 0..n {
                        let (a, z) = (r * inter + lo, r * inter + hi);
                        // SAFETY: columns lo..hi of act are this member's claim.
                        let dst = unsafe { b.act.part(a, z) };
                        for ((d, &g), &u) in dst.iter_mut().zip(&gate[a..z]).zip(&up[a..z]) {
                            *d = silu(g) * u;
                        }
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
                self.residual(
                    &mut cl,
                    first,
                    &splits.down,
                    &mut prep,
                    &lw.down,
                    &mut tmp,
                    b.x,
                    n,
                )?;
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
                let (_, lo, hi) = splits.head.one(ci);
                // SAFETY: columns lo..hi of the logits are this member's claim.
                unsafe { self.rows(&mut prep, head, lo, hi, b.logits.ptr())? };
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
        split: &Split,
        prep: &mut RowPrep<'_>,
        t: &Tensor,
        tmp: &mut [f32],
        x: Shared,
        n: usize,
    ) -> CoreResult<()> {
        let mut c = Some(first);
        while let Some(ci) = c {
            let (_, lo, hi) = split.one(ci);
            // SAFETY: tmp holds n x t.rows floats and is private.
            unsafe { self.rows(prep, t, lo, hi, tmp.as_mut_ptr())? };
            for r in 0..n {
                let (a, z) = (r * t.rows + lo, r * t.rows + hi);
                // SAFETY: columns lo..hi of x are this member's claim; nobody
                // reads x in this stage.
                let dst = unsafe { x.part(a, z) };
                dst.iter_mut().zip(&tmp[a..z]).for_each(|(a, b)| *a += b);
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
mod split_tests {
    use super::{Split, TILE};

    #[test]
    fn a_split_covers_each_row_once_in_whole_tiles_and_a_multiple_of_the_team() {
        for rows in [
            &[576usize, 192, 192][..],
            &[576],
            &[1536],
            &[49152],
            &[37],
            &[50, 9, 9],
            &[3],
        ] {
            for chunk in [4, 64, 512] {
                for threads in 1..=4 {
                    let s = Split::new(rows, chunk, threads);
                    let tiles: usize = rows.iter().map(|r| r.div_ceil(TILE)).sum();
                    assert!(
                        s.chunks == tiles || s.chunks.is_multiple_of(threads),
                        "{rows:?}"
                    );
                    let mut seen: Vec<Vec<usize>> = rows.iter().map(|&r| vec![0; r]).collect();
                    let mut sizes = Vec::new();
                    for i in 0..s.chunks {
                        let mut size = 0;
                        for (p, lo, hi) in s.ranges(i) {
                            assert!(lo < hi && lo % TILE == 0 && hi <= rows[p]);
                            seen[p][lo..hi].iter_mut().for_each(|c| *c += 1);
                            size += (hi - lo).div_ceil(TILE);
                        }
                        sizes.push(size);
                    }
                    assert!(
                        seen.iter().flatten().all(|&c| c == 1),
                        "{rows:?} {chunk} {threads}"
                    );
                    let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                    // Within a tile of each other, but for partial tiles at part ends.
                    assert!(*lo >= 1 && hi - lo <= rows.len(), "{rows:?} {sizes:?}");
                }
            }
        }
    }
}
