//! `_core.trace_config` and `_core.trace_checkpoint`: provenance of global batches, from the
//! order function alone (`o41_engine::trace`).

use o41_engine::config::ResolvedConfig;
use o41_engine::order::Segment;
use o41_engine::resolve::resolve;
use o41_engine::trace::{file_rows, trace, window_documents, TraceFrom, TracedRow};
use o41_engine::StreamConfig;
use pyo3::prelude::*;

use crate::blocking::blocking;
use crate::checkpoint::Checkpoint;
use crate::storage::{engine, Storage};

/// One traced row: global batch, rank, slot, stage, source, shard index, shard path and
/// encoding, row, whether it is a validation pass's padding, whether it is a window of a
/// token stage rather than a record, and whether its batch is skipped.
type Row = (
    u64,
    u64,
    u64,
    usize,
    usize,
    usize,
    String,
    String,
    u64,
    bool,
    bool,
    bool,
);

/// One document's run in a traced window: the record it starts in (`None` in a flat token
/// stream), its tokens from that record's first (or the stream's), and its position in its
/// document.
type Piece = (Option<u64>, u64, u64, u64);

/// The traced rows, and beside each the documents it holds if it is a window.
type Traced = (Vec<Row>, Vec<Vec<Piece>>);

fn documents(pieces: Vec<Vec<o41_engine::formats::LocatedPiece>>) -> Vec<Vec<Piece>> {
    pieces
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|p| (p.record, p.start, p.end, p.position))
                .collect()
        })
        .collect()
}

fn rows(config: &ResolvedConfig, traced: Vec<TracedRow>) -> Vec<Row> {
    // Whether a stage's rows are token windows: once per stage, not per row.
    let windows: Vec<bool> = config
        .stages
        .iter()
        .map(|stage| stage.token_layout().is_some())
        .collect();
    traced
        .into_iter()
        .map(|r| {
            let (path, encoding) = if r.padding {
                (String::new(), String::new())
            } else {
                let shard = &config.stages[r.stage].sources[r.source].shards[r.shard];
                (shard.path.clone(), shard.encoding.name().to_owned())
            };
            (
                r.global_batch,
                r.rank,
                r.slot,
                r.stage,
                r.source,
                r.shard,
                path,
                encoding,
                r.row,
                r.padding,
                windows[r.stage],
                r.skipped,
            )
        })
        .collect()
}

/// The rows of global batches `start..end` of a stream over a config (JSON), resolved as open
/// resolves it, for `world_size` ranks.
#[pyfunction]
#[pyo3(signature = (config_json, start, end, world_size, storage=None))]
pub fn trace_config(
    py: Python<'_>,
    config_json: &str,
    start: u64,
    end: u64,
    world_size: u64,
    storage: Option<&Storage>,
) -> PyResult<Traced> {
    let storage = engine(storage);
    blocking(py, |cancel| {
        let config = StreamConfig::from_json(config_json)?;
        let opened = resolve(&config, &storage.with_cancel(cancel.clone()))?;
        let resolved = opened.config;
        let from = TraceFrom {
            segment: Segment::first(),
            origin: 0,
        };
        let storage = storage.with_cancel(cancel.clone());
        let mut traced = trace(&resolved, from, start..end, world_size)?;
        file_rows(&resolved, &storage, &mut traced)?;
        // Open inspected every token shard: their windows' documents are known.
        let pieces = window_documents(&resolved, &storage, &opened.inspected, &traced)?;
        Ok((rows(&resolved, traced), documents(pieces)))
    })
}

/// The rows of global batches `start..end` of the stream a checkpoint is in, from its
/// position's segment on, for `world_size` ranks. Reads nothing, unless a field's overflow rule
/// `drop` left records out (the traced shards' `drop` fields are then read).
#[pyfunction]
#[pyo3(signature = (checkpoint, start, end, world_size, storage=None))]
pub fn trace_checkpoint(
    py: Python<'_>,
    checkpoint: &Checkpoint,
    start: u64,
    end: u64,
    world_size: u64,
    storage: Option<&Storage>,
) -> PyResult<Traced> {
    let storage = engine(storage);
    let inner = &checkpoint.inner;
    let from = TraceFrom {
        segment: inner.position.cursor.segment,
        origin: inner.position.cursor.next_batch,
    };
    blocking(py, |cancel| {
        let storage = storage.with_cancel(cancel.clone());
        let mut traced = trace(&inner.resolved, from, start..end, world_size)?;
        file_rows(&inner.resolved, &storage, &mut traced)?;
        let pieces = window_documents(&inner.resolved, &storage, &[], &traced)?;
        Ok((rows(&inner.resolved, traced), documents(pieces)))
    })
}
