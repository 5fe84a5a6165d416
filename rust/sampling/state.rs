//! A chain's state as bytes (for pickling): knobs, order, sequence, step,
//! mirostat's `mu` and what the last sample left for `accept`.
//!
//! The knobs are written by iterating the knob table ([`KNOBS`]): each as its
//! name and its value, so a new knob needs nothing here. A state from before
//! a knob existed loads with that knob at its default; a knob this build
//! does not know is refused by name (the state is from a newer version).
//! States of the previous format (`RLXSMP02`, fixed knob fields) still load.
//!
//! The reader trusts nothing: every count is checked against the bytes that
//! are left before anything is allocated, so a hostile state costs at most
//! its own size, and the knobs are validated as new options are.

use super::knobs::{Knobs, Mirostat, Value, Window, KNOBS};
use super::mirostat::Surprises;
use super::order::OrderSpec;
use crate::error::{CoreError, CoreResult};

/// The format written: knobs by name from the table.
const MAGIC: &[u8; 8] = b"RLXSMP03";
/// The previous format (fixed knob fields), still read.
const MAGIC_V2: &[u8; 8] = b"RLXSMP02";
/// The headers' common prefix; what follows is the format's version.
const FAMILY: &[u8; 6] = b"RLXSMP";
/// Most knob entries a state can hold.
const MAX_KNOBS: usize = 256;
/// Longest preset or stage name kept in a state.
const MAX_NAME: usize = 64;
/// Most stage names a custom order can list in a state.
const MAX_STAGES: usize = 64;

/// Everything needed to rebuild a chain exactly where it was.
#[derive(Clone, Debug, PartialEq)]
pub struct ChainState {
    pub knobs: Knobs,
    pub order: OrderSpec,
    pub sequence: u64,
    pub step: u64,
    pub mu: f32,
    pub pending: Option<Surprises>,
    /// The vocabulary of the last row sampled (checks `accept`'s token).
    pub vocab: Option<u64>,
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f32(&mut self, v: f32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.u64(x);
            }
        }
    }
    fn name(&mut self, s: &str) {
        let b = &s.as_bytes()[..s.len().min(MAX_NAME)];
        self.u8(b.len() as u8);
        self.0.extend_from_slice(b);
    }
    fn pairs(&mut self, v: &[(u32, f32)]) {
        self.u64(v.len() as u64);
        for &(t, x) in v {
            self.u32(t);
            self.f32(x);
        }
    }
    fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// One knob's value, tagged with its shape. Numbers are written as the
    /// table gives them (float32 knobs widened to f64, integers as i128), so
    /// they read back exactly; token ids and biases, which a valid knob holds
    /// as u32 and f32, in those.
    fn value(&mut self, v: &Value) {
        let id = |t: i128| u32::try_from(t).unwrap_or(u32::MAX);
        match v {
            Value::None | Value::Other(_) => self.u8(0),
            Value::Float(x) => {
                self.u8(1);
                self.f64(*x);
            }
            Value::Int(n) => {
                self.u8(2);
                self.0.extend_from_slice(&n.to_le_bytes());
            }
            Value::Pair(a, b) => {
                self.u8(3);
                self.f64(*a);
                self.f64(*b);
            }
            Value::Tokens(t) => {
                self.u8(4);
                self.u64(t.len() as u64);
                for &t in t {
                    self.u32(id(t));
                }
            }
            Value::Bias(b) => {
                self.u8(5);
                let b: Vec<(u32, f32)> = b.iter().map(|&(t, x)| (id(t), x as f32)).collect();
                self.pairs(&b);
            }
        }
    }
}

struct Reader<'a> {
    rest: &'a [u8],
}

