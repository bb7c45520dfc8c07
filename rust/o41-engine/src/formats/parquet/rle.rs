//! The Parquet RLE / bit-packed hybrid encoding (`parquet-format`'s `Encodings.md`), which
//! holds repetition and definition levels, dictionary indices and version 2 booleans, read run
//! by run: a run of copies is skipped or counted whole, and a bit-packed value is found from its
//! position, so skipping never decodes what it passes.
//!
//! Every read checks the bytes are there and answers `None` where they are not, or where a
//! header is not of this encoding: callers treat that as a page they do not read.

/// A hybrid-encoded sequence of values of `width` bits.
pub(super) struct Hybrid<'a> {
    data: &'a [u8],
    /// Where the next run's header is.
    pos: usize,
    width: u8,
    /// A one bit in the lowest bit of each `width`-bit field of a word: times a value, the
    /// word that repeats it.
    spread: u64,
    run: Run,
}

enum Run {
    /// `left` more copies of `value`.
    Repeat { value: u32, left: u32 },
    /// `left` more bit-packed values, the next at bit `bit` of the data.
    Packed { bit: usize, left: u32 },
}

impl<'a> Hybrid<'a> {
    /// Values of `width` bits (at most 32) in `data`.
    pub(super) fn new(data: &'a [u8], width: u8) -> Option<Self> {
        (width <= 32).then(|| Hybrid {
            data,
            pos: 0,
            width,
            spread: (0..64)
                .step_by(usize::from(width.max(1)))
                .fold(0, |acc, k| acc | 1 << k),
            run: Run::Repeat { value: 0, left: 0 },
        })
    }

    /// The next value and how many copies of it follow in its run: inside a bit-packed run,
    /// the equal values that one word holds (levels there are mostly runs of a few equal
    /// values, which a walk should not take one at a time).
    pub(super) fn peek(&mut self) -> Option<(u32, u32)> {
        loop {
            match self.run {
                Run::Repeat { value, left } if left > 0 => return Some((value, left)),
                Run::Packed { bit, left } if left > 0 => return Some(self.stretch(bit, left)),
                _ => self.next_run()?,
            }
        }
    }

    /// The bit-packed value at `bit` and how many equal values (at most `left`) follow it
    /// within the eight bytes from its own.
    fn stretch(&self, bit: usize, left: u32) -> (u32, u32) {
        let width = u32::from(self.width);
        let byte = bit / 8;
        let Some(word) = self.data.get(byte..byte + 8) else {
            return (self.packed(bit), 1);
        };
        if width == 0 {
            return (0, left);
        }
        let shift = (bit % 8) as u32;
        let word = u64::from_le_bytes(word.try_into().expect("eight bytes")) >> shift;
        let value = word & ((1u64 << width) - 1);
        // Whole values in the word; past them the shift brought in zeros.
        let whole = (64 - shift) / width;
        let differ = word ^ value.wrapping_mul(self.spread);
        let same = (differ.trailing_zeros() / width).min(whole);
        (value as u32, same.min(left).max(1))
    }

    /// Moves past `n` values, at most what [`Hybrid::peek`] said its run holds.
    pub(super) fn advance(&mut self, n: u32) {
        match &mut self.run {
            Run::Repeat { left, .. } => *left -= n,
            Run::Packed { bit, left } => {
                *left -= n;
                *bit += n as usize * usize::from(self.width);
            }
        }
    }

    /// Moves past `n` values, a run at a time.
    pub(super) fn skip(&mut self, mut n: u64) -> Option<()> {
        while n > 0 {
            self.peek()?;
            let left = match self.run {
                Run::Repeat { left, .. } | Run::Packed { left, .. } => left,
            };
            let take = u64::from(left).min(n) as u32;
            self.advance(take);
            n -= u64::from(take);
        }
        Some(())
    }

    /// Appends the next `n` values to `out`.
    pub(super) fn read(&mut self, n: usize, out: &mut Vec<u32>) -> Option<()> {
        self.read_map(n, out, |value| value)
    }

