//! Engine invariants on a tiny random model: cached decode equals
//! re-prefill, chunking does not matter, a batch row equals the same
//! sequence alone (bit for bit), and failures leave caches untouched.

use crate::engine::config::{tiny, Config, RopeStyle};
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
        put(p("attn_norm.weight"), vec![h], 0.2, 1.0);
        put(p("ffn_norm.weight"), vec![h], 0.2, 1.0);
        put(p("attn_q.weight"), vec![qw, h], 0.6, 0.0);
        put(p("attn_k.weight"), vec![kvw, h], 0.6, 0.0);
        put(p("attn_v.weight"), vec![kvw, h], 0.6, 0.0);
        put(p("attn_output.weight"), vec![h, qw], 0.6, 0.0);
        put(p("ffn_gate.weight"), vec![f, h], 0.6, 0.0);
        put(p("ffn_up.weight"), vec![f, h], 0.6, 0.0);
        put(p("ffn_down.weight"), vec![h, f], 0.6, 0.0);
        if cfg.block.qkv_bias {
            put(p("attn_q.bias"), vec![qw], 0.2, 0.0);
            put(p("attn_k.bias"), vec![kvw], 0.2, 0.0);
            put(p("attn_v.bias"), vec![kvw], 0.2, 0.0);
        }
        if cfg.block.qk_norm {
            put(p("attn_q_norm.weight"), vec![hd], 0.2, 1.0);
            put(p("attn_k_norm.weight"), vec![hd], 0.2, 1.0);
        }
    }
    let store = Store::open(&[], vec![], owned).unwrap();
    Model::new(cfg, store).unwrap()
}

fn cache(m: &Model, max_seq: usize) -> KvCache {
    KvCache::new(m.geometry(Dtype::F32), max_seq).unwrap()
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
    out
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
            let want: Vec<Vec<f32>> = [3i64, 8, 13]
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
