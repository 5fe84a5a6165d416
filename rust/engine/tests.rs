//! Engine invariants on a tiny random model: cached decode equals
//! re-prefill, chunking does not matter, a batch row equals the same
//! sequence alone (bit for bit), and failures leave caches untouched.

use crate::engine::config::{tiny, Config, Experts, Gating, LocalRope, RopeStyle};
use crate::engine::{Model, Step, Store};
use crate::kv::{Dtype, KvCache};
use crate::CoreError;

fn random(n: usize, seed: &mut u64, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        })
        .collect()
}

fn model(cfg: Config) -> Model {
    let owned = owned_of(&cfg);
    let store = Store::open(&[], vec![], owned).unwrap();
    Model::new(cfg, store).unwrap()
}

/// Random tensors for `cfg` (norm weights near 1), by llama.cpp name.
fn owned_of(cfg: &Config) -> Owned {
    let mut seed = 7u64;
    let (h, f, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (qw, kvw, hd) = (cfg.q_width(), cfg.kv_width(), cfg.head_dim);
    let mut owned = Vec::new();
    let mut put = |name: String, shape: Vec<usize>, scale: f32, base: f32| {
        let n = shape.iter().product();
        let vals = random(n, &mut seed, scale)
            .iter()
            .map(|x| x + base)
            .collect();
        owned.push((name, shape, vals));
    };
    put("token_embd.weight".into(), vec![v, h], 2.0, 0.0);
    put("output_norm.weight".into(), vec![h], 0.2, 1.0);
    for i in 0..cfg.n_layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        if !cfg.block.no_pre_norms {
            put(p("attn_norm.weight"), vec![h], 0.2, 1.0);
            // llama.cpp's name for gpt-oss's norm before the MLP.
            let ffn_norm = if cfg.arch == "gpt-oss" {
                "post_attention_norm.weight"
            } else {
                "ffn_norm.weight"
            };
            put(p(ffn_norm), vec![h], 0.2, 1.0);
        }
        if cfg.block.o_bias {
            put(p("attn_output.bias"), vec![h], 0.4, 0.0);
        }
        if cfg.block.attn_sinks {
            put(p("attn_sinks.weight"), vec![cfg.n_heads], 2.0, 0.5);
        }
        put(p("attn_q.weight"), vec![qw, h], 0.6, 0.0);
        put(p("attn_k.weight"), vec![kvw, h], 0.6, 0.0);
        put(p("attn_v.weight"), vec![kvw, h], 0.6, 0.0);
        put(p("attn_output.weight"), vec![h, qw], 0.6, 0.0);
        match &cfg.experts {
            None => {
                put(p("ffn_gate.weight"), vec![f, h], 0.6, 0.0);
                put(p("ffn_up.weight"), vec![f, h], 0.6, 0.0);
                put(p("ffn_down.weight"), vec![h, f], 0.6, 0.0);
            }
            Some(e) => {
                let (n, ff) = (e.count, e.ff);
                put(p("ffn_gate_inp.weight"), vec![n, h], 3.0, 0.0);
                if cfg.arch == "granitemoe" {
                    // Gate and up stacked together (Granite MoE's checkpoints).
                    put(p("ffn_gate_up_exps.weight"), vec![n, 2 * ff, h], 0.6, 0.0);
                    put(p("ffn_down_exps.weight"), vec![n, h, ff], 0.6, 0.0);
                } else if cfg.arch == "mixtral" {
                    // One matrix an expert (older Mixtral files, Hugging Face).
                    for x in 0..n {
                        put(p(&format!("ffn_gate.{x}.weight")), vec![ff, h], 0.6, 0.0);
                        put(p(&format!("ffn_up.{x}.weight")), vec![ff, h], 0.6, 0.0);
                        put(p(&format!("ffn_down.{x}.weight")), vec![h, ff], 0.6, 0.0);
                    }
                } else {
                    put(p("ffn_gate_exps.weight"), vec![n, ff, h], 0.6, 0.0);
                    put(p("ffn_up_exps.weight"), vec![n, ff, h], 0.6, 0.0);
                    put(p("ffn_down_exps.weight"), vec![n, h, ff], 0.6, 0.0);
                }
                if e.biases {
                    put(p("ffn_gate_inp.bias"), vec![n], 2.0, 0.0);
                    put(p("ffn_gate_exps.bias"), vec![n, ff], 0.6, 0.0);
                    put(p("ffn_up_exps.bias"), vec![n, ff], 0.6, 0.0);
                    put(p("ffn_down_exps.bias"), vec![n, h], 0.6, 0.0);
                }
                if e.shared_ff > 0 {
                    let sf = e.shared_ff;
                    put(p("ffn_gate_shexp.weight"), vec![sf, h], 0.6, 0.0);
                    put(p("ffn_up_shexp.weight"), vec![sf, h], 0.6, 0.0);
                    put(p("ffn_down_shexp.weight"), vec![h, sf], 0.6, 0.0);
                    put(p("ffn_gate_inp_shexp.weight"), vec![h], 0.6, 0.0);
                }
            }
        }
        if cfg.block.qkv_bias {
            put(p("attn_q.bias"), vec![qw], 0.2, 0.0);
            put(p("attn_k.bias"), vec![kvw], 0.2, 0.0);
            put(p("attn_v.bias"), vec![kvw], 0.2, 0.0);
        }
        if cfg.block.qk_norm {
            let (qn, kn) = if cfg.block.qk_norm_full {
                (qw, kvw)
            } else {
                (hd, hd)
            };
            put(p("attn_q_norm.weight"), vec![qn], 0.2, 1.0);
            put(p("attn_k_norm.weight"), vec![kn], 0.2, 1.0);
        }
        if cfg.block.post_norms {
            put(p("post_attention_norm.weight"), vec![h], 0.2, 1.0);
            put(p("post_ffw_norm.weight"), vec![h], 0.2, 1.0);
        }
    }
    if cfg.arch == "phi3" {
        owned = fused(owned, cfg.n_layers);
    }
    owned
}

