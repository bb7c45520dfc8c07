//! Property tests of the order function over random configs. The order is a pure function of the
//! resolved config, so shards are described by their row counts alone: no I/O here.

use std::collections::HashSet;

use o41_engine::config::{
    RampSpec, ResolvedConfig, ResolvedShard, ResolvedSource, ResolvedStage, ShuffleSpec,
};
use o41_engine::encoding::Encoding;
use o41_engine::order::{LayoutCache, Order, Segment};
use proptest::prelude::*;

fn stage(
    sources: &[(Vec<u64>, f64)],
    batch_size: usize,
    shuffle: Option<(u64, u64)>,
    infinite: bool,
) -> ResolvedStage {
    ResolvedStage {
        sources: sources
            .iter()
            .enumerate()
            .map(|(j, (shards, weight))| ResolvedSource {
                weight: *weight,
                shards: shards
                    .iter()
                    .enumerate()
                    .map(|(f, rows)| ResolvedShard {
                        path: format!("s{j}-{f}.parquet"),
                        encoding: Encoding::Parquet,
                        rows: *rows,
                        version: None,
                        bytes: None,
                        sha256: None,
                    })
                    .collect(),
                manifest: None,
                named: None,
                columns: std::collections::BTreeMap::new(),
            })
            .collect(),
        batch_size,
        shuffle: shuffle.map(|(buffer_rows, unit)| ShuffleSpec {
            buffer_rows,
            unit_rows: Some(unit),
            block_rows: None,
        }),
        infinite,
        ramp: None,
        packing: None,
        windows: None,
    }
}

fn config(stages: Vec<ResolvedStage>, seed: u64) -> ResolvedConfig {
    ResolvedConfig {
        version: 1,
        fields: Vec::new(),
        stages,
        seed,
        threads: 1,
        prefetch_batches: 1,
        rank: 0,
        world_size: 1,
        memory_limit_bytes: None,
        validation_pass: false,
        partitions: 1,
        partition_layout: 1,
        skip_batches: Vec::new(),
    }
}

fn sources() -> impl Strategy<Value = Vec<(Vec<u64>, f64)>> {
    prop::collection::vec(
        (
            prop::collection::vec(0u64..40, 1..4)
                .prop_filter("a source has rows", |r| r.iter().sum::<u64>() > 0),
            prop::sample::select(vec![0.5, 1.0, 2.0, 3.0, 7.0]),
        ),
        1..5,
    )
}

