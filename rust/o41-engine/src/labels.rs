//! `@labels`: next-token targets for a token stage's windows, shifted by one as Megatron's
//! `GPTDataset` and pre-shifted SFT pipelines deliver them: `labels[t]` is `tokens[t + 1]` where
//! both tokens are of one document in the window, and the ignore index (the field's pad)
//! elsewhere: a document's last token, a split document's last token in a window, padding, and
//! with `@labels:<mask>` a target whose token the mask marks 0 (`mask[t + 1] == 0`: the mask
//! marks the tokens trained on, aligned with the tokens, as a chat template's generation marks
//! are).
//!
//! The planner knows the pieces, the reads bring the tokens: the planner marks each element of
//! the column 0 (a successor in its piece) or the ignore index (`WindowColumn::Labels` in
//! `formats::tokens::fill_window`), and once every row of the batch is read, [`Labels::fill`]
//! turns the marks into targets. A token id is never negative and the ignore index always is
//! (checked with the config), so a mark is never taken for a target.

use crate::columns::{Chunk, ColumnBuf};
use crate::config::{ResolvedConfig, WindowColumn, LABELS_PREFIX};
use crate::error::{Error, Result};
use crate::fields::Projection;

/// Where a stream's `@labels` column, its tokens and its mask are in a batch.
#[derive(Debug, Clone, Copy)]
pub struct Labels {
    column: usize,
    tokens: usize,
    mask: Option<usize>,
    ignore: i64,
}

impl Labels {
    /// The `@labels` column of `projection`, if it has one. Every token stage must read its
    /// tokens into one column: the targets are that column shifted.
    pub fn of(config: &ResolvedConfig, projection: &Projection) -> Result<Option<Self>> {
        let Some(column) = projection
            .columns
            .iter()
            .position(|c| WindowColumn::of(&c.source) == Some(WindowColumn::Labels))
        else {
            return Ok(None);
        };
        let spec = &projection.columns[column];
        let mut tokens: Option<usize> = None;
        for (s, stage) in config.stages.iter().enumerate() {
            let Some(layout) = stage.token_layout() else {
                continue;
            };
            let here = projection
                .columns
                .iter()
                .position(|c| c.source == layout.field());
            match (tokens, here) {
                (Some(k), Some(other)) if k != other => {
                    return Err(Error::config(
                        format!("stages[{s}]"),
                        format!(
                            "'{}' shifts one token column, and the stages read their tokens \
                             into '{}' and '{}'; read every stage's tokens into one field",
                            spec.source, projection.columns[k].name, projection.columns[other].name
                        ),
                    ));
                }
                (None, Some(k)) => tokens = Some(k),
                _ => {}
            }
        }
        let tokens = tokens.ok_or_else(|| {
            Error::config(
                "fields",
                format!(
                    "'{}' needs a stage that packs or windows tokens",
                    spec.source
                ),
            )
        })?;
        let mask = spec
            .source
            .strip_prefix(LABELS_PREFIX)
            .and_then(|name| projection.columns.iter().position(|c| c.name == name));
        Ok(Some(Labels {
            column,
            tokens,
            mask,
            // The pad was validated as a negative integer with the config.
            ignore: match spec.pad {
                crate::dtype::Scalar::Int(pad) => pad,
                _ => -100,
            },
        }))
    }

    /// The batch column the targets go to.
    pub fn column(&self) -> usize {
        self.column
    }

    /// Turns the planner's marks in the first `rows` rows of `batch` into targets.
    pub fn fill(&self, batch: &mut Chunk, rows: usize, width: usize) {
        // The labels column apart from the others, which it is read beside.
        let (before, rest) = batch.columns.split_at_mut(self.column);
        let (labels, after) = rest.split_first_mut().expect("the labels column exists");
        let other = |k: usize| -> &ColumnBuf {
            if k < self.column {
                &before[k]
            } else {
                &after[k - self.column - 1]
            }
        };
        let tokens = other(self.tokens);
        let mask = self.mask.map(other);
        for row in 0..rows {
            let base = row * width;
            for t in base..base + width.saturating_sub(1) {
                if labels.int_at(t) == self.ignore {
                    continue;
                }
                let target = if mask.is_none_or(|m| m.int_at(t + 1) != 0) {
                    tokens.int_at(t + 1)
                } else {
                    self.ignore
                };
                labels.set_int(t, target);
            }
        }
    }
}