    /// Appends `f` of each of the next `n` values to `out`: a caller that turns the values
    /// into something else (dictionary indices into entries) does so as they are unpacked.
    pub(super) fn read_map<T: Copy>(
        &mut self,
        mut n: usize,
        out: &mut Vec<T>,
        f: impl Fn(u32) -> T,
    ) -> Option<()> {
        while n > 0 {
            let (value, _) = self.peek()?;
            let (take, packed) = match self.run {
                Run::Repeat { left, .. } => ((left as usize).min(n), None),
                Run::Packed { bit, left } => ((left as usize).min(n), Some(bit)),
            };
            match packed {
                None => out.extend(std::iter::repeat_n(f(value), take)),
                Some(bit) => self.unpack(bit, take, out, &f),
            }
            self.advance(take as u32);
            n -= take;
        }
        Some(())
    }

    /// Appends `f` of the `n` bit-packed values from `bit` on, inside a run whose bytes
    /// `next_run` checked are there: eight at a time from where they start on a byte (eight
    /// values of `width` bits fill `width` bytes), one at a time before and after.
    fn unpack<T: Copy>(&self, bit: usize, n: usize, out: &mut Vec<T>, f: impl Fn(u32) -> T) {
        let width = usize::from(self.width);
        if width == 0 {
            out.extend(std::iter::repeat_n(f(0), n));
            return;
        }
        out.reserve(n);
        let head = (0..n.min(8))
            .take_while(|i| !(bit + i * width).is_multiple_of(8))
            .count();
        self.unpack_each(bit, head, out, &f);
        let byte = (bit + head * width) / 8;
        // Whole groups whose bytes, and the seven a group's last word load reads past them,
        // are in the data.
        let groups = ((n - head) / 8).min(self.data.len().saturating_sub(byte + 7) / width);
        macro_rules! groups {
            ($($w:literal)*) => {
                match width {
                    $($w => unpack_groups::<$w, T>(&self.data[byte..], groups, out, &f),)*
                    _ => unreachable!("widths are at most 32"),
                }
            };
        }
        groups!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);
        let done = head + groups * 8;
        self.unpack_each(bit + done * width, n - done, out, &f);
    }

    /// Appends `f` of the `n` bit-packed values from `bit` on, one at a time.
    fn unpack_each<T>(&self, bit: usize, n: usize, out: &mut Vec<T>, f: &impl Fn(u32) -> T) {
        let width = usize::from(self.width);
        let mask = (1u64 << width) - 1;
        // Values whose eight bytes are all in the data: those before the last seven bytes.
        let words = (self.data.len().saturating_sub(7) * 8)
            .saturating_sub(bit)
            .div_ceil(width)
            .min(n);
        out.extend((0..words).map(|i| {
            let at = bit + i * width;
            let word = &self.data[at / 8..at / 8 + 8];
            let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
            f(((word >> (at % 8)) & mask) as u32)
        }));
        out.extend((words..n).map(|i| f(self.packed(bit + i * width))));
    }

    /// The value at `bit`, inside a run whose bytes `next_run` checked are there.
    fn packed(&self, bit: usize) -> u32 {
        let width = u32::from(self.width);
        if width == 0 {
            return 0;
        }
        let mut word = 0u64;
        for (k, &byte) in self.data[bit / 8..].iter().take(5).enumerate() {
            word |= u64::from(byte) << (8 * k);
        }
        ((word >> (bit % 8)) & ((1u64 << width) - 1)) as u32
    }

    fn next_run(&mut self) -> Option<()> {
        let mut header = 0u64;
        let mut shift = 0;
        let mut at = self.pos;
        loop {
            let byte = *self.data.get(at)?;
            at += 1;
            header |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 35 {
                return None;
            }
        }
        let count = u32::try_from(header >> 1).ok()?;
        if header & 1 == 1 {
            // `count` groups of 8 values, `width` bytes a group.
            let left = count.checked_mul(8)?;
            let end = at.checked_add(count as usize * usize::from(self.width))?;
            if end > self.data.len() {
                return None;
            }
            self.pos = end;
            self.run = Run::Packed { bit: at * 8, left };
        } else {
            let end = at + usize::from(self.width).div_ceil(8);
            let mut value = 0u32;
            for (k, &b) in self.data.get(at..end)?.iter().enumerate() {
                value |= u32::from(b) << (8 * k);
            }
            self.pos = end;
            self.run = Run::Repeat { value, left: count };
        }
        Some(())
    }
}

