//! Counter-based randomness: every random choice is a pure function of a key built from
//! (seed, stage, source, epoch, window, ...). No RNG state, no thread-local generators.

/// The `SplitMix64` finaliser: a fast, well-mixed bijection on `u64`.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Folds a sequence of integers into one key; order matters.
pub fn key(parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(0x006F_3431_u64, |acc, &p| mix64(acc ^ mix64(p)))
}

/// Domain tags keep keys for different purposes apart.
pub mod tag {
    /// Shard order of a source in an epoch.
    pub const SHARDS: u64 = 1;
    /// Unit permutation of a shuffle window.
    pub const WINDOW: u64 = 2;
    /// Block order of a source in an epoch.
    pub const BLOCKS: u64 = 3;
}

/// A keyed bijection on `[0, n)`: a four-round balanced Feistel network on the smallest even
/// number of bits covering `n`, with cycle walking. O(1) memory and, on average, fewer than four
/// network evaluations per call.
#[derive(Debug, Clone, Copy)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    key: u64,
}

impl Permutation {
    /// The permutation of `[0, n)` selected by `key`.
    pub fn new(n: u64, key: u64) -> Self {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        Permutation {
            n,
            half_bits: bits.div_ceil(2).max(1),
            key,
        }
    }

    fn network(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for round in 0..4u64 {
            let f = mix64(self.key ^ (round << 56) ^ right) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }

    /// The image of `x` (which must be below `n`).
    pub fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        let mut y = self.network(x);
        // The network permutes [0, 4^half_bits); walking the cycle until it lands in [0, n)
        // restricts it to a permutation of [0, n).
        while y >= self.n {
            y = self.network(y);
        }
        y
    }
}

/// A uniformly shuffled order of `0..n`, for small `n` (shard lists).
pub fn shuffled(n: usize, key: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (mix64(key ^ i as u64) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_bijections() {
        for n in [1u64, 2, 3, 5, 16, 17, 100, 1000, 4097] {
            let p = Permutation::new(n, key(&[7, n]));
            let mut seen = vec![false; n as usize];
            for x in 0..n {
                let y = p.apply(x);
                assert!(!seen[y as usize], "n={n} x={x}");
                seen[y as usize] = true;
            }
        }
    }

    #[test]
    fn different_keys_give_different_orders() {
        let a: Vec<u64> = (0..64).map(|x| Permutation::new(64, 1).apply(x)).collect();
        let b: Vec<u64> = (0..64).map(|x| Permutation::new(64, 2).apply(x)).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn shuffled_is_a_permutation() {
        let mut s = shuffled(50, 3);
        s.sort_unstable();
        assert_eq!(s, (0..50).collect::<Vec<_>>());
    }
}
