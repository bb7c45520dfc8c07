//! The columns the planner writes into a batch itself: synthetic columns (`@row_id`,
//! `@source`, ...) and token stages' windows, and the check at open that every window fits.

use super::Plan;
use crate::columns::Chunk;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::fields::Synthetic;
use crate::formats::{fill_window, ShardMeta, WindowColumn};
use crate::order::Slot;

/// The tokens window `window` of token shard `shard` holds (0 for a shard of records).
pub(super) fn window_tokens(
    plan: &Plan,
    shard: usize,
    window: u64,
    pieces: &mut Vec<crate::order::pack::Piece>,
) -> u64 {
    plan.inspected(shard)
        .and_then(ShardMeta::tokens)
        .map_or(0, |index| index.window_tokens(window, pieces))
}

/// Fills the token stages' window columns of batch slot `slot`, which holds window `window`
/// of shard `shard`: every element of the slot's row, since these columns are not cleared first
/// (`Chunk` of a batch, [`Planner::batch_buffer`]). Token shards are inspected at open and
/// their windows checked against the columns there ([`check_window_columns`]), so this
/// cannot fail; a shard without its plan would get padding.
pub(super) fn fill_windows(
    plan: &Plan,
    buffer: &mut Chunk,
    (slot, shard, window): (usize, usize, u64),
    pieces: &mut Vec<crate::order::pack::Piece>,
) {
    let index = plan.inspected(shard).and_then(ShardMeta::tokens);
    for &(k, kind) in &plan.window_columns {
        let column = &plan.projection.columns[k];
        let row = slot * column.width..(slot + 1) * column.width;
        // The pad was validated against the dtype when the config was checked.
        let pad = i64::from_scalar(column.pad).unwrap_or_default();
        let out = &mut buffer.columns[k];
        let filled = match index {
            Some(index) => fill_window(index, window, kind, (out, row.clone()), pad, pieces),
            None => Err(0),
        };
        if filled.is_err() {
            debug_assert!(false, "token shards are inspected and checked at open");
            out.fill_int(row, pad);
        }
    }
}

/// Refuses, before the first batch, a window column some token shard's windows would not fit:
/// an `@positions` whose dtype cannot hold a position they reach (a document of more than 2^31
/// tokens in an `i32` column), an `@segment_lengths` shorter than the most segments a window
/// holds.
pub(super) fn check_window_columns(plan: &Plan) -> Result<()> {
    for (k, column) in plan.projection.columns.iter().enumerate() {
        let kind = WindowColumn::of(&column.source);
        let positions = kind == Some(WindowColumn::Positions) && column.dtype == DType::I32;
        if !positions && kind != Some(WindowColumn::Lengths) {
            continue;
        }
        for id in 0..plan.shards.len() {
            let Some(index) = plan.inspected(id).and_then(ShardMeta::tokens) else {
                continue;
            };
            let path = plan.shard(id).path();
            if positions {
                let largest = index.largest_position();
                if largest > i32::MAX as u64 {
                    return Err(Error::config(
                        format!("fields[{k}].dtype"),
                        format!(
                            "{}: a document reaches position {largest}, which i32 cannot hold; \
                             declare '{}' as i64",
                            path, column.name
                        ),
                    ));
                }
                continue;
            }
            let most = index.most_pieces();
            if most > column.width as u64 {
                return Err(Error::config(
                    format!("fields[{k}].length"),
                    format!(
                        "{}: a window holds {most} segments, more than the {} of '{}'; declare \
                         a length of at least {most}",
                        path, column.width, column.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The row in shard `id` itself of its kept row `row` (they differ where a field's overflow
/// rule left rows out).
fn file_row(plan: &Plan, id: usize, row: u64) -> u64 {
    plan.inspected(id)
        .map_or(row, |meta| meta.dropped.file_row(row))
}

pub(super) fn fill_synthetic(plan: &Plan, buffer: &mut Chunk, slot: usize, at: &Slot) {
    for (column, buf) in plan
        .projection
        .columns
        .iter()
        .zip(buffer.columns.iter_mut())
    {
        let Some(kind) = column.synthetic else {
            continue;
        };
        let value = match kind {
            Synthetic::RowId => {
                let source = &plan.order.stages()[at.stage].sources()[at.row.source];
                let mut index = source.listed_index(at.row.at.shard, at.row.at.row);
                if !plan.dropped_before.is_empty() {
                    let id = plan.shards.id(at.stage, at.row.source, at.row.at.shard);
                    index +=
                        plan.dropped_before[id] + file_row(plan, id, at.row.at.row) - at.row.at.row;
                }
                ((at.stage as i64) << 56) | ((at.row.source as i64) << 40) | index as i64
            }
            Synthetic::Source => at.row.source as i64,
            Synthetic::Shard => at.row.at.shard as i64,
            // The row in the shard itself, also where a field's overflow rule left rows out.
            // Where no shard left a row out, a kept row is the file's: no lookup per row.
            Synthetic::Row if plan.dropped_before.is_empty() => at.row.at.row as i64,
            Synthetic::Row => {
                let id = plan.shards.id(at.stage, at.row.source, at.row.at.shard);
                file_row(plan, id, at.row.at.row) as i64
            }
            Synthetic::Epoch => at.row.at.epoch as i64,
            Synthetic::Stage => at.stage as i64,
            Synthetic::Valid => 1,
        };
        buf.set_int(slot, value);
    }
}