fn shuffle() -> impl Strategy<Value = Option<(u64, u64)>> {
    prop::option::of((1u64..64, 1u64..9))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A finite stage shows every row of every source exactly once, in any shuffle.
    #[test]
    fn finite_stage_is_a_permutation_of_all_rows(
        sources in sources(), batch_size in 1usize..7, shuffle in shuffle(), seed in any::<u64>()
    ) {
        let order = Order::new(&config(vec![stage(&sources, batch_size, shuffle, false)], seed)).unwrap();
        let total: u64 = sources.iter().flat_map(|(s, _)| s.iter()).sum();
        let segment = Segment::first();
        let mut cache = LayoutCache::default();
        let bs = batch_size as u64;
        let mut seen = HashSet::new();
        for o in 0..total {
            let slot = order.slot(&segment, o / bs, o % bs, &mut cache);
            prop_assert_eq!(slot.row.at.epoch, 0);
            prop_assert!(slot.row.at.row < sources[slot.row.source].0[slot.row.at.shard]);
            prop_assert!(seen.insert((slot.row.source, slot.row.at.shard, slot.row.at.row)));
        }
        prop_assert_eq!(seen.len() as u64, total);
    }

    /// Every shuffle window is a permutation of the mixed rows it covers.
    #[test]
    fn windows_permute_their_own_rows(
        sources in sources(), buffer_rows in 1u64..100, unit in 1u64..9, seed in any::<u64>(), w in 0u64..50
    ) {
        let order = Order::new(&config(vec![stage(&sources, 4, Some((buffer_rows, unit)), true)], seed)).unwrap();
        let s = &order.stages()[0];
        let (start, end) = (w * s.window, (w + 1) * s.window);
        let mut inputs: Vec<u64> = (start..end).map(|o| s.input_position(o)).collect();
        inputs.sort_unstable();
        prop_assert_eq!(inputs, (start..end).collect::<Vec<_>>());
    }

    /// Unshuffled, every prefix of an infinite mix holds each share within one row, and each
    /// source's rows come in order.
    #[test]
    fn mix_prefixes_hold_shares(sources in sources(), seed in any::<u64>()) {
        let order = Order::new(&config(vec![stage(&sources, 1, None, true)], seed)).unwrap();
        let weights: Vec<f64> = sources.iter().map(|(_, w)| *w).collect();
        let sum: f64 = weights.iter().sum();
        let mut counts = vec![0u64; sources.len()];
        let mut cache = LayoutCache::default();
        for p in 0..600u64 {
            let slot = order.slot(&Segment::first(), p, 0, &mut cache);
            prop_assert_eq!(slot.row.index, counts[slot.row.source]);
            counts[slot.row.source] += 1;
            for (j, w) in weights.iter().enumerate() {
                let expected = (p + 1) as f64 * w / sum;
                prop_assert!((counts[j] as f64 - expected).abs() <= 1.0 + 1e-9);
            }
        }
    }

    /// After an advance, the old stage's rows that still come are exactly the rest of its open
    /// window, and the new stage starts from its first row.
    #[test]
    fn advance_drains_exactly_the_open_window(
        first in sources(), second in sources(), batch_size in 1usize..7,
        shuffle in shuffle(), at in 0u64..20, seed in any::<u64>()
    ) {
        let stages = vec![stage(&first, batch_size, shuffle, true), stage(&second, batch_size, None, true)];
        let order = Order::new(&config(stages, seed)).unwrap();
        let bs = batch_size as u64;
        let next = order.advance(&Segment::first(), at, 1).unwrap();
        let consumed = at * bs;
        let window_end = order.stages()[0].window_end(consumed);
        let drained = next.drain.map_or(0, |d| d.to - d.from);
        prop_assert_eq!(drained, window_end - consumed);
        let mut cache = LayoutCache::default();
        let mut delivered = HashSet::new();
        for o in 0..consumed {
            let slot = order.slot(&Segment::first(), o / bs, o % bs, &mut cache);
            delivered.insert((slot.row.source, slot.row.index));
        }
        for t in 0..drained + 3 * bs {
            let g = at + t / bs;
            let slot = order.slot(&next, g, t % bs, &mut cache);
            if t < drained {
                prop_assert_eq!(slot.stage, 0);
                prop_assert!(delivered.insert((slot.row.source, slot.row.index)), "a drained row came twice");
            } else {
                prop_assert_eq!(slot.stage, 1);
            }
        }
        prop_assert_eq!(delivered.len() as u64, window_end);
    }
}

