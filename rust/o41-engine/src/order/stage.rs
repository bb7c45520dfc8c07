//! A stage's output order: output position `o` → input (mixed) position through the shuffle
//! window → source row through the mix → shard row through the source's epoch layout.
//!
//! The window shuffle: output positions are cut into windows of `window` rows (the configured
//! `buffer_rows` rounded up to whole units); window `w` is a permutation of the mixed rows
//! `[w * window, (w + 1) * window)`, moved in units of `unit` consecutive rows by a keyed
//! bijection. The last window of a finite stage permutes its whole units; a trailing partial
//! unit stays in place at the very end (it always falls in the rows a finite stage drops).

use super::keyed::{key, tag, Permutation};
use super::mix::MixSchedule;
use super::ramp::Batching;
use super::source::{SourceOrder, SourceRow};
use crate::config::{ResolvedStage, ShuffleSpec};
use crate::error::{Error, Result};

/// Rows that stay together when the shuffle window moves rows, unless configured.
pub const DEFAULT_UNIT_ROWS: u64 = 8;

/// The shuffle window in rows (the configured `buffer_rows` rounded up to whole units) and the
/// unit; `(0, 1)` when unshuffled. `s` names the stage in errors.
pub fn window_rows(shuffle: Option<ShuffleSpec>, s: usize) -> Result<(u64, u64)> {
    let Some(sh) = shuffle else {
        return Ok((0, 1));
    };
    let unit = sh
        .unit_rows
        .unwrap_or(DEFAULT_UNIT_ROWS)
        .clamp(1, sh.buffer_rows.max(1));
    let window = sh
        .buffer_rows
        .div_ceil(unit)
        .checked_mul(unit)
        .ok_or_else(|| {
            Error::config(
                format!("stages[{s}].shuffle.buffer_rows"),
                format!(
                    "{} rows do not fit 64 bits once rounded to whole units",
                    sh.buffer_rows
                ),
            )
        })?;
    Ok((window, unit))
}

/// A row of a stage, with where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageRow {
    /// Source index within the stage.
    pub source: usize,
    /// Row index within the source's endless sequence.
    pub index: u64,
    /// Epoch, shard and row.
    pub at: SourceRow,
}

/// The order of one stage.
#[derive(Debug, Clone)]
pub struct StageOrder {
    /// Rows per global batch (the largest, when a ramp grows it).
    pub batch_size: u64,
    /// The global batches' sizes: one, or a ramp.
    pub batching: Batching,
    /// Shuffle window in rows (a whole number of units); 0 when unshuffled.
    pub window: u64,
    /// Rows moved together by the shuffle.
    pub unit: u64,
    mix: MixSchedule,
    sources: Vec<SourceOrder>,
    key: u64,
}

impl StageOrder {
    /// The order of `stage` (index `s`) under `seed`.
    pub fn new(stage: &ResolvedStage, s: usize, seed: u64) -> Result<Self> {
        let shuffle = stage.shuffle;
        let sources: Vec<SourceOrder> = stage
            .sources
            .iter()
            .enumerate()
            .map(|(j, src)| {
                SourceOrder::new(
                    src.shards.iter().map(|f| f.rows).collect(),
                    shuffle.is_some(),
                    seed,
                    s,
                    j,
                )
            })
            .collect();
        let weights: Vec<f64> = stage.sources.iter().map(|src| src.weight).collect();
        let rows: Vec<u64> = sources.iter().map(SourceOrder::total).collect();
        let mix = MixSchedule::new(
            &weights,
            (!stage.infinite).then_some(rows.as_slice()),
            &format!("stages[{s}].sources"),
        )?;
        let (window, unit) = window_rows(shuffle, s)?;
        Ok(StageOrder {
            batch_size: stage.batch_size as u64,
            batching: Batching::new(stage.batch_size as u64, stage.ramp),
            window,
            unit,
            mix,
            sources,
            key: key(&[seed, tag::WINDOW, s as u64]),
        })
    }

    /// Total rows of a finite stage; `None` when infinite.
    pub fn total(&self) -> Option<u64> {
        self.mix.total()
    }

    /// The source orders.
    pub fn sources(&self) -> &[SourceOrder] {
        &self.sources
    }

    /// End of the shuffle window holding output position `o` (clipped to the stage's end);
    /// `o` itself when unshuffled or at a window boundary.
    pub fn window_end(&self, o: u64) -> u64 {
        if self.window == 0 || o.is_multiple_of(self.window) {
            return o;
        }
        let end = (o / self.window + 1) * self.window;
        self.total().map_or(end, |t| end.min(t))
    }

    /// The mixed (input) position shown at output position `o`.
    pub fn input_position(&self, o: u64) -> u64 {
        if self.window == 0 {
            return o;
        }
        let w = o / self.window;
        let start = w * self.window;
        let len = self
            .total()
            .map_or(self.window, |t| self.window.min(t - start));
        let units = len / self.unit;
        let within = o - start;
        let u = within / self.unit;
        if u >= units {
            return o;
        }
        let perm = Permutation::new(units, key(&[self.key, w]));
        start + perm.apply(u) * self.unit + within % self.unit
    }

    /// Source, source index and shard row of output position `o`, with `layout` giving the
    /// shard order of an epoch (callers cache it).
    pub fn row(
        &self,
        o: u64,
        layout: &mut impl FnMut(usize, u64) -> std::sync::Arc<super::source::EpochLayout>,
    ) -> StageRow {
        let (source, index) = self.mix.locate(self.input_position(o));
        let total = self.sources[source].total();
        let epoch = index / total;
        let at = SourceOrder::locate(&layout(source, epoch), epoch, index % total);
        StageRow { source, index, at }
    }

    /// Completed epochs of each source after the first `o` output rows (approximately: the
    /// shuffle window can hold a few rows of the next epoch back).
    pub fn epochs(&self, o: u64) -> Vec<u64> {
        self.mix
            .counts(o)
            .iter()
            .zip(&self.sources)
            .map(|(c, s)| c / s.total().max(1))
            .collect()
    }
}