type Owned = Vec<(String, Vec<usize>, Vec<f32>)>;

/// The same numbers with each block's q, k, v as one `attn_qkv` and its gate
/// and up as one `ffn_up` of twice the rows, gate first (Phi-3's layout).
fn fused(mut owned: Owned, layers: usize) -> Owned {
    let mut take = |name: &str| {
        let i = owned.iter().position(|(n, _, _)| n == name).unwrap();
        owned.remove(i)
    };
    let mut out = Vec::new();
    for i in 0..layers {
        for (parts, name) in [
            (&["attn_q", "attn_k", "attn_v"][..], "attn_qkv"),
            (&["ffn_gate", "ffn_up"][..], "ffn_up"),
        ] {
            let (mut rows, mut cols, mut vals) = (0, 0, Vec::new());
            for part in parts {
                let (_, shape, v) = take(&format!("blk.{i}.{part}.weight"));
                rows += shape[0];
                cols = shape[1];
                vals.extend(v);
            }
            out.push((format!("blk.{i}.{name}.weight"), vec![rows, cols], vals));
        }
    }
    owned.extend(out);
    owned
}

#[test]
fn fused_qkv_and_gate_up_give_the_separate_matrices_bits() {
    let mut cfg = tiny("phi3");
    cfg.intermediate_size = 40; // not a multiple of the tiles' rows
    let fused = model(cfg.clone());
    cfg.arch = "llama".into();
    let separate = model(cfg);
    let (mut ca, mut cb) = (cache(&fused, 16), cache(&separate, 16));
    let la = fused.forward(
        &mut [Step {
            cache: &mut ca,
            tokens: &IDS,
        }],
        true,
    );
    let lb = separate.forward(
        &mut [Step {
            cache: &mut cb,
            tokens: &IDS,
        }],
        true,
    );
    assert_eq!(la.unwrap(), lb.unwrap());
    // A fused matrix of the wrong height is named.
    let mut owned = fused_store_of(tiny("phi3"));
    let at = owned
        .iter()
        .position(|(n, _, _)| n == "blk.0.attn_qkv.weight")
        .unwrap();
    owned[at].1[0] -= 1;
    let keep = owned[at].1[0] * owned[at].1[1];
    owned[at].2.truncate(keep);
    let err = Model::new(tiny("phi3"), Store::open(&[], vec![], owned).unwrap()).unwrap_err();
    assert!(err.to_string().contains("blk.0.attn_qkv.weight"), "{err}");
}

/// Random tensors of a plain block layout for `cfg`, fused as Phi-3's.
fn fused_store_of(cfg: Config) -> Owned {
    let mut seed = 7u64;
    let (h, f, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (qw, kvw) = (cfg.q_width(), cfg.kv_width());
    let mut owned: Owned = Vec::new();
    let mut put = |name: String, shape: Vec<usize>| {
        let n = shape.iter().product();
        owned.push((name, shape, random(n, &mut seed, 0.5)));
    };
    put("token_embd.weight".into(), vec![v, h]);
    put("output_norm.weight".into(), vec![h]);
    for i in 0..cfg.n_layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        put(p("attn_norm.weight"), vec![h]);
        put(p("ffn_norm.weight"), vec![h]);
        put(p("attn_q.weight"), vec![qw, h]);
        put(p("attn_k.weight"), vec![kvw, h]);
        put(p("attn_v.weight"), vec![kvw, h]);
        put(p("attn_output.weight"), vec![h, qw]);
        put(p("ffn_gate.weight"), vec![f, h]);
        put(p("ffn_up.weight"), vec![f, h]);
        put(p("ffn_down.weight"), vec![h, f]);
    }
    fused(owned, cfg.n_layers)
}

fn cache(m: &Model, max_seq: usize) -> KvCache {
    KvCache::new(m.geometry(Dtype::F32), max_seq).unwrap()
}

/// The logits of `ids` decoded one token at a time on `model`'s plain
/// (team-less) path, appending to `cache`: the reference the team tests
/// compare against.
fn one_by_one(model: &Model, cache: &mut KvCache, ids: &[i64]) -> Vec<Vec<f32>> {
    ids.iter()
        .map(|t| {
            model
                .forward(
                    &mut [Step {
                        cache,
                        tokens: &[*t],
                    }],
                    false,
                )
                .unwrap()
        })
        .collect()
}

