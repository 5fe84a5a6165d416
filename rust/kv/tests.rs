//! Core KV-cache behaviour, checked against plain vectors.

use ndarray::Array3;

use super::*;
use crate::CoreError;

const H: usize = 2;
const D: usize = 3;

fn geometry(n_layers: usize, dtype: Dtype) -> Geometry {
    Geometry {
        n_layers,
        n_kv_heads: H,
        head_dim: D,
        dtype,
    }
}

/// `[H, n, D]` rows whose values encode (tag, head, token, dim).
fn rows(tag: f32, start: usize, n: usize) -> Array3<f32> {
    Array3::from_shape_fn((H, n, D), |(h, t, d)| {
        tag * 1000.0 + h as f32 * 100.0 + (start + t) as f32 + d as f32 * 0.25
    })
}

fn read(claim: Option<Claim>, half: Half) -> Vec<f32> {
    let Some(claim) = claim else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for head in 0..H {
        // SAFETY: the claim covers its rows.
        let bytes = unsafe { claim.slab().rows(half, head, claim.len()) };
        out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap())),
        );
    }
    out
}

fn expected(parts: &[(f32, usize, usize)]) -> Vec<f32> {
    // Concatenate along tokens, then flatten head-major.
    let mut per_head: Vec<Vec<f32>> = vec![Vec::new(); H];
    for &(tag, start, n) in parts {
        let a = rows(tag, start, n);
        for (h, out) in per_head.iter_mut().enumerate() {
            out.extend(a.index_axis(ndarray::Axis(0), h).iter().copied());
        }
    }
    per_head.concat()
}

#[test]
fn appends_show_up_per_layer_and_len_is_the_minimum() {
    let mut c = KvCache::new(geometry(2, Dtype::F32), 8).unwrap();
    c.append(0, rows(1.0, 0, 3).view(), rows(2.0, 0, 3).view())
        .unwrap();
    assert_eq!(c.len(), 0, "layer 1 holds nothing yet");
    assert_eq!(
        read(c.claim_layer(0).unwrap(), Half::Keys),
        expected(&[(1.0, 0, 3)])
    );
    assert!(matches!(c.snapshot(), Err(CoreError::Shape(_))));
    c.append(1, rows(3.0, 0, 3).view(), rows(4.0, 0, 3).view())
        .unwrap();
    assert_eq!(c.len(), 3);
    assert_eq!(c.nbytes(), 2 * 2 * H * 3 * D * 4);
    assert_eq!(
        read(c.claim_layer(1).unwrap(), Half::Values),
        expected(&[(4.0, 0, 3)])
    );
}

#[test]
fn bad_input_leaves_the_cache_unchanged() {
    let mut c = KvCache::new(geometry(1, Dtype::F32), 4).unwrap();
    c.append(0, rows(1.0, 0, 3).view(), rows(1.0, 0, 3).view())
        .unwrap();
    let err = c
        .append(0, rows(1.0, 3, 2).view(), rows(1.0, 3, 2).view())
        .unwrap_err();
    assert_eq!(
        err,
        CoreError::Capacity {
            needed: 5,
            capacity: 4
        }
    );
    assert!(matches!(
        c.append(1, rows(1.0, 3, 1).view(), rows(1.0, 3, 1).view()),
        Err(CoreError::InvalidOption { .. })
    ));
    let wrong = Array3::<f32>::zeros((H + 1, 1, D));
    assert!(matches!(
        c.append(0, wrong.view(), rows(1.0, 3, 1).view()),
        Err(CoreError::Shape(_))
    ));
    assert!(matches!(
        c.append(0, rows(1.0, 3, 1).view(), rows(1.0, 3, 2).view()),
        Err(CoreError::Shape(_))
    ));
    assert!(matches!(
        c.truncate(4),
        Err(CoreError::InvalidOption { .. })
    ));
    assert_eq!(c.len(), 3);
    assert_eq!(
        read(c.claim_layer(0).unwrap(), Half::Keys),
        expected(&[(1.0, 0, 3)])
    );
}