/// Appends `f` of the `groups` groups of eight `W`-bit values at the start of `data`, which
/// holds seven bytes past them: with the width a constant, each group's shifts are too.
fn unpack_groups<const W: usize, T: Copy>(
    data: &[u8],
    groups: usize,
    out: &mut Vec<T>,
    f: &impl Fn(u32) -> T,
) {
    let mask = (1u64 << W) - 1;
    for g in 0..groups {
        let group = &data[g * W..g * W + W + 7];
        let values: [T; 8] = std::array::from_fn(|j| {
            let at = j * W;
            let word = &group[at / 8..at / 8 + 8];
            let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
            f(((word >> (at % 8)) & mask) as u32)
        });
        out.extend_from_slice(&values);
    }
}

/// Walks repetition and definition levels together (either absent: all zeros), handing
/// `f(rep, def, n)` each stretch of `n` levels over which neither changes, `count` in all.
pub(super) fn lockstep<'a>(
    mut rep: Option<Hybrid<'a>>,
    mut def: Option<Hybrid<'a>>,
    count: u32,
    mut f: impl FnMut(u32, u32, u32) -> Option<()>,
) -> Option<()> {
    let mut left = count;
    while left > 0 {
        let (r, r_run) = match rep.as_mut() {
            Some(levels) => levels.peek()?,
            None => (0, u32::MAX),
        };
        let (d, d_run) = match def.as_mut() {
            Some(levels) => levels.peek()?,
            None => (0, u32::MAX),
        };
        let n = left.min(r_run).min(d_run);
        f(r, d, n)?;
        for levels in [rep.as_mut(), def.as_mut()].into_iter().flatten() {
            levels.advance(n);
        }
        left -= n;
    }
    Some(())
}

