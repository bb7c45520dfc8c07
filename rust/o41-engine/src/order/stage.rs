//! A stage's output order: output position `o` → input (mixed) position through the shuffle
//! window → source row through the mix → shard row through the source's epoch layout.
//!
//! The window shuffle: output positions are cut into windows of `window` rows (the configured
//! `buffer_rows` rounded up to whole units); window `w` is a permutation of the mixed rows
//! `[w * window, (w + 1) * window)`, moved in units of `unit` consecutive rows by a keyed
//! bijection. The last window of a finite stage permutes its whole units; a trailing partial
//! unit stays in place at the very end (it always falls in the rows a finite stage drops).
//!
//! Partitions, layout 2 (what new documents pin): every epoch of source `j` (its `N_j` rows in
//! the epoch's shard or block order) is cut into `C` contiguous shares, share `p` being rows
//! `[p N_j / C, (p + 1) N_j / C)`, and partition `p` is its own stage: the mix of its shares
//! (each share an endless sequence of that source's epochs, or read once in a finite stage),
//! cut into windows and permuted as above. A partition's rows are then whole blocks or shards
//! of each source but at the two ends of its share, whatever the weights, windows and epochs.
//! A finite stage mixes `N_j div C` rows of each source in every partition, so that every
//! partition holds the same rows; the `N_j mod C` rows past them go to no partition.
//!
//! Layout 1 (documents written before layout 2): every run of `C` consecutive windows of the
//! stage's one mixed sequence (a *round*) is dealt one window to each partition, and partition
//! `p` is the sequence of its windows (`p`, `C + p`, `2C + p`, ...). A finite stage's last,
//! partial round is cut into `C` equal windows (its last `rows mod C` rows go to no partition).
//!
//! With one partition both layouts are the stage's output sequence itself.

use super::keyed::{key, tag, Permutation};
use super::mix::{gcd, MixSchedule};
use super::ramp::Batching;
use super::source::{SourceOrder, SourceRow};
use crate::config::{ResolvedStage, ShuffleSpec};
use crate::error::{Error, Result};

/// Rows that stay together when the shuffle window moves rows, unless configured, in a stream
/// whose windows several ranks share.
pub const DEFAULT_UNIT_ROWS: u64 = 8;

/// The unit a stream dealt to `partitions` by `layout` moves rows in, unless configured. Units
/// let a rank that shares a window read runs of consecutive records; in partition layout 2 a
/// window belongs to one partition, whose rank reads all of it whatever the unit, so rows move
/// one by one and a batch is not a run of neighbouring records (or of one document's windows).
pub fn default_unit_rows(partitions: u64, layout: u32) -> u64 {
    if partitions > 1 && layout >= 2 {
        1
    } else {
        DEFAULT_UNIT_ROWS
    }
}