#[test]
fn snapshots_never_change_and_appending_after_one_copies_nothing() {
    let mut c = KvCache::new(geometry(1, Dtype::F32), 64).unwrap();
    c.append(0, rows(1.0, 0, 5).view(), rows(1.0, 0, 5).view())
        .unwrap();
    let snap = c.snapshot().unwrap();
    let slab_before = snap.storage()[0].slab;
    c.append(0, rows(2.0, 5, 2).view(), rows(2.0, 5, 2).view())
        .unwrap();
    assert_eq!(
        c.claim_layer(0).unwrap().unwrap().slab().id(),
        slab_before,
        "appending beyond the snapshot stays in the shared slab"
    );
    // Truncating below the snapshot and writing moves the cache away.
    c.truncate(2).unwrap();
    c.append(0, rows(3.0, 2, 4).view(), rows(3.0, 2, 4).view())
        .unwrap();
    assert_ne!(c.claim_layer(0).unwrap().unwrap().slab().id(), slab_before);
    assert_eq!(
        read(c.claim_layer(0).unwrap(), Half::Keys),
        expected(&[(1.0, 0, 2), (3.0, 2, 4)])
    );
    assert_eq!(
        read(snap.claim_layer(0).unwrap(), Half::Keys),
        expected(&[(1.0, 0, 5)])
    );
}

#[test]
fn two_caches_restored_from_one_snapshot_diverge_independently() {
    let g = geometry(2, Dtype::F32);
    let mut a = KvCache::new(g, 16).unwrap();
    for layer in 0..2 {
        a.append(layer, rows(1.0, 0, 4).view(), rows(1.0, 0, 4).view())
            .unwrap();
    }
    let snap = a.snapshot().unwrap();
    let mut b = KvCache::new(g, 16).unwrap();
    let mut c = KvCache::new(g, 32).unwrap();
    b.restore(&snap).unwrap();
    c.restore(&snap).unwrap();
    for layer in 0..2 {
        b.append(layer, rows(2.0, 4, 3).view(), rows(2.0, 4, 3).view())
            .unwrap();
        c.append(layer, rows(3.0, 4, 2).view(), rows(3.0, 4, 2).view())
            .unwrap();
        a.append(layer, rows(4.0, 4, 1).view(), rows(4.0, 4, 1).view())
            .unwrap();
    }
    for layer in 0..2 {
        for (cache, tag, n) in [(&a, 4.0, 1), (&b, 2.0, 3), (&c, 3.0, 2)] {
            assert_eq!(
                read(cache.claim_layer(layer).unwrap(), Half::Values),
                expected(&[(1.0, 0, 4), (tag, 4, n)])
            );
        }
        assert_eq!(
            read(snap.claim_layer(layer).unwrap(), Half::Keys),
            expected(&[(1.0, 0, 4)])
        );
    }
}

#[test]
fn restore_refuses_other_geometry_and_oversized_snapshots() {
    let mut a = KvCache::new(geometry(1, Dtype::F32), 8).unwrap();
    a.append(0, rows(1.0, 0, 6).view(), rows(1.0, 0, 6).view())
        .unwrap();
    let snap = a.snapshot().unwrap();
    let mut other = KvCache::new(geometry(2, Dtype::F32), 8).unwrap();
    assert!(matches!(
        other.restore(&snap),
        Err(CoreError::SnapshotMismatch(_))
    ));
    let mut half = KvCache::new(geometry(1, Dtype::F16), 8).unwrap();
    assert!(matches!(
        half.restore(&snap),
        Err(CoreError::SnapshotMismatch(_))
    ));
    let mut small = KvCache::new(geometry(1, Dtype::F32), 4).unwrap();
    assert!(matches!(
        small.restore(&snap),
        Err(CoreError::SnapshotMismatch(_))
    ));
    assert_eq!(small.len(), 0);
}

#[test]
fn strided_input_is_read_correctly() {
    let mut c = KvCache::new(geometry(1, Dtype::F32), 8).unwrap();
    // [n, H, D] transposed to [H, n, D]: rows contiguous, heads strided.
    let tnd = rows(5.0, 0, 4)
        .permuted_axes([1, 0, 2])
        .as_standard_layout()
        .to_owned();
    let hnd = tnd.view().permuted_axes([1, 0, 2]);
    // Fully strided: every other dim.
    let wide = Array3::from_shape_fn((H, 4, 2 * D), |(h, t, d)| {
        rows(6.0, 0, 4)[[h, t, d / 2]] + if d % 2 == 1 { 1e6 } else { 0.0 }
    });
    let strided = wide.slice(ndarray::s![.., .., ..;2]);
    c.append(0, hnd, strided).unwrap();
    assert_eq!(
        read(c.claim_layer(0).unwrap(), Half::Keys),
        expected(&[(5.0, 0, 4)])
    );
    assert_eq!(
        read(c.claim_layer(0).unwrap(), Half::Values),
        expected(&[(6.0, 0, 4)])
    );
}

