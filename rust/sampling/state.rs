//! A chain's state as bytes (for pickling): knobs, order, sequence, step,
//! mirostat's `mu` and what the last sample left for `accept`.
//!
//! The reader trusts nothing: every count is checked against the bytes that
//! are left before anything is allocated, so a hostile state costs at most
//! its own size, and the knobs are validated again when the chain is rebuilt.

use super::knobs::{Knobs, Mirostat, Window};
use super::mirostat::Surprises;
use super::order::OrderSpec;
use crate::error::{CoreError, CoreResult};

const MAGIC: &[u8; 8] = b"RLXSMP02";
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
}

impl ChainState {
    /// The state as self-describing bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let k = &self.knobs;
        let mut w = Writer(Vec::with_capacity(256 + 8 * k.logit_bias.len()));
        w.0.extend_from_slice(MAGIC);
        for v in [
            k.temperature,
            k.top_p,
            k.min_p,
            k.typical_p,
            k.top_n_sigma,
            k.repetition_penalty,
            k.frequency_penalty,
            k.presence_penalty,
            k.dynamic_temp_exponent,
            k.xtc_threshold,
            k.xtc_prob,
            k.dry_multiplier,
            k.dry_base,
            k.mirostat_tau,
            k.mirostat_eta,
        ] {
            w.f32(v);
        }
        for v in [
            k.top_k,
            k.dry_allowed_length,
            k.dry_max_ngram,
            k.mirostat_m,
            k.min_keep,
        ] {
            w.u64(v as u64);
        }
        match k.repetition_window {
            Window::Preset => w.u8(0),
            Window::All => w.u8(1),
            Window::Last(n) => {
                w.u8(2);
                w.u64(n as u64);
            }
        }
        match k.dynamic_temp {
            None => w.u8(0),
            Some((lo, hi)) => {
                w.u8(1);
                w.f32(lo);
                w.f32(hi);
            }
        }
        w.u8(match k.mirostat {
            Mirostat::Off => 0,
            Mirostat::V1 => 1,
            Mirostat::V2 => 2,
        });
        w.u64(k.seed);
        w.u64(k.dry_sequence_breakers.len() as u64);
        for &t in &k.dry_sequence_breakers {
            w.u32(t);
        }
        w.pairs(&k.logit_bias);
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

    /// Inverse of [`Self::to_bytes`]; refuses anything malformed or truncated.
    /// The knobs are not validated here: building the chain does that.
    pub fn from_bytes(bytes: &[u8]) -> CoreResult<Self> {
        let mut r = Reader { rest: bytes };
        if r.take(8).ok() != Some(MAGIC.as_slice()) {
            return Err(bad("missing header (made by another version?)"));
        }
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
        };
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
        // The breakers' count sits after the header, 15 f32s, 5 u64s,
        // the window's tag (the preset's), dynamic_temp's flag, mirostat and the seed.
        let at = 8 + 15 * 4 + 5 * 8 + 1 + 1 + 1 + 8;
        assert_eq!(&b[at..at + 8], &0u64.to_le_bytes());
        b[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        match ChainState::from_bytes(&b) {
            Err(CoreError::Format(m)) => assert!(m.contains("claims"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