fn variants() -> Vec<Config> {
    let mut out = vec![tiny("llama")];
    let mut c = tiny("mistral");
    c.sliding_window = Some(3);
    c.rope_style = RopeStyle::Interleaved;
    out.push(c);
    let mut c = tiny("qwen2");
    c.block.qkv_bias = true;
    out.push(c);
    let mut c = tiny("qwen3");
    c.block.qk_norm = true;
    out.push(c);
    // Gemma: GeGLU, scaled embeddings and its own score scale (team path).
    let mut c = tiny("gemma");
    c.block.gelu = true;
    c.embed_scale = (c.hidden_size as f32).sqrt();
    c.attn_scale = 0.3;
    c.attn_softcap = Some(4.0);
    out.push(c);
    // Gemma 2: post norms, soft-capping, a window on every other layer.
    let mut c = tiny("gemma2");
    c.block.gelu = true;
    c.block.post_norms = true;
    c.embed_scale = (c.hidden_size as f32).sqrt();
    c.sliding_window = Some(3);
    c.window_layers = vec![true, false];
    c.attn_softcap = Some(5.0);
    c.final_softcap = Some(3.0);
    out.push(c);
    // Gemma 3: q/k norms, windowed layers with a RoPE of their own.
    let mut c = tiny("gemma3");
    c.block.gelu = true;
    c.block.post_norms = true;
    c.block.qk_norm = true;
    c.sliding_window = Some(4);
    c.window_layers = vec![false, true];
    c.rope_position_scale = 8.0;
    c.rope_local = Some(LocalRope {
        inv_freq: (0..c.head_dim / 2)
            .map(|i| 1.0 / 100f64.powf(2.0 * i as f64 / c.head_dim as f64))
            .collect(),
        position_scale: 1.0,
    });
    out.push(c);
    // Phi-3: fused q/k/v and gate/up matrices.
    out.push(tiny("phi3"));
    // Partial RoPE (Phi-4-mini: 3/4 of each head rotates) in both pairings.
    let mut c = tiny("phi3");
    c.rope_inv_freq.truncate(3);
    c.rope_mscale = 1.2;
    out.push(c);
    let mut c = tiny("qwen2");
    c.rope_style = RopeStyle::Interleaved;
    c.rope_inv_freq.truncate(2);
    out.push(c);
    // Granite: scaled embeddings, residual adds and logits, its own score
    // scale (team path).
    let mut c = tiny("granite");
    c.rope_style = RopeStyle::Interleaved;
    c.embed_scale = 6.0;
    c.residual_scale = 0.22;
    c.logit_scale = 3.0;
    c.attn_scale = 0.125;
    out.push(c);
    // SmolLM3: a layer without RoPE (general path).
    let mut c = tiny("smollm3");
    c.rope_style = RopeStyle::Interleaved;
    c.nope_layers = vec![false, true];
    out.push(c);
    // Mixtures of experts (general path): Qwen3-MoE (stacked experts,
    // renormalised weights), Qwen2-MoE (a shared expert, raw weights),
    // Mixtral (one matrix an expert).
    let moe = |count, used, norm_weights, shared_ff| Experts {
        count,
        used,
        ff: 24,
        norm_weights,
        shared_ff,
        gating: Gating::Softmax,
        biases: false,
    };
    let mut c = tiny("qwen3moe");
    c.block.qk_norm = true;
    c.experts = Some(moe(6, 2, true, 0));
    out.push(c);
    let mut c = tiny("qwen2moe");
    c.block.qkv_bias = true;
    c.experts = Some(moe(4, 3, false, 40));
    out.push(c);
    let mut c = tiny("mixtral");
    c.rope_style = RopeStyle::Interleaved;
    c.experts = Some(moe(3, 2, true, 0));
    out.push(c);
    // OLMo 2: norms after attention and the MLP only, q/k normed over the
    // whole projection (general path); OLMoE: that q/k norm in a mixture.
    let mut c = tiny("olmo2");
    c.block.no_pre_norms = true;
    c.block.post_norms = true;
    c.block.qk_norm = true;
    c.block.qk_norm_full = true;
    out.push(c);
    let mut c = tiny("olmoe");
    c.block.qk_norm = true;
    c.block.qk_norm_full = true;
    c.experts = Some(moe(4, 2, false, 0));
    out.push(c);
    let mut c = tiny("granitemoe");
    c.rope_style = RopeStyle::Interleaved;
    c.residual_scale = 0.22;
    c.logit_scale = 3.0;
    c.experts = Some(moe(5, 1, true, 0));
    out.push(c);
    // gpt-oss: biases everywhere, sinks, every other layer windowed (3
    // here), its clamped gate, the softmax over the picked logits.
    let mut c = tiny("gpt-oss");
    c.block.qkv_bias = true;
    c.block.o_bias = true;
    c.block.attn_sinks = true;
    c.block.oai_glu = true;
    c.sliding_window = Some(3);
    c.window_layers = vec![true, false];
    c.rope_mscale = 1.3;
    c.experts = Some(Experts {
        gating: Gating::SoftmaxPicked,
        biases: true,
        ..moe(4, 2, false, 0)
    });
    out.push(c);
    out
}