fn bad(why: impl std::fmt::Display) -> CoreError {
    CoreError::Format(format!("not a sampler chain state: {why}"))
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> CoreResult<&'a [u8]> {
        if self.rest.len() < n {
            return Err(bad("truncated"));
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }
    fn u8(&mut self) -> CoreResult<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> CoreResult<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> CoreResult<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn f32(&mut self) -> CoreResult<f32> {
        Ok(f32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn usize(&mut self, what: &str) -> CoreResult<usize> {
        usize::try_from(self.u64()?).map_err(|_| bad(format!("{what} too large")))
    }
    fn flag(&mut self) -> CoreResult<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            x => Err(bad(format!("bad flag {x}"))),
        }
    }
    fn opt_u64(&mut self) -> CoreResult<Option<u64>> {
        Ok(if self.flag()? {
            Some(self.u64()?)
        } else {
            None
        })
    }
    fn name(&mut self) -> CoreResult<String> {
        let n = self.u8()? as usize;
        if n > MAX_NAME {
            return Err(bad("name too long"));
        }
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| bad("name is not UTF-8"))
    }
    /// A count of items `item` bytes each, refused unless that many bytes are left.
    fn count(&mut self, item: usize, what: &str) -> CoreResult<usize> {
        let n = self.u64()?;
        let left = (self.rest.len() / item) as u64;
        if n > left {
            return Err(bad(format!(
                "{what} claims {n} entries, the state holds at most {left}"
            )));
        }
        Ok(n as usize)
    }
    fn pairs(&mut self, what: &str) -> CoreResult<Vec<(u32, f32)>> {
        let n = self.count(8, what)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push((self.u32()?, self.f32()?));
        }
        Ok(v)
    }
    fn f64(&mut self) -> CoreResult<f64> {
        Ok(f64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn value(&mut self, what: &str) -> CoreResult<Value> {
        Ok(match self.u8()? {
            0 => Value::None,
            1 => Value::Float(self.f64()?),
            2 => Value::Int(i128::from_le_bytes(
                self.take(16)?.try_into().expect("16 bytes"),
            )),
            3 => Value::Pair(self.f64()?, self.f64()?),
            4 => {
                let n = self.count(4, what)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(i128::from(self.u32()?));
                }
                Value::Tokens(v)
            }
            5 => Value::Bias(
                self.pairs(what)?
                    .into_iter()
                    .map(|(t, b)| (i128::from(t), f64::from(b)))
                    .collect(),
            ),
            x => return Err(bad(format!("{what}: unknown value tag {x}"))),
        })
    }
    /// The knobs of a current-format state: entries by name, every knob the
    /// state does not name at its default, checked as new options are.
    fn knobs(&mut self) -> CoreResult<Knobs> {
        let n = self.count(2, "knobs")?;
        if n > MAX_KNOBS {
            return Err(bad("too many knobs"));
        }
        let mut values: Vec<Option<Value>> = vec![None; KNOBS.len()];
        for _ in 0..n {
            let name = self.name()?;
            let Some(i) = KNOBS.iter().position(|k| k.name == name) else {
                return Err(bad(format!(
                    "it sets knob {name:?}, which this version does not have \
                     (the state was made by a newer version)"
                )));
            };
            let v = self.value(&name)?;
            if values[i].replace(v).is_some() {
                return Err(bad(format!("knob {name:?} is set twice")));
            }
        }
        let values = values
            .into_iter()
            .zip(&KNOBS)
            .map(|(v, spec)| v.unwrap_or_else(|| (spec.get)(&Knobs::default())))
            .collect();
        Knobs::from_values(values)
    }
}