#[test]
fn state_round_trips_and_rejects_damage() {
    for dtype in [Dtype::F32, Dtype::F16] {
        let mut c = KvCache::new(geometry(2, dtype), 8).unwrap();
        for layer in 0..2 {
            c.append(
                layer,
                rows(layer as f32, 0, 5).view(),
                rows(9.0, 0, 5).view(),
            )
            .unwrap();
        }
        let snap = c.snapshot().unwrap();
        let state = snap.to_state().unwrap();
        let back = KvSnapshot::from_state(&state).unwrap();
        assert_eq!(back.len(), 5);
        assert_eq!(back.geometry(), snap.geometry());
        assert_eq!(back.to_state().unwrap(), state);
        assert!(KvSnapshot::from_state(&state[..state.len() - 1]).is_err());
        let mut bad = state.clone();
        bad[0] ^= 1;
        assert!(matches!(
            KvSnapshot::from_state(&bad),
            Err(CoreError::Format(_))
        ));
    }
}

#[test]
fn float16_storage_rounds_each_value() {
    let mut c = KvCache::new(geometry(1, Dtype::F16), 8).unwrap();
    let k = rows(0.001, 0, 3);
    c.append(0, k.view(), k.view()).unwrap();
    let claim = c.claim_layer(0).unwrap().unwrap();
    // SAFETY: the claim covers 3 rows.
    let bytes = unsafe { claim.slab().rows(Half::Keys, 1, 3) };
    let got: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    let want: Vec<u16> = k
        .index_axis(ndarray::Axis(0), 1)
        .iter()
        .map(|&x| f32_to_f16(x))
        .collect();
    assert_eq!(got, want);
    assert_eq!(c.nbytes(), 2 * H * 3 * D * 2);
}

#[test]
fn storage_counts_whole_blocks_per_layer() {
    let mut c = KvCache::new(geometry(2, Dtype::F32), 64).unwrap();
    for layer in 0..2 {
        c.append(layer, rows(1.0, 0, 17).view(), rows(1.0, 0, 17).view())
            .unwrap();
    }
    let s = c.snapshot().unwrap().storage();
    assert_eq!(s.len(), 2);
    assert!(s
        .iter()
        .all(|u| u.blocks == 2 && u.block_bytes == BLOCK_TOKENS * 2 * H * D * 4));
    assert_ne!(s[0].slab, s[1].slab);
}

#[test]
fn large_loaded_snapshots_use_padded_huge_page_storage_transparently() {
    let g = Geometry {
        n_layers: 1,
        n_kv_heads: 2,
        head_dim: 128,
        dtype: Dtype::F32,
    };
    let len = 4097; // each head's rows just over one 2 MiB page
    let mut c = KvCache::new(g, len + 3).unwrap();
    let k = Array3::from_shape_fn((2, len, 128), |(h, t, d)| {
        (h * 1_000_000 + t * 128 + d) as f32
    });
    c.append(0, k.view(), k.view()).unwrap();
    let snap = c.snapshot().unwrap();
    let back = KvSnapshot::from_state(&snap.to_state().unwrap()).unwrap();
    let claim = back.claim_layer(0).unwrap().unwrap();
    assert_eq!(claim.slab().strides()[0] % HUGE_PAGE, 0);
    let original = snap.claim_layer(0).unwrap().unwrap();
    for head in 0..2 {
        // SAFETY: both claims cover `len` rows.
        let (a, b) = unsafe {
            (
                claim.slab().rows(Half::Values, head, len),
                original.slab().rows(Half::Values, head, len),
            )
        };
        assert_eq!(a, b);
    }
    // A cache restored from it copies correctly when it moves the layer to
    // grow (a loaded slab holds the loaded rows only), and again on truncate.
    let mut r = KvCache::new(g, len + 3).unwrap();
    r.restore(&back).unwrap();
    let one = Array3::<f32>::from_elem((2, 1, 128), 7.0);
    r.append(0, one.view(), one.view()).unwrap();
    r.truncate(len - 1).unwrap();
    r.append(0, one.view(), one.view()).unwrap();
    let moved = r.claim_layer(0).unwrap().unwrap();
    // SAFETY: the claim covers `len` rows.
    let rows = unsafe { moved.slab().rows(Half::Keys, 1, len) };
    let floats: Vec<f32> = rows
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(floats[0], 1_000_000.0);
    assert_eq!(
        floats[(len - 2) * 128],
        (1_000_000 + (len - 2) * 128) as f32
    );
    assert_eq!(floats[(len - 1) * 128], 7.0);
}