/// Bits of a value of at most `max`.
pub(super) fn bit_width(max: u32) -> u8 {
    (32 - max.leading_zeros()) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs of the encoding written by hand: a run of 5 sevens, then a bit-packed group of 8
    /// three-bit values, then a run of 3 ones.
    fn sample() -> Vec<u8> {
        let mut out = vec![5 << 1, 7];
        out.push((1 << 1) | 1);
        // Values 0..8 packed at 3 bits, least significant first.
        let mut bits = 0u32;
        for v in 0..8u32 {
            bits |= v << (3 * v);
        }
        out.extend_from_slice(&bits.to_le_bytes()[..3]);
        out.extend_from_slice(&[3 << 1, 1]);
        out
    }

    #[test]
    fn runs_read_skip_and_end() {
        let data = sample();
        let mut all = Vec::new();
        Hybrid::new(&data, 3).unwrap().read(16, &mut all).unwrap();
        assert_eq!(all, [7, 7, 7, 7, 7, 0, 1, 2, 3, 4, 5, 6, 7, 1, 1, 1]);
        for skip in 0..16 {
            let mut rest = Vec::new();
            let mut values = Hybrid::new(&data, 3).unwrap();
            values.skip(skip as u64).unwrap();
            values.read(16 - skip, &mut rest).unwrap();
            assert_eq!(rest, all[skip..]);
        }
        assert!(Hybrid::new(&data, 3).unwrap().skip(17).is_none());
        // A bit-packed run whose bytes are cut short is refused.
        assert!(Hybrid::new(&data[..4], 3).unwrap().skip(6).is_none());
    }

    /// `values` of `width` bits as the encoding holds them: a run of copies where a value
    /// repeats `repeat_at` times or more, bit-packed groups of eight otherwise (a run of
    /// copies of one value where fewer than eight are left).
    fn encode(values: &[u32], width: u8, repeat_at: usize) -> Vec<u8> {
        fn varint(mut v: u64, out: &mut Vec<u8>) {
            while v >= 0x80 {
                out.push((v as u8) | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
        }
        let mut out = Vec::new();
        let mut i = 0;
        while i < values.len() {
            let same = values[i..].iter().take_while(|&&v| v == values[i]).count();
            if same >= repeat_at || values.len() - i < 8 {
                let take = if same >= repeat_at { same } else { 1 };
                varint((take as u64) << 1, &mut out);
                out.extend_from_slice(&values[i].to_le_bytes()[..usize::from(width).div_ceil(8)]);
                i += take;
            } else {
                // As many groups under one header as there are values before the next long
                // repeat, so runs hold several groups.
                let mut groups = 1;
                while values.len() - i >= 8 * (groups + 1)
                    && values[i + 8 * groups..]
                        .iter()
                        .take_while(|&&v| v == values[i + 8 * groups])
                        .count()
                        < repeat_at
                {
                    groups += 1;
                }
                varint(((groups as u64) << 1) | 1, &mut out);
                let mut packed = vec![0u8; groups * usize::from(width)];
                for (k, &v) in values[i..i + 8 * groups].iter().enumerate() {
                    for b in 0..usize::from(width) {
                        let at = k * usize::from(width) + b;
                        packed[at / 8] |= (((v >> b) & 1) as u8) << (at % 8);
                    }
                }
                out.extend_from_slice(&packed);
                i += 8 * groups;
            }
        }
        out
    }

    proptest::proptest! {
        /// Walking by `peek` and `advance`, and reading, give back the values encoded, and a
        /// walk never claims more equal values than there are.
        #[test]
        fn walk_and_read_give_the_values_back(
            width in 0u8..=32,
            runs in proptest::collection::vec((0u32..4, 1usize..40), 1..30),
            repeat_at in 2usize..20,
            extra in 0u32..u32::MAX,
            skip in 0usize..64,
        ) {
            let mask = if width == 0 { 0 } else { u32::MAX >> (32 - u32::from(width)) };
            let values: Vec<u32> = runs
                .iter()
                .flat_map(|&(v, n)| std::iter::repeat_n((v.wrapping_mul(extra) ^ v) & mask, n))
                .collect();
            let data = encode(&values, width, repeat_at);
            let mut walked = Vec::new();
            let mut hybrid = Hybrid::new(&data, width).unwrap();
            while walked.len() < values.len() {
                let (value, n) = hybrid.peek().unwrap();
                proptest::prop_assert!(n >= 1);
                let n = (n as usize).min(values.len() - walked.len());
                walked.extend(std::iter::repeat_n(value, n));
                hybrid.advance(n as u32);
            }
            proptest::prop_assert_eq!(&walked, &values);
            let mut read = Vec::new();
            Hybrid::new(&data, width).unwrap().read(values.len(), &mut read).unwrap();
            proptest::prop_assert_eq!(&read, &values);
            // From any value on: unpacking starts off a byte (and a group) boundary.
            let skip = skip.min(values.len());
            let mut rest = Vec::new();
            let mut hybrid = Hybrid::new(&data, width).unwrap();
            hybrid.skip(skip as u64).unwrap();
            hybrid.read(values.len() - skip, &mut rest).unwrap();
            proptest::prop_assert_eq!(&rest[..], &values[skip..]);
        }

        /// Any bytes, at any width, are walked, skipped and read without a panic: a read either
        /// hands over all the values asked for or answers `None`, and a walk's runs are never
        /// empty.
        #[test]
        fn any_bytes_are_read_or_refused(
            width in 0u8..=32,
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            steps in proptest::collection::vec((0u8..3, 0usize..300), 1..8),
            packed in proptest::option::of(1u8..16),
        ) {
            // Often one bit-packed run that ends where the data ends: reading its last group
            // must not load the word past it.
            let data = match packed {
                Some(groups) => {
                    let mut run = vec![(groups << 1) | 1];
                    let len = usize::from(groups) * usize::from(width);
                    run.extend(data.iter().cycle().take(len));
                    run.resize(1 + len, 0);
                    run
                }
                None => data,
            };
            let mut hybrid = Hybrid::new(&data, width).unwrap();
            let mut out = Vec::new();
            for (step, n) in steps {
                match step {
                    0 => match hybrid.peek() {
                        Some((_, run)) => {
                            proptest::prop_assert!(run >= 1);
                            hybrid.advance(run.min(n as u32).max(1));
                        }
                        None => break,
                    },
                    1 => {
                        if hybrid.skip(n as u64).is_none() {
                            break;
                        }
                    }
                    _ => {
                        out.clear();
                        if hybrid.read(n, &mut out).is_none() {
                            break;
                        }
                        proptest::prop_assert_eq!(out.len(), n);
                    }
                }
            }
        }
    }
}