impl ChainState {
    /// The state as self-describing bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let k = &self.knobs;
        let mut w = Writer(Vec::with_capacity(768 + 8 * k.logit_bias.len()));
        w.0.extend_from_slice(MAGIC);
        w.u64(KNOBS.len() as u64);
        for spec in &KNOBS {
            w.name(spec.name);
            w.value(&(spec.get)(k));
        }
        match &self.order {
            OrderSpec::Preset(name) => {
                w.u8(0);
                w.name(name);
            }
            OrderSpec::Custom(names) => {
                w.u8(1);
                w.u64(names.len() as u64);
                for n in names {
                    w.name(n);
                }
            }
        }
        w.u64(self.sequence);
        w.u64(self.step);
        w.f32(self.mu);
        match &self.pending {
            None => w.u8(0),
            Some(p) => {
                w.u8(1);
                w.pairs(p);
            }
        }
        w.opt_u64(self.vocab);
        w.0
    }

    /// Inverse of [`Self::to_bytes`], also reading the previous format
    /// (`RLXSMP02`); refuses anything malformed or truncated, and another
    /// version's header by its name. The knobs are checked as new options
    /// are ([`Knobs::from_values`]).
    pub fn from_bytes(bytes: &[u8]) -> CoreResult<Self> {
        let mut r = Reader { rest: bytes };
        let knobs = match r.take(8).ok() {
            Some(m) if m == MAGIC.as_slice() => r.knobs()?,
            Some(m) if m == MAGIC_V2.as_slice() => v2_knobs(&mut r)?,
            Some(m) if m.starts_with(FAMILY) => {
                return Err(bad(format!(
                    "format {:?} is not one this version reads ({:?}, {:?}); \
                     it was made by another version of rlx_lm",
                    String::from_utf8_lossy(m),
                    String::from_utf8_lossy(MAGIC),
                    String::from_utf8_lossy(MAGIC_V2),
                )))
            }
            _ => return Err(bad("missing header (made by another version?)")),
        };
        let order = match r.u8()? {
            0 => OrderSpec::Preset(r.name()?),
            1 => {
                let n = r.count(1, "order")?;
                if n > MAX_STAGES {
                    return Err(bad("order lists too many stages"));
                }
                let mut names = Vec::with_capacity(n);
                for _ in 0..n {
                    names.push(r.name()?);
                }
                OrderSpec::Custom(names)
            }
            x => return Err(bad(format!("unknown order tag {x}"))),
        };
        let sequence = r.u64()?;
        let step = r.u64()?;
        let mu = r.f32()?;
        let pending = if r.flag()? {
            Some(r.pairs("pending")?)
        } else {
            None
        };
        let vocab = r.opt_u64()?;
        if !r.rest.is_empty() {
            return Err(bad("trailing bytes"));
        }
        Ok(ChainState {
            knobs,
            order,
            sequence,
            step,
            mu,
            pending,
            vocab,
        })
    }
}

