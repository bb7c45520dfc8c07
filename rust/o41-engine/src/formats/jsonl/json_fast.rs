//! A fast path for projecting JSON Lines records whose projected fields are integers, booleans
//! or flat lists of them (token ids, masks): the bulk of a tokenised corpus.
//!
//! serde's generic path costs a visitor call per element; this scanner writes elements straight
//! into the row's slot. It accepts only what it can decide exactly as the serde path would, and
//! gives up (returns false) on anything else: floats, escapes, non-ASCII keys, nested shapes,
//! values that do not fit. The caller then parses the line with serde, which either produces
//! the same row (the fast path writes only values serde writes identically) or the error.

use crate::columns::ColumnBuf;
use crate::dtype::Element;
use crate::fields::Projection;

/// Nesting the scanner follows in skipped values before giving up (serde allows 128).
const MAX_DEPTH: usize = 64;
/// Integer literals of at most this many digits cannot overflow `i64`/`u64`; longer ones (which
/// serde turns into floats) are left to serde.
const MAX_DIGITS: usize = 18;

/// Projects `line` (one JSON object, optionally followed by whitespace) into row `row` of
/// `columns`; false when the serde path must decide instead.
pub fn project(
    line: &[u8],
    projection: &Projection,
    columns: &mut [ColumnBuf],
    row: usize,
) -> bool {
    let mut seen = [false; 16];
    // A field that errors on overflow or pads on the left takes the general path, which counts
    // every list's length.
    if projection.columns.len() > seen.len() || projection.columns.iter().any(|c| !c.plain()) {
        return false;
    }
    let mut s = Scan { b: line, at: 0 };
    if project_object(&mut s, projection, columns, row, &mut seen).is_none() {
        return false;
    }
    s.ws();
    s.at == line.len() && seen[..projection.columns.len()].iter().all(|&x| x)
}

fn project_object(
    s: &mut Scan,
    projection: &Projection,
    columns: &mut [ColumnBuf],
    row: usize,
    seen: &mut [bool],
) -> Option<()> {
    s.ws();
    s.eat(b'{')?;
    s.ws();
    if s.peek()? == b'}' {
        s.at += 1;
        return Some(());
    }
    loop {
        let key = s.key()?;
        s.ws();
        s.eat(b':')?;
        s.ws();
        match projection
            .columns
            .iter()
            .position(|c| c.source.as_bytes() == key)
        {
            Some(k) => {
                let column = &projection.columns[k];
                seen[k] = true;
                let w = column.width;
                let shape = &column.shape;
                crate::with_column!(&mut columns[k], buf => {
                    value_into(s, &mut buf[row * w..(row + 1) * w], shape, column.pad.element())?;
                });
            }
            None => s.skip(0)?,
        }
        s.ws();
        match s.next()? {
            b',' => s.ws(),
            b'}' => return Some(()),
            _ => return None,
        }
    }
}

/// Writes a scalar or a flat list into its slot, every element of it: past a list's end, `pad`.
fn value_into<T: Element>(s: &mut Scan, out: &mut [T], shape: &[usize], pad: T) -> Option<()> {
    match shape {
        [] => {
            out[0] = s.element()?;
            Some(())
        }
        [dim] => {
            s.eat(b'[')?;
            s.ws();
            if s.peek()? == b']' {
                s.at += 1;
                out.fill(pad);
                return Some(());
            }
            let mut j = 0;
            loop {
                let v: T = s.element()?;
                // Values past the declared length are truncated, as the serde path does; they
                // must still be values serde accepts, which `element` checks.
                if j < *dim {
                    out[j] = v;
                }
                j += 1;
                // `, ` (Python's separator) or `,` (the compact one) between elements.
                if s.peek() == Some(b',') {
                    s.at += 1;
                    if s.peek() == Some(b' ') {
                        s.at += 1;
                    }
                    if let Some(b'0'..=b'9' | b'-' | b't' | b'f') = s.peek() {
                        continue;
                    }
                    s.ws();
                    continue;
                }
                s.ws();
                match s.next()? {
                    b',' => s.ws(),
                    b']' => {
                        out[j.min(*dim)..].fill(pad);
                        return Some(());
                    }
                    _ => return None,
                }
            }
        }
        _ => None,
    }
}