#[test]
fn hostile_sizes_are_errors_not_panics() {
    for (n_layers, heads, dim) in [(1 << 40, 1, 1), (1, 1 << 40, 1), (1, 1, usize::MAX / 2)] {
        let g = Geometry {
            n_layers,
            n_kv_heads: heads,
            head_dim: dim,
            dtype: Dtype::F32,
        };
        assert!(matches!(
            KvCache::new(g, 4),
            Err(CoreError::InvalidOption { .. })
        ));
    }
    assert!(KvCache::new(geometry(1, Dtype::F32), usize::MAX / 4).is_err());
    // A pickled state claiming absurd geometry or capacity.
    let mut c = KvCache::new(geometry(1, Dtype::F32), 4).unwrap();
    c.append(0, rows(1.0, 0, 2).view(), rows(1.0, 0, 2).view())
        .unwrap();
    let good = c.snapshot().unwrap().to_state().unwrap();
    for (field, value) in [
        (0, 1u64 << 40),
        (1, 1 << 62),
        (2, u64::MAX),
        (4, 1 << 50),
        (5, 1 << 61),
    ] {
        let mut bad = good.clone();
        bad[8 + 8 * field..16 + 8 * field].copy_from_slice(&value.to_le_bytes());
        assert!(
            matches!(KvSnapshot::from_state(&bad), Err(CoreError::Format(_))),
            "field {field}"
        );
    }
}

#[test]
fn a_loaded_state_reserves_its_rows_not_its_claimed_capacity() {
    // Issue 16: 32 KB claiming max_seq = 2^24 over 4096 layers reserved 512 GiB.
    let g = Geometry {
        n_layers: 4096,
        n_kv_heads: 1,
        head_dim: 1,
        dtype: Dtype::F32,
    };
    let mut state = Vec::from(&b"RLXKVSN1"[..]);
    for field in [4096u64, 1, 1, 0, MAX_SEQ_LIMIT as u64, 1] {
        state.extend_from_slice(&field.to_le_bytes());
    }
    state.extend((0..4096 * 2).flat_map(|i| (i as f32).to_le_bytes()));
    let snap = KvSnapshot::from_state(&state).unwrap();
    assert_eq!((snap.len(), snap.max_seq()), (1, MAX_SEQ_LIMIT));
    for layer in [0, 4095] {
        let claim = snap.claim_layer(layer).unwrap().unwrap();
        assert_eq!(claim.slab().capacity(), 1, "layer {layer}");
    }
    // Restored into a cache of that capacity, it grows by moving, rows intact.
    let mut c = KvCache::new(g, 64).unwrap();
    c.restore(&snap).unwrap();
    let one = Array3::<f32>::from_elem((1, 1, 1), -1.0);
    c.append(4095, one.view(), one.view()).unwrap();
    let moved = c.claim_layer(4095).unwrap().unwrap();
    assert_eq!(moved.slab().capacity(), 64);
    // SAFETY: the claim covers 2 rows.
    let keys = unsafe { moved.slab().rows(Half::Keys, 0, 2) };
    let first = f32::from_le_bytes(keys[..4].try_into().unwrap());
    assert_eq!(first, (2 * 4095) as f32);
}

#[test]
fn capacity_beyond_what_a_snapshot_file_can_hold_is_refused() {
    // A cache whose snapshot no loader would accept cannot be made.
    let g = geometry(1, Dtype::F32);
    assert!(KvCache::new(g, MAX_SEQ_LIMIT).is_ok());
    assert!(matches!(
        KvCache::new(g, MAX_SEQ_LIMIT + 1),
        Err(CoreError::InvalidOption { .. })
    ));
}

#[test]
fn prefix_shares_rows_and_counts_fewer_blocks() {
    let mut c = KvCache::new(geometry(2, Dtype::F32), 64).unwrap();
    for layer in 0..2 {
        c.append(layer, rows(1.0, 0, 40).view(), rows(2.0, 0, 40).view())
            .unwrap();
    }
    let full = c.snapshot().unwrap();
    let head = full.prefix(17).unwrap();
    assert_eq!(head.len(), 17);
    assert_eq!(head.max_seq(), full.max_seq());
    let (a, b) = (full.storage(), head.storage());
    assert_eq!(a.len(), 2);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.slab, y.slab, "the prefix shares the snapshot's storage");
        assert_eq!((x.blocks, y.blocks), (3, 2));
    }
    let want: Vec<f32> = read(full.claim_layer(1).unwrap(), Half::Values)
        .chunks(40 * D)
        .flat_map(|head_rows| head_rows[..17 * D].to_vec())
        .collect();
    assert_eq!(read(head.claim_layer(1).unwrap(), Half::Values), want);
    assert!(full.prefix(0).unwrap().is_empty());
    assert!(matches!(
        full.prefix(41),
        Err(CoreError::InvalidOption { .. })
    ));
}