/// The shuffle window in rows (the configured `buffer_rows` rounded up to whole units) and the
/// unit (`default_unit` unless configured); `(0, 1)` when unshuffled. `s` names the stage in
/// errors.
pub fn window_rows(
    shuffle: Option<ShuffleSpec>,
    s: usize,
    default_unit: u64,
) -> Result<(u64, u64)> {
    let Some(sh) = shuffle else {
        return Ok((0, 1));
    };
    let unit = sh
        .unit_rows
        .unwrap_or(default_unit)
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

/// The shuffle window and unit of a stage of `batch_size` rows dealt to `partitions`
/// partitions by `layout`: with more than one, the window is rounded up to whole batches too,
/// so that every partition's batches stay inside its own windows.
pub fn partition_window_rows(
    shuffle: Option<ShuffleSpec>,
    s: usize,
    batch_size: u64,
    (partitions, layout): (u64, u32),
) -> Result<(u64, u64)> {
    let (window, unit) = window_rows(shuffle, s, default_unit_rows(partitions, layout))?;
    if partitions <= 1 || window == 0 {
        return Ok((window, unit));
    }
    let step = unit / gcd(unit, batch_size) * batch_size;
    let window = window
        .div_ceil(step)
        .checked_mul(step)
        .filter(|w| w.checked_mul(partitions).is_some())
        .ok_or_else(|| {
            Error::config(
                format!("stages[{s}].shuffle.buffer_rows"),
                "the window, rounded to whole batches and dealt to every partition, does not \
                 fit 64 bits",
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
    /// Partitions the rows are dealt to (1: the output sequence is one partition).
    pub partitions: u64,
    /// Layout 2: each partition mixes its own shares of the sources, and `mix` is one
    /// partition's; layout 1: `mix` is the whole stage's, its windows dealt in turn.
    shares: bool,
    mix: MixSchedule,
    sources: Vec<SourceOrder>,
    key: u64,
}

/// The first position past `x` that is a multiple of `m`, or `x` itself when it is one.
fn round_up(x: u64, m: u64) -> u64 {
    x.div_ceil(m) * m
}

impl StageOrder {
    /// The order of `stage` (index `s`) under `seed`, dealt to `partitions` partitions by
    /// `layout` (1 partition for none; more need a shuffled stage, which the config checks).
    pub fn new(
        stage: &ResolvedStage,
        s: usize,
        seed: u64,
        (partitions, layout): (u64, u32),
    ) -> Result<Self> {
        let partitions = partitions.max(1);
        let shares = partitions > 1 && layout >= 2;
        let shuffle = stage.shuffle;
        let sources: Vec<SourceOrder> = stage
            .sources
            .iter()
            .enumerate()
            .map(|(j, src)| {
                SourceOrder::new(
                    src.shards.iter().map(|f| f.rows).collect(),
                    shuffle.is_some(),
                    shuffle.and_then(|sh| sh.block_rows),
                    (seed, s, j),
                )
            })
            .collect();
        let weights: Vec<f64> = stage.sources.iter().map(|src| src.weight).collect();
        let mut rows: Vec<u64> = sources.iter().map(SourceOrder::total).collect();
        if shares {
            for (j, n) in rows.iter_mut().enumerate() {
                if stage.infinite && *n < partitions {
                    // A partition with an empty share could never draw this source's rows.
                    return Err(Error::config(
                        format!("stages[{s}].sources[{j}]"),
                        format!(
                            "{n} rows cannot be shared by partitions={partitions}: every \
                             partition of an infinite stage reads each source; lower partitions"
                        ),
                    ));
                }
                *n /= partitions;
            }
        }
        let mix = MixSchedule::new(
            &weights,
            (!stage.infinite).then_some(rows.as_slice()),
            &format!("stages[{s}].sources"),
        )?;
        let batch_size = stage.batch_size as u64;
        let (window, unit) = partition_window_rows(shuffle, s, batch_size, (partitions, layout))?;
        Ok(StageOrder {
            batch_size,
            batching: Batching::new(batch_size, stage.ramp),
            window,
            unit,
            partitions,
            shares,
            mix,
            sources,
            key: key(&[seed, tag::WINDOW, s as u64]),
        })
    }

    /// Rows of the mixed sequence `mix` describes (the stage's, or in layout 2 one
    /// partition's) when finite; `None` when infinite.
    fn total(&self) -> Option<u64> {
        self.mix.total()
    }

    /// The source orders.
    pub fn sources(&self) -> &[SourceOrder] {
        &self.sources
    }

    /// Rows of a round of windows, one window per partition.
    fn round_rows(&self) -> u64 {
        self.window * self.partitions
    }

    /// The final, partial round of a finite stage: its first output position and the rows of
    /// each of its `partitions` windows; `None` when infinite or when the rounds are all whole.
    fn last_round(&self) -> Option<(u64, u64)> {
        let total = self.total()?;
        let round = self.round_rows();
        let start = total / round * round;
        (start < total).then(|| (start, (total - start) / self.partitions))
    }

    /// Rows of each partition of a finite stage; `None` when infinite.
    pub fn partition_rows(&self) -> Option<u64> {
        let total = self.total()?;
        if self.window == 0 || self.shares {
            return Some(total);
        }
        let whole = total / self.round_rows() * self.window;
        Some(whole + self.last_round().map_or(0, |(_, len)| len))
    }

    /// Rows of a finite stage that no partition holds (the last `rows mod partitions` of a
    /// partial last round).
    pub fn unpartitioned_rows(&self) -> u64 {
        if self.shares {
            let rows: u64 = self.sources.iter().map(SourceOrder::total).sum();
            return self.total().map_or(0, |each| rows - each * self.partitions);
        }
        self.total().map_or(0, |total| {
            total - self.partition_rows().unwrap_or(total) * self.partitions
        })
    }

    /// The output position of row `x` of partition `p`.
    pub fn partition_output(&self, p: u64, x: u64) -> u64 {
        if self.window == 0 {
            return x;
        }
        if let Some((start, len)) = self.last_round() {
            // Rows of each partition before the last round: its whole windows.
            let whole = start / self.partitions;
            if x >= whole {
                return start + p * len + (x - whole);
            }
        }
        (x / self.window * self.partitions + p) * self.window + x % self.window
    }

    /// End of the window of a partition that holds its row `x` (clipped to the partition's
    /// end); `x` itself when unshuffled or at a window boundary. The same for every partition.
    pub fn window_end(&self, x: u64) -> u64 {
        if self.window == 0 || x.is_multiple_of(self.window) {
            return x;
        }
        if self.shares {
            let end = round_up(x, self.window);
            return self.total().map_or(end, |total| end.min(total).max(x));
        }
        if let Some((start, len)) = self.last_round() {
            let whole = start / self.partitions;
            if x >= whole {
                return if x == whole || len == 0 {
                    x
                } else {
                    whole + len
                };
            }
        }
        round_up(x, self.window)
    }

    /// The window holding output position `o`: its index, first position and rows.
    fn window_of(&self, o: u64) -> (u64, u64, u64) {
        if let Some((start, len)) = self.last_round() {
            if o >= start {
                let whole = start / self.window;
                let q = (o - start).checked_div(len).unwrap_or(self.partitions);
                if q >= self.partitions {
                    // The rows no partition holds stay in place.
                    return (whole + q, o, 0);
                }
                return (whole + q, start + q * len, len);
            }
        }
        let w = o / self.window;
        (w, w * self.window, self.window)
    }

    /// The mixed (input) position shown at output position `o`.
    pub fn input_position(&self, o: u64) -> u64 {
        if self.window == 0 {
            return o;
        }
        let (w, start, len) = self.window_of(o);
        self.permuted(w, start, len, o)
    }

    /// The position window `w` (its first position `start`, `len` rows) shows at `o`: its whole
    /// units permuted by the window's key, a trailing partial unit in place.
    fn permuted(&self, w: u64, start: u64, len: u64, o: u64) -> u64 {
        let units = len / self.unit;
        let within = o - start;
        let u = within / self.unit;
        if u >= units {
            return o;
        }
        let perm = Permutation::new(units, key(&[self.key, w]));
        start + perm.apply(u) * self.unit + within % self.unit
    }

    /// Source, source index and shard row of row `x` of partition `p`, with `layout` giving
    /// the shard order of an epoch (callers cache it).
    pub fn partition_row(
        &self,
        p: u64,
        x: u64,
        layout: &mut impl FnMut(usize, u64) -> std::sync::Arc<super::source::EpochLayout>,
    ) -> StageRow {
        if !self.shares {
            return self.row(self.partition_output(p, x), layout);
        }
        let (source, q) = self.mix.locate(self.shared_input(p, x));
        let rows = self.sources[source].total();
        let (first, len) = share(rows, p, self.partitions);
        let (epoch, r) = (q / len, first + q % len);
        StageRow {
            source,
            index: epoch * rows + r,
            at: self.source_row(source, epoch, r, layout),
        }
    }

    /// The mixed position of partition `p`'s own sequence shown at its row `x` (layout 2): its
    /// windows are permuted as a stage's are, each by a key of its own.
    fn shared_input(&self, p: u64, x: u64) -> u64 {
        if self.window == 0 {
            return x;
        }
        let w = x / self.window;
        let start = w * self.window;
        let len = self.total().map_or(self.window, |total| {
            self.window.min(total.saturating_sub(start))
        });
        // `w * C + p`: with one partition, the key of the unpartitioned stage's window `w`.
        self.permuted(w * self.partitions + p, start, len, x)
    }

    /// Where row `r` of `epoch` of `source` lives.
    fn source_row(
        &self,
        source: usize,
        epoch: u64,
        r: u64,
        layout: &mut impl FnMut(usize, u64) -> std::sync::Arc<super::source::EpochLayout>,
    ) -> SourceRow {
        self.sources[source]
            .block_row(epoch, r)
            .unwrap_or_else(|| SourceOrder::locate(&layout(source, epoch), epoch, r))
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
        let r = index % total;
        let at = self.source_row(source, epoch, r, layout);
        StageRow { source, index, at }
    }

    /// Completed epochs of each source once every partition has delivered `x` rows
    /// (approximately: a shuffle window can hold a few rows of the next epoch back, and in
    /// layout 2 partitions' shares differ by a row).
    pub fn epochs(&self, x: u64) -> Vec<u64> {
        let (o, parts) = if self.shares {
            (x, self.partitions)
        } else {
            (x * self.partitions, 1)
        };
        self.mix
            .counts(o)
            .iter()
            .zip(&self.sources)
            .map(|(c, s)| c / (s.total() / parts).max(1))
            .collect()
    }
}

/// Partition `p`'s share of an epoch of `rows` rows dealt to `partitions`: its first row and
/// its length, `[p rows / C, (p + 1) rows / C)`.
fn share(rows: u64, p: u64, partitions: u64) -> (u64, u64) {
    let at = |p: u64| (u128::from(rows) * u128::from(p) / u128::from(partitions)) as u64;
    let first = at(p);
    (first, at(p + 1) - first)
}
