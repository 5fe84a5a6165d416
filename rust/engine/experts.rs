//! A mixture of experts in place of a block's dense MLP (Mixtral, Qwen2-MoE,
//! Qwen3-MoE), as llama.cpp's `build_moe_ffn` with softmax gating: the
//! router's logits become probabilities over all experts, each token runs the
//! `used` most probable experts, and their outputs are summed weighted by
//! those probabilities (divided by their sum when the model renormalises).
//! Qwen2-MoE adds a shared expert every token runs, times
//! `sigmoid(x . gate)`.
//!
//! Every row is routed and summed on its own, in the order of its picks, and
//! the experts' products treat each activation row alone, so a row's result
//! does not depend on the other rows of a batch or a prefill chunk.

use crate::engine::config::{Experts, Gating};
use crate::engine::forward::Model;
use crate::engine::glu::glu_in_place;
use crate::engine::linear::{matmul_each, Part};
use crate::engine::weights::{Mlp, Moe};
use crate::CoreResult;

/// The experts a token runs, most probable first (ties: the lower index),
/// with their weights, from its router logits.
pub(crate) fn route(logits: &[f32], e: &Experts, picks: &mut Vec<(usize, f32)>) {
    if e.gating == Gating::SoftmaxPicked {
        // The top logits, then the softmax over those only.
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let top = &order[..e.used];
        let max = top
            .iter()
            .map(|&i| logits[i])
            .fold(f32::NEG_INFINITY, f32::max);
        picks.clear();
        picks.extend(top.iter().map(|&i| (i, (logits[i] - max).exp())));
        let sum: f32 = picks.iter().map(|&(_, w)| w).sum();
        picks.iter_mut().for_each(|(_, w)| *w /= sum);
        return;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let probs: Vec<f32> = logits.iter().map(|&z| (z - max).exp()).collect();
    let total: f32 = probs.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // A total order: a NaN (only from NaN weights) cannot make the sort panic.
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    picks.clear();
    picks.extend(order[..e.used].iter().map(|&i| (i, probs[i] / total)));
    if e.norm_weights {
        let sum: f32 = picks.iter().map(|&(_, w)| w).sum();
        picks.iter_mut().for_each(|(_, w)| *w /= sum);
    }
}

impl Model {
    /// The mixture of block weights `m` over the normed rows `h`, into `out`
    /// (`[rows, hidden]`).
    pub(crate) fn moe(&self, m: &Moe, h: &[f32], out: &mut Vec<f32>) -> CoreResult<()> {
        let e = self.cfg.experts.as_ref().expect("a mixture has its config");
        let hdim = self.cfg.hidden_size;
        let rows = h.len() / hdim;
        let mut logits = Vec::new();
        self.mm(&m.router, h, &mut logits)?;
        if let Some(b) = &m.biases {
            for row in logits.chunks_exact_mut(e.count) {
                row.iter_mut().zip(&b.router).for_each(|(z, &c)| *z += c);
            }
        }
        // Each row's picks, slot by slot: picks[r * used + slot].
        let mut picks = Vec::with_capacity(rows * e.used);
        let mut one = Vec::with_capacity(e.used);
        for z in logits.chunks_exact(e.count) {
            route(z, e, &mut one);
            picks.extend_from_slice(&one);
        }
        // Each picked expert once, over the rows that picked it: every
        // expert's gate and up as one parallel loop, then every down as one
        // (with the shared expert, over all rows, in each).
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); e.count];
        for (i, &(x, _)) in picks.iter().enumerate() {
            by_expert[x].push(i);
        }
        let used: Vec<(usize, Vec<usize>)> = by_expert
            .into_iter()
            .enumerate()
            .filter(|(_, users)| !users.is_empty())
            .collect();
        let mut xs: Vec<Vec<f32>> = used
            .iter()
            .map(|(_, users)| {
                let mut rows_in = Vec::with_capacity(users.len() * hdim);
                for &i in users {
                    let r = i / e.used;
                    rows_in.extend_from_slice(&h[r * hdim..(r + 1) * hdim]);
                }
                rows_in
            })
            .collect();
        let mut mlps: Vec<&Mlp> = used.iter().map(|&(x, _)| &m.experts[x]).collect();
        if let Some((shared, _)) = &m.shared {
            xs.push(h.to_vec());
            mlps.push(shared);
        }
        let inner = |mlp: &Mlp, x: &[f32]| (x.len() / hdim) * mlp.gate.rows;
        let mut gates: Vec<Vec<f32>> = mlps
            .iter()
            .zip(&xs)
            .map(|(m, x)| vec![0.0; inner(m, x)])
            .collect();
        let mut ups: Vec<Vec<f32>> = gates.clone();
        {
            let mut parts: Vec<Part<'_>> = Vec::with_capacity(2 * mlps.len());
            for ((mlp, g), u) in mlps.iter().zip(gates.iter_mut()).zip(ups.iter_mut()) {
                parts.push(self.part(&mlp.gate, g));
                parts.push(self.part(&mlp.up, u));
            }
            let mut each: Vec<(usize, &mut Part<'_>)> = parts
                .iter_mut()
                .enumerate()
                .map(|(j, p)| (j / 2, p))
                .collect();
            let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
            matmul_each(self.activations, &refs, &mut each)?;
        }
        if let Some(b) = &m.biases {
            // Each expert's gate and up biases (the shared expert has none).
            for ((&(x, _), g), u) in used.iter().zip(gates.iter_mut()).zip(ups.iter_mut()) {
                let (gb, ub) = (
                    &b.gate[x * e.ff..(x + 1) * e.ff],
                    &b.up[x * e.ff..(x + 1) * e.ff],
                );
                for (gr, ur) in g.chunks_exact_mut(e.ff).zip(u.chunks_exact_mut(e.ff)) {
                    gr.iter_mut().zip(gb).for_each(|(y, &c)| *y += c);
                    ur.iter_mut().zip(ub).for_each(|(y, &c)| *y += c);
                }
            }
        }
        let act = self.act();
        for (g, u) in gates.iter_mut().zip(&ups) {
            glu_in_place(act, g, u);
        }
        let mut ys: Vec<Vec<f32>> = xs.iter().map(|x| vec![0.0; x.len()]).collect();
        {
            let mut parts: Vec<Part<'_>> = mlps
                .iter()
                .zip(ys.iter_mut())
                .map(|(mlp, y)| self.part(&mlp.down, y))
                .collect();
            let mut each: Vec<(usize, &mut Part<'_>)> = parts.iter_mut().enumerate().collect();
            let refs: Vec<&[f32]> = gates.iter().map(|g| g.as_slice()).collect();
            matmul_each(self.activations, &refs, &mut each)?;
        }
        if let Some(b) = &m.biases {
            for (&(x, _), y) in used.iter().zip(ys.iter_mut()) {
                let db = &b.down[x * hdim..(x + 1) * hdim];
                for yr in y.chunks_exact_mut(hdim) {
                    yr.iter_mut().zip(db).for_each(|(v, &c)| *v += c);
                }
            }
        }
        // Weighted, summed in the order of the picks.
        let mut from = vec![(0usize, 0usize); picks.len()];
        for (k, (_, users)) in used.iter().enumerate() {
            for (row, &i) in users.iter().enumerate() {
                from[i] = (k, row);
            }
        }
        out.clear();
        out.resize(rows * hdim, 0.0);
        for (r, acc) in out.chunks_exact_mut(hdim).enumerate() {
            for slot in 0..e.used {
                let i = r * e.used + slot;
                let w = picks[i].1;
                let (k, row) = from[i];
                let y = &ys[k][row * hdim..(row + 1) * hdim];
                if slot == 0 {
                    acc.iter_mut().zip(y).for_each(|(a, &v)| *a = v * w);
                } else {
                    acc.iter_mut().zip(y).for_each(|(a, &v)| *a += v * w);
                }
            }
        }
        if let Some((_, gate_w)) = &m.shared {
            let s = ys.last().expect("the shared expert's output");
            for ((acc, sr), hr) in out
                .chunks_exact_mut(hdim)
                .zip(s.chunks_exact(hdim))
                .zip(h.chunks_exact(hdim))
            {
                let z: f32 = hr.iter().zip(gate_w).map(|(a, b)| a * b).sum();
                let g = 1.0 / (1.0 + (-z).exp());
                acc.iter_mut().zip(sr).for_each(|(a, &v)| *a += v * g);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experts(count: usize, used: usize, norm: bool) -> Experts {
        Experts {
            count,
            used,
            ff: 4,
            norm_weights: norm,
            shared_ff: 0,
            gating: Gating::Softmax,
            biases: false,
        }
    }

    #[test]
    fn picked_softmax_gating_takes_the_top_logits_then_their_softmax() {
        let z = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let mut e = experts(5, 3, false);
        e.gating = Gating::SoftmaxPicked;
        let mut picks = Vec::new();
        route(&z, &e, &mut picks);
        let idx: Vec<usize> = picks.iter().map(|p| p.0).collect();
        assert_eq!(idx, [1, 3, 4], "largest logits first, ties by index");
        let denom: f64 = [2.0f64, 2.0, 1.0].iter().map(|v| v.exp()).sum();
        for &(i, w) in &picks {
            let want = (z[i] as f64).exp() / denom;
            assert!((w as f64 - want).abs() < 1e-6, "{i}: {w} vs {want}");
        }
        route(&[f32::NAN, 1.0, 0.0], &e, &mut picks);
        assert_eq!(picks.len(), 3);
    }

    #[test]
    fn route_picks_the_most_probable_with_softmax_weights() {
        let z = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let mut picks = Vec::new();
        route(&z, &experts(5, 3, false), &mut picks);
        let idx: Vec<usize> = picks.iter().map(|p| p.0).collect();
        assert_eq!(idx, [1, 3, 4], "most probable first, ties by index");
        let denom: f64 = z.iter().map(|&v| (v as f64).exp()).sum();
        for &(i, w) in &picks {
            let want = (z[i] as f64).exp() / denom;
            assert!((w as f64 - want).abs() < 1e-6, "{i}: {w} vs {want}");
        }
        route(&z, &experts(5, 3, true), &mut picks);
        let sum: f32 = picks.iter().map(|p| p.1).sum();
        assert!((sum - 1.0).abs() < 1e-6);
        let e1 = (2.0f64).exp();
        let want = e1 / (2.0 * e1 + 1.0f64.exp());
        assert!((picks[0].1 as f64 - want).abs() < 1e-6);
    }

    #[test]
    fn route_survives_nan_and_infinite_logits() {
        let mut picks = Vec::new();
        route(&[f32::NAN, 1.0, 0.0], &experts(3, 2, true), &mut picks);
        assert_eq!(picks.len(), 2);
        route(
            &[f32::INFINITY, 1.0, 0.0],
            &experts(3, 1, false),
            &mut picks,
        );
        assert_eq!(picks.len(), 1);
    }
}