fn ramped(
    sources: &[(Vec<u64>, f64)],
    ramp: (u64, u64, u64),
    steps: u64,
    infinite: bool,
) -> ResolvedStage {
    let (start, increment, rows) = ramp;
    let mut stage = stage(
        sources,
        (start + steps * increment) as usize,
        None,
        infinite,
    );
    stage.ramp = Some(RampSpec {
        start,
        increment,
        rows,
    });
    stage
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A ramp's global batches tile the stage's rows in order, grow by whole increments from
    /// `start` to `batch_size`, and every rank's share together is exactly the global batch.
    #[test]
    fn ramp_batches_tile_rows_and_split_over_ranks(
        sources in sources(), start in 1u64..5, increment in 1u64..5, steps in 1u64..4,
        rows in 1u64..200, world in 1u64..4, seed in any::<u64>()
    ) {
        let (start, increment) = (start * world, increment * world);
        let order = Order::new(&config(
            vec![ramped(&sources, (start, increment, rows), steps, true)], seed,
        )).unwrap();
        let segment = Segment::first();
        let bs = start + steps * increment;
        prop_assert!(order.split(&segment));
        let mut next = 0;
        let mut last = start;
        for g in 0..300 {
            let size = order.batch_rows(&segment, g);
            prop_assert!(size >= last && (size - start).is_multiple_of(increment) && size <= bs);
            prop_assert_eq!(order.first_row(&segment, g), next);
            // The ramp ends once its rows are read, not before.
            if next >= rows + steps * bs {
                prop_assert_eq!(size, bs);
            }
            let mut shares = Vec::new();
            for rank in 0..world {
                shares.extend(order.rank_rows(&segment, g, rank, world));
            }
            prop_assert_eq!(shares, (next..next + size).collect::<Vec<_>>());
            prop_assert_eq!(order.rows_received(&segment, g, 1, world) * world, size);
            next += size;
            last = size;
        }
    }

    /// A finite ramped stage ends at its last complete batch, whatever the world size.
    #[test]
    fn finite_ramp_ends_at_its_last_whole_batch(
        sources in sources(), start in 1u64..4, steps in 1u64..4, rows in 1u64..100,
        world in 1u64..4
    ) {
        let order = Order::new(&config(
            vec![ramped(&sources, (start * world, world, rows), steps, false)], 0,
        )).unwrap();
        let segment = Segment::first();
        let total = order.segment_rows(&segment).unwrap();
        let end = order.end_batch(&segment, 0, world).unwrap();
        prop_assert!(order.first_row(&segment, end) <= total);
        prop_assert!(order.first_row(&segment, end + 1) > total);
        prop_assert_eq!(
            order.dropped_rows(&segment, end),
            total - order.first_row(&segment, end)
        );
    }

    /// A validation pass gives every row to exactly one rank, pads the final round instead of
    /// dropping it, and marks exactly the rows past the end as padding.
    #[test]
    fn validation_pass_covers_every_row_once(
        sources in sources(), batch_size in 1usize..7, world in 1u64..5, seed in any::<u64>()
    ) {
        let mut resolved = config(vec![stage(&sources, batch_size, None, false)], seed);
        resolved.validation_pass = true;
        let order = Order::new(&resolved).unwrap();
        let segment = Segment::first();
        let total = order.segment_rows(&segment).unwrap();
        let end = order.end_batch(&segment, 0, world).unwrap();
        prop_assert_eq!(end % world, 0);
        prop_assert_eq!(order.dropped_rows(&segment, end), 0);
        let mut cache = LayoutCache::default();
        let mut seen = HashSet::new();
        let mut received = 0;
        for rank in 0..world {
            let batches = (end - rank).div_ceil(world);
            received += order.rows_received(&segment, rank, batches, world);
            for k in 0..batches {
                let g = rank + k * world;
                for t in order.rank_rows(&segment, g, rank, world) {
                    if order.padding(&segment, t) {
                        prop_assert!(t >= total);
                        continue;
                    }
                    prop_assert!(t < total);
                    let slot = order.slot_at(&segment, t, &mut cache);
                    prop_assert!(seen.insert((slot.row.source, slot.row.at.shard, slot.row.at.row)));
                }
            }
        }
        prop_assert_eq!(seen.len() as u64, total);
        prop_assert_eq!(received, total);
        // The last round holds the last row; one round fewer would not.
        prop_assert!(order.first_row(&segment, end - world) < total);
    }
}

/// The order of `stages` dealt to `partitions` by `layout` (1: documents written before layout
/// 2, which keep their order; 2: what new documents pin).
fn partitioned_as(
    stages: Vec<ResolvedStage>,
    seed: u64,
    partitions: u64,
    layout: u32,
) -> o41_engine::Result<Order> {
    let mut config = config(stages, seed);
    config.partitions = partitions;
    config.partition_layout = layout;
    Order::new(&config)
}

fn partitioned(stages: Vec<ResolvedStage>, seed: u64, partitions: u64) -> Order {
    partitioned_as(stages, seed, partitions, 1).unwrap()
}

