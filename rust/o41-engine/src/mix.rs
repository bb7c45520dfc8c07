//! The weighted interleave of a stage's sources: which source each mixed row comes from.
//!
//! A smooth weighted round-robin over integer weights: deterministic (no sampling), and every
//! prefix of the sequence holds each source's share closely. Sources that run out in a finite
//! stage leave the mix and the others continue with their relative weights.

/// Relative weights are scaled so the smallest becomes this many units, keeping ratios exact to
/// a thousandth of the smallest weight.
const WEIGHT_SCALE: f64 = 1000.0;

/// Interleave state.
#[derive(Debug, Clone)]
pub struct Mix {
    weights: Vec<i128>,
    current: Vec<i128>,
    active: Vec<bool>,
    total: i128,
}

impl Mix {
    /// A mix over sources with the given positive weights.
    pub fn new(weights: &[f64]) -> Self {
        let min = weights.iter().copied().fold(f64::INFINITY, f64::min);
        let scaled: Vec<i128> = weights
            .iter()
            .map(|w| ((w / min) * WEIGHT_SCALE).round().max(1.0) as i128)
            .collect();
        Mix {
            total: scaled.iter().sum(),
            current: vec![0; scaled.len()],
            active: vec![true; scaled.len()],
            weights: scaled,
        }
    }

    /// The source of the next row, or `None` when every source has left.
    pub fn pick(&mut self) -> Option<usize> {
        let mut best: Option<usize> = None;
        for j in 0..self.weights.len() {
            if !self.active[j] {
                continue;
            }
            self.current[j] += self.weights[j];
            if best.is_none_or(|b| self.current[j] > self.current[b]) {
                best = Some(j);
            }
        }
        let b = best?;
        self.current[b] -= self.total;
        Some(b)
    }

    /// Takes source `j` out of the mix.
    pub fn remove(&mut self, j: usize) {
        if self.active[j] {
            self.active[j] = false;
            self.total -= self.weights[j];
            self.current[j] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_to_one_interleaves_smoothly() {
        let mut mix = Mix::new(&[3.0, 1.0]);
        let picks: Vec<usize> = (0..8).map(|_| mix.pick().unwrap()).collect();
        assert_eq!(picks, vec![0, 0, 1, 0, 0, 0, 1, 0]);
    }

    #[test]
    fn prefixes_hold_each_share_within_one_row() {
        let weights = [5.0, 2.0, 1.5];
        let total: f64 = weights.iter().sum();
        let mut mix = Mix::new(&weights);
        let mut counts = [0.0; 3];
        for p in 1..=10_000 {
            counts[mix.pick().unwrap()] += 1.0;
            for j in 0..3 {
                let expected = f64::from(p) * weights[j] / total;
                assert!((counts[j] - expected).abs() <= 1.0, "p={p} j={j}");
            }
        }
    }

    #[test]
    fn removed_sources_leave_the_mix() {
        let mut mix = Mix::new(&[1.0, 1.0]);
        mix.remove(0);
        assert!((0..5).all(|_| mix.pick() == Some(1)));
        mix.remove(1);
        assert_eq!(mix.pick(), None);
    }
}