#[test]
fn a_mixture_of_identical_experts_is_their_dense_mlp() {
    // With renormalised weights the picked experts' weights sum to 1, so
    // experts that are all one MLP give that MLP, whatever the router says.
    let mut dense_cfg = tiny("qwen3");
    dense_cfg.intermediate_size = 24;
    let dense = model(dense_cfg.clone());
    let mut cfg = dense_cfg.clone();
    cfg.experts = Some(Experts {
        count: 4,
        used: 2,
        ff: 24,
        norm_weights: true,
        shared_ff: 0,
        gating: Gating::Softmax,
        biases: false,
    });
    let mut owned: Owned = Vec::new();
    let mut seed = 3u64;
    for (name, shape, vals) in owned_of(&dense_cfg) {
        let what = ["ffn_gate", "ffn_up", "ffn_down"]
            .into_iter()
            .find(|k| name.ends_with(&format!(".{k}.weight")));
        let Some(what) = what else {
            owned.push((name, shape, vals));
            continue;
        };
        let prefix = &name[..name.len() - what.len() - ".weight".len()];
        owned.push((
            format!("{prefix}{what}_exps.weight"),
            vec![4, shape[0], shape[1]],
            vals.repeat(4),
        ));
        if what == "ffn_gate" {
            let h = dense_cfg.hidden_size;
            owned.push((
                format!("{prefix}ffn_gate_inp.weight"),
                vec![4, h],
                random(4 * h, &mut seed, 3.0),
            ));
        }
    }
    let mixture = Model::new(cfg, Store::open(&[], vec![], owned).unwrap()).unwrap();
    let (mut ca, mut cb) = (cache(&dense, 16), cache(&mixture, 16));
    let want = dense
        .forward(
            &mut [Step {
                cache: &mut ca,
                tokens: &IDS,
            }],
            true,
        )
        .unwrap();
    let got = mixture
        .forward(
            &mut [Step {
                cache: &mut cb,
                tokens: &IDS,
            }],
            true,
        )
        .unwrap();
    close(&got, &want, 1e-5);
}

#[test]
fn partial_rope_rotates_the_leading_pairs_and_passes_the_rest_through() {
    use crate::engine::forward::{rope, rope_tables_for};
    let (hd, heads) = (10, 2);
    let inv: Vec<f64> = vec![1.0, 0.3, 0.07];
    let positions = [0usize, 3, 17];
    let (cos, sin) = rope_tables_for(&inv, 1.0, &positions);
    let mut seed = 7u64;
    let x0 = random(positions.len() * heads * hd, &mut seed, 1.0);
    for style in [RopeStyle::Halves, RopeStyle::Interleaved] {
        let mut x = x0.clone();
        rope(style, &mut x, hd, inv.len(), &cos, &sin);
        for (r, &p) in positions.iter().enumerate() {
            for h in 0..heads {
                let base = (r * heads + h) * hd;
                let (a0, y) = (&x0[base..base + hd], &x[base..base + hd]);
                let mut want: Vec<f64> = a0.iter().map(|&v| v as f64).collect();
                for (i, &f) in inv.iter().enumerate() {
                    let (a, b) = match style {
                        RopeStyle::Halves => (i, i + inv.len()),
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    };
                    let t = p as f64 * f;
                    let (x1, x2) = (a0[a] as f64, a0[b] as f64);
                    want[a] = x1 * t.cos() - x2 * t.sin();
                    want[b] = x2 * t.cos() + x1 * t.sin();
                }
                for j in 0..hd {
                    assert!(
                        (y[j] as f64 - want[j]).abs() < 1e-5,
                        "{style:?} {r} {h} {j}"
                    );
                }
                // Elements 6.. are no pair's: untouched, bit for bit.
                assert_eq!(&y[2 * inv.len()..], &a0[2 * inv.len()..]);
            }
        }
    }
}

#[test]
fn without_rope_in_any_layer_the_last_logits_ignore_the_order_before_them() {
    // One NoPE block sums over keys without positions: the last token's
    // logits are the same for any order of the tokens before it (with a
    // second block, the earlier rows' own causal prefixes would differ).
    // With RoPE they are not.
    let mut cfg = tiny("smollm3");
    cfg.n_layers = 1;
    cfg.nope_layers = vec![true];
    let last = |cfg: &Config, ids: &[i64]| {
        let m = model(cfg.clone());
        let mut c = cache(&m, 16);
        m.forward(
            &mut [Step {
                cache: &mut c,
                tokens: ids,
            }],
            false,
        )
        .unwrap()
    };
    let (a, b) = (last(&cfg, &[3, 9, 14, 2, 7]), last(&cfg, &[14, 2, 9, 3, 7]));
    close(&a, &b, 1e-5);
    cfg.nope_layers = vec![false];
    let (a, b) = (last(&cfg, &[3, 9, 14, 2, 7]), last(&cfg, &[14, 2, 9, 3, 7]));
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(diff > 1e-3, "RoPE must see the order ({diff})");
    cfg.nope_layers = vec![true, true];
    assert!(cfg.validate().is_err(), "a flag per layer");
}

#[test]
fn residual_and_logit_scales_follow_their_definitions() {
    // logit_scale divides the logits; residual_scale 1 is the plain add, bit for bit.
    let mut cfg = tiny("granite");
    let m = model(cfg.clone());
    let run = |m: &Model| {
        let mut c = cache(m, 16);
        m.forward(
            &mut [Step {
                cache: &mut c,
                tokens: &IDS,
            }],
            false,
        )
        .unwrap()
    };
    let base = run(&m);
    cfg.logit_scale = 4.0;
    let scaled = run(&model(cfg.clone()));
    for (s, b) in scaled.iter().zip(&base) {
        assert_eq!(*s, b * 0.25);
    }
    cfg.residual_scale = 0.5;
    let halved = run(&model(cfg.clone()));
    let diff = halved
        .iter()
        .zip(&scaled)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(
        diff > 1e-3,
        "residual_scale must change the logits ({diff})"
    );
    cfg.residual_scale = 0.0;
    assert!(cfg.validate().is_err());
}