/// Partition `p` whose share of an epoch of `rows` rows dealt to `partitions` holds row `r`.
fn share_of(rows: u64, r: u64, partitions: u64) -> u64 {
    (0..partitions)
        .find(|&p| r < (u128::from(rows) * u128::from(p + 1) / u128::from(partitions)) as u64)
        .expect("a row of the epoch")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// A finite partitioned stage delivers distinct rows, and what it leaves out is less than a
    /// batch per partition plus the last partial round's remainder.
    #[test]
    fn partitioned_finite_stage_delivers_each_row_once(
        sources in sources(), batch_size in 1usize..7, buffer_rows in 1u64..40, unit in 1u64..5,
        partitions in 2u64..7, world in 1u64..5, seed in any::<u64>(), layout in 1u32..3
    ) {
        let stage = stage(&sources, batch_size, Some((buffer_rows, unit)), false);
        let order = partitioned_as(vec![stage], seed, partitions, layout).unwrap();
        let total: u64 = sources.iter().flat_map(|(s, _)| s.iter()).sum();
        let segment = Segment::first();
        let bs = batch_size as u64;
        let end = order.end_batch(&segment, 0, world).unwrap();
        let dropped = order.dropped_rows(&segment, end);
        prop_assert_eq!(end * bs + dropped, total);
        // Layout 1 leaves out fewer than `partitions` rows of the last round, layout 2 fewer
        // than `partitions` of each source.
        let unheld = partitions * if layout == 1 { 1 } else { sources.len() as u64 };
        prop_assert!(dropped < bs * (partitions + world) + unheld);
        let mut cache = LayoutCache::default();
        let mut seen = HashSet::new();
        for t in 0..end * bs {
            let slot = order.slot(&segment, t / bs, t % bs, &mut cache);
            prop_assert_eq!(slot.row.at.epoch, 0);
            prop_assert!(slot.row.at.row < sources[slot.row.source].0[slot.row.at.shard]);
            prop_assert!(seen.insert((slot.row.source, slot.row.at.shard, slot.row.at.row)));
        }
    }

    /// Layout 1: on a world size dividing the partitions, each window's rows reach one rank only: along
    /// each source's rows, the receiving rank changes at most once per window.
    #[test]
    fn ranks_dividing_the_partitions_read_windows_of_their_own(
        sources in sources(), batch_size in 1usize..5, windows in 1u64..5, unit in 1u64..4,
        world in prop::sample::select(vec![1u64, 2, 4]), times in 1u64..3, rounds in 1u64..3,
        seed in any::<u64>()
    ) {
        let partitions = world * times;
        let bs = batch_size as u64;
        let stage = stage(&sources, batch_size, Some((windows * bs * unit, unit)), true);
        let order = partitioned(vec![stage], seed, partitions);
        let window = order.stages()[0].window;
        let segment = Segment::first();
        let mut cache = LayoutCache::default();
        let mut by_source: Vec<Vec<(u64, u64)>> = vec![Vec::new(); sources.len()];
        let batches = rounds * partitions * window / bs;
        for g in 0..batches {
            for i in 0..bs {
                let slot = order.slot(&segment, g, i, &mut cache);
                by_source[slot.row.source].push((slot.row.index, g % world));
            }
        }
        for rows in &mut by_source {
            rows.sort_unstable();
            let changes = rows.windows(2).filter(|w| w[0].1 != w[1].1).count() as u64;
            prop_assert!(changes < rounds * partitions, "{} rank changes over {} windows", changes, rounds * partitions);
        }
    }

    /// Layout 2: on a world size dividing the partitions, every row a rank receives lies in
    /// its own partitions' shares of its source's epoch, so no other rank reads it; with
    /// blocks, a block is shared only where a share's end cuts it.
    #[test]
    fn ranks_dividing_the_partitions_read_shares_of_their_own(
        sources in sources(), batch_size in 1usize..5, buffer_rows in 1u64..40, unit in 1u64..4,
        world in prop::sample::select(vec![1u64, 2, 4]), times in 1u64..3, batches in 1u64..80,
        block_rows in prop::option::of(1u64..9), seed in any::<u64>()
    ) {
        let partitions = world * times;
        let mut stage = stage(&sources, batch_size, Some((buffer_rows, unit)), true);
        stage.shuffle = stage.shuffle.map(|s| ShuffleSpec { block_rows, ..s });
        let order = partitioned_as(vec![stage], seed, partitions, 2);
        let rows: Vec<u64> = sources.iter().map(|(s, _)| s.iter().sum()).collect();
        if rows.iter().any(|&n| n < partitions) {
            prop_assert!(order.is_err(), "a source too small to share is refused");
            return Ok(());
        }
        let order = order.unwrap();
        let segment = Segment::first();
        let mut cache = LayoutCache::default();
        for g in 0..batches {
            for i in 0..batch_size as u64 {
                let slot = order.slot(&segment, g, i, &mut cache);
                let n = rows[slot.row.source];
                let p = share_of(n, slot.row.index % n, partitions);
                prop_assert_eq!(p % world, g % world, "row {:?} of another rank's share", slot.row);
            }
        }
    }

    /// Layout 2: each partition mixes its shares by the stage's weights, so once every
    /// partition has delivered whole windows the stream holds each source's share to within a
    /// row per partition.
    #[test]
    fn partitioned_mixes_keep_their_proportions(
        sources in sources(), batch_size in 1usize..5, buffer_rows in 1u64..40,
        partitions in 2u64..6, windows in 1u64..6, seed in any::<u64>()
    ) {
        prop_assume!(sources.iter().all(|(s, _)| s.iter().sum::<u64>() >= partitions));
        let stage = stage(&sources, batch_size, Some((buffer_rows, 1)), true);
        let order = partitioned_as(vec![stage], seed, partitions, 2).unwrap();
        let window = order.stages()[0].window;
        let bs = batch_size as u64;
        let batches = windows * window / bs * partitions;
        let mut counts = vec![0u64; sources.len()];
        let mut cache = LayoutCache::default();
        for g in 0..batches {
            for i in 0..bs {
                counts[order.slot(&Segment::first(), g, i, &mut cache).row.source] += 1;
            }
        }
        let weights: f64 = sources.iter().map(|(_, w)| w).sum();
        let total = (batches * bs) as f64;
        for (j, (_, w)) in sources.iter().enumerate() {
            let expected = total * w / weights;
            prop_assert!(
                (counts[j] as f64 - expected).abs() <= partitions as f64 + 1e-9,
                "source {} has {} rows of {}, expected {:.1}", j, counts[j], total, expected
            );
        }
    }

    /// A switch out of a partitioned stage drains, in every partition, the rest of the window
    /// it was reading; the new stage's rows follow, and no old row comes twice.
    #[test]
    fn partitioned_advance_drains_every_partitions_window(
        first in sources(), second in sources(), batch_size in 1usize..5, buffer_rows in 1u64..30,
        partitions in 2u64..5, rounds in 0u64..6, seed in any::<u64>(), layout in 1u32..3
    ) {
        let stages = vec![
            stage(&first, batch_size, Some((buffer_rows, 1)), true),
            stage(&second, batch_size, Some((buffer_rows, 1)), true),
        ];
        let Ok(order) = partitioned_as(stages, seed, partitions, layout) else {
            // Layout 2 refuses a source of fewer rows than partitions (tested above).
            prop_assert_eq!(layout, 2);
            return Ok(());
        };
        let bs = batch_size as u64;
        let at = rounds * partitions;
        prop_assert!(order.advance(&Segment::first(), at + 1, 1).is_err(), "unaligned switches are refused");
        let next = order.advance(&Segment::first(), at, 1).unwrap();
        let x = at * bs / partitions;
        let drained = next.drain.map_or(0, |d| d.to - d.from);
        prop_assert_eq!(drained, order.stages()[0].window_end(x) - x);
        let mut cache = LayoutCache::default();
        let mut delivered = HashSet::new();
        for t in 0..at * bs {
            let slot = order.slot(&Segment::first(), t / bs, t % bs, &mut cache);
            delivered.insert((slot.row.source, slot.row.index));
        }
        let old = (drained * partitions).div_ceil(bs);
        for g in at..at + old + 2 * partitions {
            for i in 0..bs {
                let slot = order.slot(&next, g, i, &mut cache);
                // Partition (g - at) mod partitions reads its drained rows first.
                let row_in_partition = (g - at) / partitions * bs + i;
                prop_assert_eq!(slot.stage, usize::from(row_in_partition >= drained));
                if slot.stage == 0 {
                    prop_assert!(delivered.insert((slot.row.source, slot.row.index)), "a drained row came twice");
                }
            }
        }
        let window = order.stages()[0].window;
        prop_assert_eq!(delivered.len() as u64, x.div_ceil(window) * window * partitions);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// With blocks, every epoch of a source still shows each row once, the whole blocks of
    /// each shard (runs from the shard's start) move together and come first, and the shards'
    /// shorter tails follow in listed order.
    #[test]
    fn blocks_permute_each_epoch_of_a_source(
        shards in prop::collection::vec(0u64..60, 1..5).prop_filter("rows", |r| r.iter().sum::<u64>() > 0),
        block_rows in 1u64..9, seed in any::<u64>(), epoch in 0u64..4
    ) {
        let mut stage = stage(&[(shards.clone(), 1.0)], 1, Some((1, 1)), true);
        stage.shuffle = stage.shuffle.map(|s| ShuffleSpec { block_rows: Some(block_rows), ..s });
        let order = Order::new(&config(vec![stage], seed)).unwrap();
        let source = &order.stages()[0].sources()[0];
        let total = source.total();
        let rows: Vec<(usize, u64)> = (0..total)
            .map(|r| {
                let at = source.block_row(epoch, r).unwrap();
                (at.shard, at.row)
            })
            .collect();
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        let expected: Vec<(usize, u64)> = shards
            .iter()
            .enumerate()
            .flat_map(|(f, &n)| (0..n).map(move |r| (f, r)))
            .collect();
        prop_assert_eq!(sorted, expected);
        let whole: u64 = shards.iter().map(|n| n / block_rows).sum::<u64>() * block_rows;
        for (r, &(shard, row)) in rows.iter().enumerate() {
            let r = r as u64;
            if r < whole {
                // Rows of a block: consecutive rows of one shard, the block starting on a
                // multiple of `block_rows` from the shard's start.
                prop_assert_eq!(row % block_rows, r % block_rows);
                prop_assert!(row < shards[shard] / block_rows * block_rows);
                if !r.is_multiple_of(block_rows) {
                    prop_assert_eq!((shard, row), (rows[r as usize - 1].0, rows[r as usize - 1].1 + 1));
                }
            } else {
                prop_assert!(row >= shards[shard] / block_rows * block_rows, "tails come last");
            }
        }
    }
}

/// Values of `packages/core/tests/test_golden_order.py`'s shards: source 0 has three shards
/// whose row `i` holds `k * 100 + i`, source 1 one whose row `i` holds `1000 + i`.
fn golden_values(order: &Order, batches: &[u64]) -> Vec<Vec<u64>> {
    let mut cache = LayoutCache::default();
    batches
        .iter()
        .map(|&g| {
            (0..6)
                .map(|i| {
                    let row = order.slot(&Segment::first(), g, i, &mut cache).row;
                    let base = if row.source == 0 {
                        row.at.shard as u64 * 100
                    } else {
                        1000
                    };
                    base + row.at.row
                })
                .collect()
        })
        .collect()
}

fn golden_stage() -> ResolvedStage {
    stage(
        &[(vec![30, 30, 30], 3.0), (vec![25], 1.0)],
        6,
        Some((20, 2)),
        true,
    )
}

/// A document written before layout 2 (partitions, no `partition_layout`) keeps the order it
/// was taken with: these batches are what the release before layout 2 streamed for the golden
/// config with `partitions=2`.
#[test]
fn layout_1_documents_keep_their_order() {
    let order = partitioned(vec![golden_stage()], 20_261_130, 2);
    assert_eq!(
        golden_values(&order, &[0, 1, 2, 3, 30]),
        vec![
            vec![12, 13, 1002, 8, 0, 1],
            vec![1008, 26, 1010, 102, 21, 22],
            vec![15, 16, 3, 4, 9, 10],
            vec![1009, 29, 100, 101, 1011, 105],
            vec![1015, 2, 1016, 5, 1014, 129],
        ]
    );
}