/// The knobs of a previous-format state (`RLXSMP02`): fixed fields in a
/// fixed order, as that version wrote them. Frozen: new knobs are not
/// added here (they take their defaults).
// Every field is named as the old format had it; `..Knobs::default()` gives
// knobs added since then their defaults (and keeps this compiling).
#[allow(clippy::needless_update)]
fn v2_knobs(r: &mut Reader<'_>) -> CoreResult<Knobs> {
    let mut f = [0f32; 15];
    for x in &mut f {
        *x = r.f32()?;
    }
    let top_k = r.usize("top_k")?;
    let dry_allowed_length = r.usize("dry_allowed_length")?;
    let dry_max_ngram = r.usize("dry_max_ngram")?;
    let mirostat_m = r.usize("mirostat_m")?;
    let min_keep = r.usize("min_keep")?;
    let repetition_window = match r.u8()? {
        0 => Window::Preset,
        1 => Window::All,
        2 => Window::Last(r.usize("repetition_window")?),
        x => return Err(bad(format!("unknown window tag {x}"))),
    };
    let dynamic_temp = if r.flag()? {
        Some((r.f32()?, r.f32()?))
    } else {
        None
    };
    let mirostat = match r.u8()? {
        0 => Mirostat::Off,
        1 => Mirostat::V1,
        2 => Mirostat::V2,
        m => return Err(bad(format!("unknown mirostat {m}"))),
    };
    let seed = r.u64()?;
    let n = r.count(4, "dry_sequence_breakers")?;
    let mut dry_sequence_breakers = Vec::with_capacity(n);
    for _ in 0..n {
        dry_sequence_breakers.push(r.u32()?);
    }
    let logit_bias = r.pairs("logit_bias")?;
    let knobs = Knobs {
        temperature: f[0],
        top_p: f[1],
        min_p: f[2],
        typical_p: f[3],
        top_n_sigma: f[4],
        repetition_penalty: f[5],
        frequency_penalty: f[6],
        presence_penalty: f[7],
        dynamic_temp_exponent: f[8],
        xtc_threshold: f[9],
        xtc_prob: f[10],
        dry_multiplier: f[11],
        dry_base: f[12],
        mirostat_tau: f[13],
        mirostat_eta: f[14],
        top_k,
        repetition_window,
        dynamic_temp,
        dry_allowed_length,
        dry_max_ngram,
        dry_sequence_breakers,
        mirostat,
        mirostat_m,
        min_keep,
        seed,
        logit_bias,
        ..Knobs::default()
    };
    knobs.validate()?;
    Ok(knobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_state() -> ChainState {
        ChainState {
            knobs: Knobs {
                temperature: 0.7,
                top_k: 40,
                logit_bias: vec![(3, -1.5), (9, f32::NEG_INFINITY)],
                dry_sequence_breakers: vec![1, 2],
                dynamic_temp: None,
                mirostat: Mirostat::V2,
                repetition_window: Window::All,
                seed: 77,
                ..Knobs::default()
            },
            order: OrderSpec::Custom(vec!["temperature".into(), "top_k".into()]),
            sequence: 5,
            step: 12,
            mu: 7.25,
            pending: Some(vec![(1, 0.5), (4, 3.0)]),
            vocab: Some(32000),
        }
    }

    #[test]
    fn a_state_round_trips() {
        let s = sample_state();
        assert_eq!(ChainState::from_bytes(&s.to_bytes()), Ok(s));
        let s = ChainState {
            order: OrderSpec::Preset("llama.cpp".into()),
            pending: None,
            vocab: None,
            ..sample_state()
        };
        assert_eq!(ChainState::from_bytes(&s.to_bytes()), Ok(s));
    }

    #[test]
    fn every_truncation_and_bad_header_is_refused() {
        let b = sample_state().to_bytes();
        for n in 0..b.len() {
            assert!(ChainState::from_bytes(&b[..n]).is_err(), "prefix {n}");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(ChainState::from_bytes(&extra).is_err());
        let mut wrong = b;
        wrong[0] = b'X';
        assert!(ChainState::from_bytes(&wrong).is_err());
    }

    /// Where knob `name`'s value starts in a current-format state.
    fn value_at(b: &[u8], name: &str) -> usize {
        let mut entry = vec![name.len() as u8];
        entry.extend_from_slice(name.as_bytes());
        let at = b
            .windows(entry.len())
            .position(|w| w == entry.as_slice())
            .expect("the knob is in the state");
        at + entry.len()
    }

    #[test]
    fn a_huge_count_is_refused_before_allocating() {
        let mut b = ChainState {
            pending: None,
            vocab: None,
            order: OrderSpec::Preset("default".into()),
            knobs: Knobs::default(),
            ..sample_state()
        }
        .to_bytes();
        // The breakers: their tag (tokens), then their count.
        let at = value_at(&b, "dry_sequence_breakers") + 1;
        assert_eq!(&b[at..at + 8], &0u64.to_le_bytes());
        b[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        match ChainState::from_bytes(&b) {
            Err(CoreError::Format(m)) => assert!(m.contains("claims"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// A state written by the previous format (`RLXSMP02`, from the release
    /// before knobs were written by name): a chain with temperature 0.7,
    /// top-p 0.9, a bias, penalties, DRY, mirostat 2, min_keep 2, seed 77,
    /// sequence 5, after one sample and one peek on a 16-token row.
    const V2_STATE: &str = "524c58534d5030323333333f6666663f000000000000803f00000000cdcc8c3f00000000000000000000803f00000000000000000000003f0000e03f0000a040cdcccc3d000000000000000002000000000000002000000000000000640000000000000002000000000000000100024d00000000000000020000000000000001000000020000000200000000000000030000000000c0bf09000000000080ff000764656661756c7405000000000000000100000000000000e1262541010700000000000000080000008f4b95400a00000033d475400b000000bc725b400c000000451141400d000000d1af26400e0000005b4e0c400f000000cbd9e33f011000000000000000";

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn a_previous_format_state_still_loads() {
        let old = hex(V2_STATE);
        assert_eq!(&old[..8], MAGIC_V2);
        let s = ChainState::from_bytes(&old).unwrap();
        let want = Knobs {
            temperature: 0.7,
            top_p: 0.9,
            logit_bias: vec![(3, -1.5), (9, f32::NEG_INFINITY)],
            dry_multiplier: 0.5,
            dry_sequence_breakers: vec![1, 2],
            mirostat: Mirostat::V2,
            repetition_penalty: 1.1,
            repetition_window: Window::All,
            min_keep: 2,
            seed: 77,
            ..Knobs::default()
        };
        assert_eq!(s.knobs, want);
        assert_eq!(s.order, OrderSpec::Preset("default".into()));
        assert_eq!((s.sequence, s.step, s.vocab), (5, 1, Some(16)));
        assert!(s.mu > 10.0 && s.mu < 10.5, "{}", s.mu);
        assert_eq!(s.pending.as_ref().map(Vec::len), Some(7));
        // Written again, it is the current format, and reads back the same.
        let new = s.to_bytes();
        assert_eq!(&new[..8], MAGIC);
        assert_eq!(ChainState::from_bytes(&new), Ok(s));
    }

    #[test]
    fn another_versions_header_is_refused_by_name() {
        let mut b = sample_state().to_bytes();
        b[..8].copy_from_slice(b"RLXSMP01");
        match ChainState::from_bytes(&b) {
            Err(CoreError::Format(m)) => {
                assert!(m.contains("\"RLXSMP01\"") && m.contains("RLXSMP03"), "{m}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// One knob's entry: its name and its bytes (name and value).
    type Entry = (String, Vec<u8>);

    /// A current-format state cut into its knob entries:
    /// (the bytes before the knob count, the entries, the bytes after).
    fn split_knobs(b: &[u8]) -> (Vec<u8>, Vec<Entry>, Vec<u8>) {
        let mut r = Reader { rest: &b[8..] };
        let n = r.u64().unwrap() as usize;
        let mut entries = Vec::new();
        for _ in 0..n {
            let before = r.rest;
            let name = r.name().unwrap();
            r.value(&name).unwrap();
            let len = before.len() - r.rest.len();
            entries.push((name, before[..len].to_vec()));
        }
        (b[..8].to_vec(), entries, r.rest.to_vec())
    }

    fn join(head: &[u8], entries: &[Entry], tail: &[u8]) -> Vec<u8> {
        let mut out = head.to_vec();
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for (_, e) in entries {
            out.extend_from_slice(e);
        }
        out.extend_from_slice(tail);
        out
    }

    #[test]
    fn a_knob_the_state_does_not_name_takes_its_default() {
        // As a state from before that knob existed: it loads, at the default.
        let s = sample_state();
        let (head, mut entries, tail) = split_knobs(&s.to_bytes());
        assert_eq!(entries.len(), KNOBS.len());
        entries.retain(|(n, _)| n != "top_k");
        let got = ChainState::from_bytes(&join(&head, &entries, &tail)).unwrap();
        assert_eq!(got.knobs.top_k, Knobs::default().top_k);
        assert_eq!(
            got.knobs,
            Knobs {
                top_k: Knobs::default().top_k,
                ..s.knobs.clone()
            }
        );
        // The entries may come in any order.
        entries.reverse();
        assert!(ChainState::from_bytes(&join(&head, &entries, &tail)).is_ok());
    }

    #[test]
    fn an_unknown_or_repeated_knob_is_refused_by_name() {
        let (head, entries, tail) = split_knobs(&sample_state().to_bytes());
        let mut newer = entries.clone();
        let mut e = vec![9u8];
        e.extend_from_slice(b"top_kappa");
        e.push(0); // None
        newer.push(("top_kappa".into(), e));
        match ChainState::from_bytes(&join(&head, &newer, &tail)) {
            Err(CoreError::Format(m)) => {
                assert!(m.contains("\"top_kappa\"") && m.contains("newer"), "{m}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let mut twice = entries.clone();
        twice.push(entries[0].clone());
        match ChainState::from_bytes(&join(&head, &twice, &tail)) {
            Err(CoreError::Format(m)) => assert!(m.contains("twice"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_state_with_an_invalid_knob_is_refused_like_new_options() {
        let mut b = sample_state().to_bytes();
        let at = value_at(&b, "top_p");
        assert_eq!(b[at], 1, "a float");
        b[at + 1..at + 9].copy_from_slice(&2.0f64.to_le_bytes());
        match ChainState::from_bytes(&b) {
            Err(e @ CoreError::InvalidOption { .. }) => {
                assert!(e.to_string().contains("top_p"), "{e}")
            }
            other => panic!("expected an option error, got {other:?}"),
        }
    }
}