#[test]
fn rope_mscale_multiplies_cos_and_sin_only() {
    use crate::engine::forward::{rope_tables, rope_tables_for};
    let mut c = tiny("phi3");
    c.rope_inv_freq.truncate(3);
    c.rope_mscale = 1.3;
    let pos = [0usize, 5, 40];
    let (cos, sin) = rope_tables(&c, &pos);
    let (c1, s1) = rope_tables_for(&c.rope_inv_freq, 1.0, &pos);
    assert_eq!(cos.len(), 9);
    for (got, one) in cos.iter().chain(&sin).zip(c1.iter().chain(&s1)) {
        assert!((got - 1.3 * one).abs() < 1e-6, "{got} vs 1.3 * {one}");
    }
    c.rope_mscale = 0.0;
    assert!(c.validate().is_err());
}

const IDS: [i64; 9] = [1, 5, 7, 3, 9, 30, 2, 11, 4];

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{i}: {x} vs {y}");
    }
}

#[test]
fn cached_decode_equals_prefill_of_the_whole_sequence() {
    for cfg in variants() {
        let m = model(cfg);
        let mut whole = cache(&m, 16);
        let all = m
            .forward(
                &mut [Step {
                    cache: &mut whole,
                    tokens: &IDS,
                }],
                true,
            )
            .unwrap();
        let v = m.cfg.vocab_size;
        let mut c = cache(&m, 16);
        for (i, t) in IDS.iter().enumerate() {
            let got = m
                .forward(
                    &mut [Step {
                        cache: &mut c,
                        tokens: &[*t],
                    }],
                    false,
                )
                .unwrap();
            close(&got, &all[i * v..(i + 1) * v], 1e-4);
        }
        // Chunks of 4 then 5 give the same last row.
        let mut c = cache(&m, 16);
        m.forward(
            &mut [Step {
                cache: &mut c,
                tokens: &IDS[..4],
            }],
            false,
        )
        .unwrap();
        let got = m
            .forward(
                &mut [Step {
                    cache: &mut c,
                    tokens: &IDS[4..],
                }],
                false,
            )
            .unwrap();
        close(&got, &all[8 * v..], 1e-4);
    }
}

#[test]
fn a_batch_row_is_bit_identical_to_the_sequence_alone() {
    for cfg in variants() {
        let m = model(cfg);
        let prompts: [&[i64]; 3] = [&IDS[..3], &IDS[2..8], &IDS[5..6]];
        let mut alone = Vec::new();
        for p in prompts {
            let mut c = cache(&m, 16);
            m.forward(
                &mut [Step {
                    cache: &mut c,
                    tokens: p,
                }],
                false,
            )
            .unwrap();
            alone.push(
                m.forward(
                    &mut [Step {
                        cache: &mut c,
                        tokens: &[13],
                    }],
                    false,
                )
                .unwrap(),
            );
        }
        let mut caches: Vec<KvCache> = prompts
            .iter()
            .map(|p| {
                let mut c = cache(&m, 16);
                m.forward(
                    &mut [Step {
                        cache: &mut c,
                        tokens: p,
                    }],
                    false,
                )
                .unwrap();
                c
            })
            .collect();
        let mut steps: Vec<Step<'_>> = caches
            .iter_mut()
            .map(|c| Step {
                cache: c,
                tokens: &[13],
            })
            .collect();
        let batch = m.forward(&mut steps, false).unwrap();
        let v = m.cfg.vocab_size;
        for (i, want) in alone.iter().enumerate() {
            assert_eq!(&batch[i * v..(i + 1) * v], &want[..], "row {i}");
        }
    }
}

#[test]
fn refused_steps_change_no_cache() {
    let m = model(tiny("llama"));
    let mut a = cache(&m, 4);
    let mut b = cache(&m, 4);
    m.forward(
        &mut [Step {
            cache: &mut a,
            tokens: &IDS[..3],
        }],
        false,
    )
    .unwrap();
    let err = m
        .forward(
            &mut [
                Step {
                    cache: &mut b,
                    tokens: &IDS[..1],
                },
                Step {
                    cache: &mut a,
                    tokens: &IDS[..2],
                },
            ],
            false,
        )
        .unwrap_err();
    assert_eq!(
        err,
        CoreError::Capacity {
            needed: 5,
            capacity: 4
        }
    );
    assert_eq!((a.len(), b.len()), (3, 0));
    let err = m
        .forward(
            &mut [Step {
                cache: &mut b,
                tokens: &[99],
            }],
            false,
        )
        .unwrap_err();
    assert!(matches!(err, CoreError::TokenOutOfRange { token: 99, .. }));
    let mut other = KvCache::new(
        crate::kv::Geometry {
            n_layers: 3,
            ..m.geometry(Dtype::F32)
        },
        4,
    )
    .unwrap();
    assert!(m
        .forward(
            &mut [Step {
                cache: &mut other,
                tokens: &[1]
            }],
            false
        )
        .is_err());
}

