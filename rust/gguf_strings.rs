//! GGUF metadata string arrays, walked in Rust.
//!
//! A tokenizer's tokens and merges (50k-150k strings each) are the bulk of a
//! GGUF header. Python stepping over them one length prefix at a time took
//! ~0.1 s for SmolLM2's 49k + 49k; the header walk itself (every count and
//! bound check, the error messages) stays in `rlx_lm._headers`, which hands
//! this function one chunk of bytes at a time.

/// What [`walk_strings`] found in a chunk.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Strings {
    /// Strings that lie whole in the chunk (at most the count asked for).
    pub parsed: u64,
    /// Bytes they take, length prefixes included.
    pub consumed: usize,
    /// Their text, when asked to keep it (else empty).
    pub texts: Vec<String>,
    /// The index (from the chunk's first string) of the first string that is
    /// not UTF-8, when keeping; the walk stops there.
    pub bad_utf8: Option<u64>,
}

/// Up to `count` GGUF strings (a u64 length, then that many bytes) from the
/// start of `chunk`, stopping at the first one not whole in the chunk.
/// Lengths are little-endian unless `big_endian`. With `keep`, each string's
/// text is decoded (and the walk stops at the first that is not UTF-8);
/// without, the strings are only stepped over.
pub fn walk_strings(chunk: &[u8], count: u64, big_endian: bool, keep: bool) -> Strings {
    let mut out = Strings::default();
    let mut at = 0usize;
    while out.parsed < count {
        let Some(prefix) = chunk.get(at..at + 8) else {
            break;
        };
        let prefix: [u8; 8] = prefix.try_into().expect("eight bytes");
        let n = if big_endian {
            u64::from_be_bytes(prefix)
        } else {
            u64::from_le_bytes(prefix)
        };
        let start = at + 8;
        let Some(end) = usize::try_from(n).ok().and_then(|n| start.checked_add(n)) else {
            break;
        };
        let Some(bytes) = chunk.get(start..end) else {
            break;
        };
        if keep {
            match std::str::from_utf8(bytes) {
                Ok(text) => out.texts.push(text.to_owned()),
                Err(_) => {
                    out.bad_utf8 = Some(out.parsed);
                    break;
                }
            }
        }
        out.parsed += 1;
        at = end;
    }
    out.consumed = at;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(items: &[&[u8]], big_endian: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for item in items {
            let n = item.len() as u64;
            out.extend(if big_endian {
                n.to_be_bytes()
            } else {
                n.to_le_bytes()
            });
            out.extend_from_slice(item);
        }
        out
    }

    #[test]
    fn whole_strings_are_read_in_order_either_byte_order() {
        for big in [false, true] {
            let items: [&[u8]; 4] = [b"a", b"", "é日".as_bytes(), b"x\0y"];
            let buf = encode(&items, big);
            let got = walk_strings(&buf, 4, big, true);
            assert_eq!(got.parsed, 4);
            assert_eq!(got.consumed, buf.len());
            assert_eq!(got.texts, ["a", "", "é日", "x\0y"]);
            assert_eq!(got.bad_utf8, None);
            // Without keep: the same walk, no text.
            let skip = walk_strings(&buf, 4, big, false);
            assert_eq!((skip.parsed, skip.consumed), (4, buf.len()));
            assert!(skip.texts.is_empty());
        }
    }

    #[test]
    fn the_walk_stops_at_the_count_and_at_a_string_not_whole() {
        let buf = encode(&[b"ab", b"cde", b"f"], false);
        let two = walk_strings(&buf, 2, false, true);
        assert_eq!((two.parsed, two.consumed), (2, 8 + 2 + 8 + 3));
        for cut in 0..buf.len() {
            let got = walk_strings(&buf[..cut], 3, false, true);
            let whole = [0, 10, 21, 30].iter().filter(|&&end| end <= cut).count() - 1;
            assert_eq!(got.parsed as usize, whole, "cut at {cut}");
            assert_eq!(got.texts.len(), whole);
        }
    }

    #[test]
    fn a_huge_length_is_a_string_not_whole_not_an_overflow() {
        let mut buf = u64::MAX.to_le_bytes().to_vec();
        buf.extend_from_slice(b"abc");
        let got = walk_strings(&buf, 1, false, true);
        assert_eq!((got.parsed, got.consumed), (0, 0));
        let mut buf = (usize::MAX as u64 - 4).to_le_bytes().to_vec();
        buf.extend_from_slice(b"abc");
        assert_eq!(walk_strings(&buf, 1, false, false).parsed, 0);
    }

    #[test]
    fn the_first_string_that_is_not_utf8_stops_a_keeping_walk() {
        let buf = encode(&[b"ok", b"\xff\xfe", b"later"], false);
        let got = walk_strings(&buf, 3, false, true);
        assert_eq!(got.bad_utf8, Some(1));
        assert_eq!((got.parsed, got.texts.len()), (1, 1));
        assert_eq!(walk_strings(&buf, 3, false, false).parsed, 3);
    }
}