/// The leading decimal digits of the eight bytes `word` (the first in its lowest byte) and
/// their value, when there are between one and seven of them; None for none or eight.
#[inline]
fn short_integer(word: u64) -> Option<(usize, u64)> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    // A byte is a digit exactly when it xors with '0' to at most 9.
    let t = word ^ (0x30 * ONES);
    // High bit of each byte over 9. Carries out of a byte over 9 can only reach the bytes after
    // it, so the first flagged byte is exact.
    let over = (t.wrapping_add(0x76 * ONES) | t) & (0x80 * ONES);
    let digits = (over.trailing_zeros() / 8) as usize;
    if digits == 0 || digits == 8 {
        return None;
    }
    // The digits moved to the top bytes (the first the most significant), then combined in
    // pairs, fours and eights.
    let mut v = t << (8 * (8 - digits));
    v = (v.wrapping_mul(10).wrapping_add(v >> 8)) & 0x00ff_00ff_00ff_00ff;
    v = (v.wrapping_mul(100).wrapping_add(v >> 16)) & 0x0000_ffff_0000_ffff;
    v = (v.wrapping_mul(10_000).wrapping_add(v >> 32)) & 0x0000_0000_ffff_ffff;
    Some((digits, v))
}

struct Scan<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    #[inline]
    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.at += 1;
        Some(c)
    }

    #[inline]
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// A string of printable ASCII without escapes; anything else is left to serde.
    fn key(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.at;
        loop {
            match self.next()? {
                b'"' => return Some(&self.b[start..self.at - 1]),
                0x20..=0x7e if self.b[self.at - 1] != b'\\' => {}
                _ => return None,
            }
        }
    }

    /// One element: an integer literal (as serde would visit it: `u64` when non-negative,
    /// `i64` when negative) or `true`/`false`, converted exactly as the serde path converts it.
    #[inline]
    fn element<T: Element>(&mut self) -> Option<T> {
        match self.peek()? {
            b't' => self.literal(b"true").and_then(|()| T::from_bool(true)),
            b'f' => self.literal(b"false").and_then(|()| T::from_bool(false)),
            _ => {
                let (negative, magnitude) = self.integer()?;
                if negative {
                    // serde reads `-0` as the float -0.0.
                    if magnitude == 0 {
                        return None;
                    }
                    T::from_i64(-(magnitude as i64))
                } else {
                    T::from_u64(magnitude)
                }
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.b.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// `-?(0|[1-9][0-9]*)` of at most `MAX_DIGITS` digits, not followed by a fraction or an
    /// exponent (a float, or a malformed number: serde's to decide).
    #[inline]
    fn integer(&mut self) -> Option<(bool, u64)> {
        let b = self.b;
        let negative = b.get(self.at) == Some(&b'-');
        let start = self.at + usize::from(negative);
        // Token ids and masks are short numbers: up to seven digits are read eight bytes at a
        // time where eight bytes remain.
        if let Some(word) = b.get(start..start + 8) {
            let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
            if let Some((digits, v)) = short_integer(word) {
                if digits > 1 && b[start] == b'0' {
                    return None;
                }
                if let b'.' | b'e' | b'E' = b[start + digits] {
                    return None;
                }
                self.at = start + digits;
                return Some((negative, v));
            }
        }
        let mut i = start;
        let mut v = 0u64;
        // Wrapping: a literal long enough to wrap is refused below by its digit count.
        while let Some(d) = b.get(i).map(|c| c.wrapping_sub(b'0')).filter(|&d| d <= 9) {
            v = v.wrapping_mul(10).wrapping_add(u64::from(d));
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || digits > MAX_DIGITS || (digits > 1 && b[start] == b'0') {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = b.get(i) {
            return None;
        }
        self.at = i;
        Some((negative, v))
    }

    /// Skips one value serde would accept (and `IgnoredAny` would skip without error).
    fn skip(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.key().map(|_| ()),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'[' => {
                self.at += 1;
                self.ws();
                if self.peek()? == b']' {
                    self.at += 1;
                    return Some(());
                }
                loop {
                    self.skip(depth + 1)?;
                    self.ws();
                    match self.next()? {
                        b',' => self.ws(),
                        b']' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b'{' => {
                self.at += 1;
                self.ws();
                if self.peek()? == b'}' {
                    self.at += 1;
                    return Some(());
                }
                loop {
                    self.key()?;
                    self.ws();
                    self.eat(b':')?;
                    self.ws();
                    self.skip(depth + 1)?;
                    self.ws();
                    match self.next()? {
                        b',' => self.ws(),
                        b'}' => return Some(()),
                        _ => return None,
                    }
                }
            }
            _ => self.integer().map(|_| ()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::record::project_record;

    use crate::columns::test_projection as projection;

    fn columns(p: &Projection) -> Vec<ColumnBuf> {
        crate::columns::junk_row(p)
    }

    fn values(cols: &[ColumnBuf]) -> Vec<Vec<f64>> {
        cols.iter()
            .map(|c| match c {
                ColumnBuf::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
                ColumnBuf::I64(v) => v.iter().map(|&x| x as f64).collect(),
                ColumnBuf::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
                ColumnBuf::F64(v) => v.to_vec(),
                ColumnBuf::Bool(v) => v.iter().map(|&x| f64::from(x)).collect(),
            })
            .collect()
    }

    /// Whenever the fast path accepts a line, serde accepts it too and writes the same row.
    fn agrees(p: &Projection, line: &str) -> bool {
        let mut fast = columns(p);
        let accepted = project(line.as_bytes(), p, &mut fast, 0);
        if accepted {
            let mut slow = columns(p);
            let mut de = serde_json::Deserializer::from_str(line);
            project_record(&mut de, p, &mut slow, 0).unwrap();
            de.end().unwrap();
            assert_eq!(values(&fast), values(&slow), "{line}");
        }
        accepted
    }

    #[test]
    fn takes_tokens_and_masks_and_agrees_with_serde() {
        let p = projection(&[
            ("ids", DType::I32, vec![4]),
            ("mask", DType::Bool, vec![4]),
            ("n", DType::I64, vec![]),
        ]);
        for line in [
            r#"{"ids":[1,2,3],"mask":[true,false,1],"n":-7}"#,
            "{ \"x\" : {\"a\": [1, \"s\", null, [], {}]}, \"ids\" : [ 5 , 6,7,8,9,10 ] ,\"mask\":[],\"n\":0}\n",
            r#"{"n":1,"ids":[],"mask":[true],"ids":[9]}"#,
        ] {
            assert!(agrees(&p, line), "{line}");
        }
    }

    #[test]
    fn short_integers_read_eight_bytes_at_a_time_as_byte_by_byte() {
        let tails = [
            "", ",", "]", " ", ".5", "e3", "x", "}", "\n", "/", ":", "\u{7f}",
        ];
        let mut numbers: Vec<String> = vec!["0".into(), "00".into(), "007".into(), "-0".into()];
        for len in 1..=20 {
            numbers.push("9".repeat(len));
            numbers.push(format!("1{}", "0".repeat(len - 1)));
            numbers.push(
                (0..len)
                    .map(|k| char::from(b'0' + ((k * 7 + 3) % 10) as u8))
                    .collect(),
            );
        }
        numbers.push(u64::MAX.to_string());
        for n in &numbers {
            for sign in ["", "-"] {
                for tail in tails {
                    for pad in ["", "        "] {
                        let text = format!("{sign}{n}{tail}{pad}");
                        let fast = Scan {
                            b: text.as_bytes(),
                            at: 0,
                        }
                        .integer();
                        let mut slow = Scan {
                            b: text.as_bytes(),
                            at: 0,
                        };
                        // Byte by byte: the same text with nothing after it for a word to read.
                        let bytewise = slow_integer(&mut slow);
                        assert_eq!(fast, bytewise, "{text:?}");
                    }
                }
            }
        }
    }

    /// The byte-by-byte reading `integer` falls back to.
    fn slow_integer(s: &mut Scan) -> Option<(bool, u64)> {
        let text = s.b.to_vec();
        let negative = text.first() == Some(&b'-');
        let start = usize::from(negative);
        let end = text[start..]
            .iter()
            .position(|c| !c.is_ascii_digit())
            .map_or(text.len(), |p| p + start);
        let digits = end - start;
        if digits == 0 || digits > MAX_DIGITS || (digits > 1 && text[start] == b'0') {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = text.get(end) {
            return None;
        }
        let v = std::str::from_utf8(&text[start..end])
            .unwrap()
            .parse::<u64>()
            .ok()?;
        Some((negative, v))
    }

    #[test]
    fn leaves_anything_unusual_to_serde() {
        let p = projection(&[("ids", DType::I32, vec![2]), ("f", DType::F32, vec![])]);
        for line in [
            r#"{"ids":[1,2],"f":1.5}"#,
            r#"{"ids":[1,2],"f":-0}"#,
            r#"{"ids":[1,2.0],"f":1}"#,
            r#"{"ids":[1,3000000000],"f":1}"#,
            r#"{"ids":[1,2],"f":1,"x":1e400}"#,
            r#"{"ids":[1,2],"f":1,"x":"caf\u00e9"}"#,
            r#"{"ids":[1,2],"f":1,"x":"été"}"#,
            r#"{"ids":[1,2],"f":1,"x":01}"#,
            r#"{"ids":[[1],2],"f":1}"#,
            r#"{"ids":[1,2]}"#,
            r#"{"ids":[1,2],"f":1} x"#,
            r#"{"ids":[1,2],"f":1,}"#,
            r#"{"ids":[1,2],"f":12345678901234567890}"#,
            "[1]",
            r#"{"ids":[1,2],"f":1"#,
        ] {
            assert!(!agrees(&p, line), "{line}");
        }
        agrees(&p, r#"{"ids":[1,2],"f":16777217}"#);
    }
}