#[test]
fn missing_and_misshapen_tensors_are_named() {
    let cfg = tiny("llama");
    let err = Model::new(cfg.clone(), Store::open(&[], vec![], vec![]).unwrap()).unwrap_err();
    assert!(err.to_string().contains("missing tensor"), "{err}");
    let mut wide = cfg.clone();
    wide.hidden_size = 16;
    let m = model(cfg);
    drop(m);
    let mut qcfg = tiny("qwen2");
    qcfg.block.qkv_bias = true;
    let err = Model::new(
        qcfg,
        Store::open(
            &[],
            vec![],
            vec![("token_embd.weight".into(), vec![40, 16], vec![0.0; 640])],
        )
        .unwrap(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("blk.0."), "{err}");
    let _ = wide;
}

#[test]
fn a_team_decode_step_gives_the_general_paths_bits_on_any_thread_count() {
    use crate::engine::team::Team;
    use crate::engine::Activations;
    use crate::kv::Half;
    for cfg in variants() {
        for dtype in [Dtype::F32, Dtype::F16] {
            for activations in [Activations::Exact, Activations::Q8] {
                let mut plain = model(cfg.clone());
                plain.activations = activations;
                let mut want_cache = KvCache::new(plain.geometry(dtype), 16).unwrap();
                let want = one_by_one(&plain, &mut want_cache, &IDS);
                for threads in [1, 2, 3] {
                    let mut m = model(cfg.clone());
                    m.activations = activations;
                    m.team = Some(Team::new(threads).unwrap());
                    let mut c = KvCache::new(m.geometry(dtype), 16).unwrap();
                    for (t, want) in IDS.iter().zip(&want) {
                        let got = m
                            .forward(
                                &mut [Step {
                                    cache: &mut c,
                                    tokens: &[*t],
                                }],
                                false,
                            )
                            .unwrap();
                        assert_eq!(&got, want, "{} {dtype:?} {threads} threads", cfg.arch);
                    }
                    assert_eq!(c.len(), want_cache.len());
                    for layer in 0..m.cfg.n_layers {
                        for head in 0..m.cfg.n_kv_heads {
                            for half in [Half::Keys, Half::Values] {
                                let a = c.head_rows(layer, half, head).unwrap();
                                let b = want_cache.head_rows(layer, half, head).unwrap();
                                assert_eq!(format!("{a:?}"), format!("{b:?}"));
                            }
                        }
                    }
                    // A full cache is refused and left as it was.
                    let mut full = KvCache::new(m.geometry(dtype), 2).unwrap();
                    for t in [1, 2] {
                        m.forward(
                            &mut [Step {
                                cache: &mut full,
                                tokens: &[t],
                            }],
                            false,
                        )
                        .unwrap();
                    }
                    let err = m.forward(
                        &mut [Step {
                            cache: &mut full,
                            tokens: &[3],
                        }],
                        false,
                    );
                    assert!(matches!(err, Err(CoreError::Capacity { .. })));
                    assert_eq!(full.len(), 2);
                }
            }
        }
    }
}

#[test]
fn a_team_decode_step_of_odd_shapes_gives_the_general_paths_bits_on_1_to_3_threads() {
    // Rows that are no multiple of the 4-row tile and chunks cut for the
    // team (each product split in a multiple of the members' count).
    use crate::engine::team::Team;
    let mut cfg = tiny("llama");
    cfg.hidden_size = 36;
    cfg.intermediate_size = 50;
    cfg.vocab_size = 41;
    cfg.n_heads = 3;
    cfg.n_kv_heads = 1;
    let plain = model(cfg.clone());
    let mut want_cache = cache(&plain, 16);
    let want: Vec<Vec<f32>> = IDS
        .iter()
        .map(|t| {
            plain
                .forward(
                    &mut [Step {
                        cache: &mut want_cache,
                        tokens: &[*t],
                    }],
                    false,
                )
                .unwrap()
        })
        .collect();
    for threads in [1, 2, 3] {
        let mut m = model(cfg.clone());
        m.team = Some(Team::new(threads).unwrap());
        let mut c = cache(&m, 16);
        for (t, want) in IDS.iter().zip(&want) {
            let got = m
                .forward(
                    &mut [Step {
                        cache: &mut c,
                        tokens: &[*t],
                    }],
                    false,
                )
                .unwrap();
            assert_eq!(&got, want, "{threads} threads");
        }
    }
}

#[test]
fn a_team_decode_step_past_several_attention_spans_gives_the_general_paths_bits() {
    // Spans of attention (attention::SPAN keys) go to different members and
    // are combined by each; after a prefill of 2 spans and a bit, a window
    // of 70 (a moving first key) and none.
    use crate::engine::attention::SPAN;
    use crate::engine::team::Team;
    let prompt: Vec<i64> = (0..2 * SPAN as i64 + 3).map(|i| (i * 7 + 1) % 40).collect();
    let mut windowed = tiny("mistral");
    windowed.sliding_window = Some(SPAN + 6);
    for cfg in [tiny("llama"), windowed] {
        for dtype in [Dtype::F32, Dtype::F16] {
            let plain = model(cfg.clone());
            let mut want_cache = KvCache::new(plain.geometry(dtype), prompt.len() + 4).unwrap();
            plain
                .forward(
                    &mut [Step {
                        cache: &mut want_cache,
                        tokens: &prompt,
                    }],
                    false,
                )
                .unwrap();
            let want = one_by_one(&plain, &mut want_cache, &[3, 8, 13]);
            for threads in [1, 2, 3] {
                let mut m = model(cfg.clone());
                m.team = Some(Team::new(threads).unwrap());
                let mut c = KvCache::new(m.geometry(dtype), prompt.len() + 4).unwrap();
                m.forward(
                    &mut [Step {
                        cache: &mut c,
                        tokens: &prompt,
                    }],
                    false,
                )
                .unwrap();
                for (t, want) in [3i64, 8, 13].iter().zip(&want) {
                    let got = m
                        .forward(
                            &mut [Step {
                                cache: &mut c,
                                tokens: &[*t],
                            }],
                            false,
                        )
                        .unwrap();
                    assert_eq!(&got, want, "{} {dtype:?} {threads} threads", cfg.arch);
                }
            }
        }
    }
}

#[test]
fn a_team_batched_decode_step_gives_each_sequence_its_bits_alone() {
    // One step of 3 sequences of different lengths (one past an attention
    // span, so its spans split) on a team of 1-3 members, against each
    // sequence decoded alone on the general path; caches alike after.
    use crate::engine::attention::SPAN;
    use crate::engine::team::Team;
    use crate::engine::Activations;
    let long: Vec<i64> = (0..SPAN as i64 + 2).map(|i| (i * 5 + 2) % 40).collect();
    let prompts: [&[i64]; 3] = [&IDS[..3], &long, &IDS[5..6]];
    let mut windowed = tiny("mistral");
    windowed.sliding_window = Some(SPAN - 3);
    let mut qwen3 = tiny("qwen3");
    qwen3.block.qk_norm = true;
    qwen3.block.qkv_bias = true;
    // The mixtures: the sequences of a step pick different experts.
    let mixtures = variants().into_iter().filter(|c| c.experts.is_some());
    for cfg in [tiny("llama"), windowed, qwen3].into_iter().chain(mixtures) {
        for (dtype, activations) in [
            (Dtype::F32, Activations::Exact),
            (Dtype::F16, Activations::Q8),
        ] {
            let mut plain = model(cfg.clone());
            plain.activations = activations;
            let prefilled = |m: &Model| -> Vec<KvCache> {
                prompts
                    .iter()
                    .map(|p| {
                        let mut c = KvCache::new(m.geometry(dtype), 2 * SPAN).unwrap();
                        m.forward(
                            &mut [Step {
                                cache: &mut c,
                                tokens: p,
                            }],
                            false,
                        )
                        .unwrap();
                        c
                    })
                    .collect()
            };
            let mut want_caches = prefilled(&plain);
            let want: Vec<Vec<f32>> = want_caches
                .iter_mut()
                .map(|c| {
                    plain
                        .forward(
                            &mut [Step {
                                cache: c,
                                tokens: &[13],
                            }],
                            false,
                        )
                        .unwrap()
                })
                .collect();
            for threads in [1, 2, 3] {
                let mut m = model(cfg.clone());
                m.activations = activations;
                m.team = Some(Team::new(threads).unwrap());
                let mut caches = prefilled(&m);
                let mut steps: Vec<Step<'_>> = caches
                    .iter_mut()
                    .map(|c| Step {
                        cache: c,
                        tokens: &[13],
                    })
                    .collect();
                let batch = m.forward(&mut steps, false).unwrap();
                let v = m.cfg.vocab_size;
                for (i, want) in want.iter().enumerate() {
                    assert_eq!(
                        &batch[i * v..(i + 1) * v],
                        &want[..],
                        "{} {dtype:?} {threads} threads, row {i}",
                        cfg.arch
                    );
                }
                for (c, w) in caches.iter().zip(&want_caches) {
                    assert_eq!(c.len(), w.len());
                    for layer in 0..m.cfg.n_layers {
                        for head in 0..m.cfg.n_kv_heads {
                            let (a, b) = (
                                c.head_rows(layer, crate::kv::Half::Values, head).unwrap(),
                                w.head_rows(layer, crate::kv::Half::Values, head).unwrap(),
                            );
                            assert_eq!(format!("{a:?}"), format!("{b:?}"));
                        }
                    }
                }
            }
        }
    }
}

/// Process CPU seconds.
fn cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// A probe's setting from the environment, or `default`.
fn probe_env(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The probes' model: SmolLM2-135M's shapes (576 wide, 9 heads over 3 KV
/// heads of 64, 1536 inner) with 6 blocks and a 4096-token vocabulary.
fn smollm2_shaped() -> Config {
    let mut cfg = tiny("llama");
    cfg.vocab_size = 4096;
    cfg.hidden_size = 576;
    cfg.intermediate_size = 1536;
    cfg.n_layers = 6;
    cfg.n_heads = 9;
    cfg.n_kv_heads = 3;
    cfg.head_dim = 64;
    cfg.rope_inv_freq = (0..32)
        .map(|i| 1.0 / 10000f64.powf(2.0 * i as f64 / 64.0))
        .collect();
    cfg
}

/// Not a test: a batched step of 8 sequences on the team against the
/// general path on a rayon pool of the same size, interleaved, on a
/// SmolLM2-shaped float32 model of 6 blocks. Prints the median wall and CPU
/// time of each. `BATCH=8 THREADS=2 cargo test --release -q --lib
/// team_batch_probe -- --ignored --nocapture`
#[test]
#[ignore]
fn team_batch_probe() {
    use crate::engine::team::Team;
    let (batch, threads) = (probe_env("BATCH", 8), probe_env("THREADS", 2));
    let cfg = smollm2_shaped();
    let plain = model(cfg.clone());
    let mut teamed = model(cfg);
    teamed.team = Some(Team::new(threads).unwrap());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let prompt: Vec<i64> = (0..64).map(|i| (i * 37 + 5) % 4096).collect();
    let mut caches: Vec<KvCache> = (0..batch)
        .map(|_| {
            let mut c = KvCache::new(plain.geometry(Dtype::F32), 128).unwrap();
            plain
                .forward(
                    &mut [Step {
                        cache: &mut c,
                        tokens: &prompt,
                    }],
                    false,
                )
                .unwrap();
            c
        })
        .collect();
    let (mut times_team, mut times_pool) = (Vec::new(), Vec::new());
    for round in 0..40 {
        for which in [round % 2, 1 - round % 2] {
            let mut steps: Vec<Step<'_>> = caches
                .iter_mut()
                .map(|c| Step {
                    cache: c,
                    tokens: &[7],
                })
                .collect();
            let (w0, c0) = (std::time::Instant::now(), cpu_seconds());
            if which == 0 {
                teamed.forward(&mut steps, false).unwrap();
            } else {
                pool.install(|| plain.forward(&mut steps, false)).unwrap();
            }
            let t = (w0.elapsed().as_secs_f64(), cpu_seconds() - c0);
            drop(steps);
            for c in &mut caches {
                c.truncate(64).unwrap();
            }
            if which == 0 {
                times_team.push(t)
            } else {
                times_pool.push(t)
            }
        }
    }
    let med = |v: &mut Vec<(f64, f64)>, f: fn(&(f64, f64)) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(|a, b| a.partial_cmp(b).unwrap());
        x[x.len() / 2] * 1e3
    };
    println!(
        "batch {batch}, {threads} threads: team {:.2} ms wall / {:.2} ms cpu; rayon {:.2} ms wall / {:.2} ms cpu",
        med(&mut times_team, |t| t.0),
        med(&mut times_team, |t| t.1),
        med(&mut times_pool, |t| t.0),
        med(&mut times_pool, |t| t.1),
    );
}

#[test]
#[ignore]
fn team_wait_probe() {
    // One-sequence decode steps of a SmolLM2-shaped float32 model (6 blocks)
    // on a team of THREADS (2) at context CTX (128): p10 and median wall,
    // process CPU, and time members spent waiting for the stage before
    // theirs (summed over members), per step.
    // `cargo test --release -q --lib team_wait_probe -- --ignored --nocapture`
    use crate::engine::decode::probe::WAITED_NS;
    use crate::engine::team::Team;
    use std::sync::atomic::Ordering;
    let (threads, ctx) = (probe_env("THREADS", 2), probe_env("CTX", 128));
    let cfg = smollm2_shaped();
    let mut m = model(cfg);
    m.team = Some(Team::new(threads).unwrap());
    let prompt: Vec<i64> = (0..ctx as i64).map(|i| (i * 37 + 5) % 4096).collect();
    let mut c = KvCache::new(m.geometry(Dtype::F32), ctx + 8).unwrap();
    m.forward(
        &mut [Step {
            cache: &mut c,
            tokens: &prompt,
        }],
        false,
    )
    .unwrap();
    let mut times = Vec::new();
    for _ in 0..400 {
        WAITED_NS.store(0, Ordering::Relaxed);
        let (w0, c0) = (std::time::Instant::now(), cpu_seconds());
        m.forward(
            &mut [Step {
                cache: &mut c,
                tokens: &[7],
            }],
            false,
        )
        .unwrap();
        times.push((
            w0.elapsed().as_secs_f64(),
            cpu_seconds() - c0,
            WAITED_NS.load(Ordering::Relaxed) as f64 * 1e-9,
        ));
        c.truncate(ctx).unwrap();
    }
    let q = |f: fn(&(f64, f64, f64)) -> f64, p: usize| {
        let mut x: Vec<f64> = times.iter().map(f).collect();
        x.sort_by(|a, b| a.partial_cmp(b).unwrap());
        x[x.len() * p / 100] * 1e3
    };
    println!(
        "{threads} threads, ctx {ctx}: wall p10 {:.3} / med {:.3} ms, cpu p10 {:.3} / med {:.3} ms, waited p10 {:.3} / med {:.3} ms",
        q(|t| t.0, 10),
        q(|t| t.0, 50),
        q(|t| t.1, 10),
        q(|t| t.1, 50),
        q(|t| t.2, 10),
        q(|t| t.2, 50)
    );
}

#[test]
fn residency_auto_copies_small_files_with_huge_pages_and_room_only() {
    use crate::engine::{Residency, AUTO_COPY_MAX};
    let gib = 1u64 << 30;
    let auto = Residency::Auto;
    assert_eq!(
        auto.decide(100 << 20, Some("madvise"), Some(8 * gib)),
        Residency::Copied
    );
    assert_eq!(
        auto.decide(100 << 20, Some("always"), Some(8 * gib)),
        Residency::Copied
    );
    // No huge pages, an unknown mode, too large, or too little memory: mapped.
    assert_eq!(
        auto.decide(100 << 20, Some("never"), Some(8 * gib)),
        Residency::Mapped
    );
    assert_eq!(
        auto.decide(100 << 20, None, Some(8 * gib)),
        Residency::Mapped
    );
    assert_eq!(
        auto.decide(AUTO_COPY_MAX + 1, Some("madvise"), Some(64 * gib)),
        Residency::Mapped
    );
    assert_eq!(
        auto.decide(100 << 20, Some("madvise"), Some(150 << 20)),
        Residency::Mapped
    );
    assert_eq!(
        auto.decide(100 << 20, Some("madvise"), None),
        Residency::Mapped
    );
    // An explicit choice stands.
    assert_eq!(
        Residency::Copied.decide(u64::MAX, None, None),
        Residency::Copied
    );
    assert_eq!(
        Residency::Mapped.decide(1, Some("always"), Some(64 * gib)),
        Residency::Mapped
    );
    assert_eq!(Residency::from_use_mmap(Some(false)), Residency::Copied);
    assert_eq!(Residency::from_use_mmap(Some(true)), Residency::Mapped);
    assert_eq!(Residency::from_use_mmap(None), Residency::Auto);
}
