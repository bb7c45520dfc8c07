//! The checks of a config and of a resolved document (they share one set of rules): every
//! error names the option at fault by its path in the document.

use super::mapping::{validate_columns, MappedSource};
use super::resolved::ResolvedConfig;
use super::schema::{
    is_window_source, FieldSource, FieldSpec, Overflow, PackingSpec, PadSide, RampSpec,
    ShuffleSpec, SourceSpec, Stage, StreamConfig, TokenLayout, WindowColumn, WindowsSpec,
    LABELS_PREFIX, MAX_BINS, MAX_SEQ_LEN, PARTITION_LAYOUT, SEGMENT_LENGTHS,
};
use crate::dtype::DType;
use crate::encoding::Encoding;
use crate::error::{Error, Result};

/// Checks a stage's token options against the fields (`option` names the stage).
pub(super) fn validate_tokens(
    option: &str,
    packing: Option<&PackingSpec>,
    windows: Option<&WindowsSpec>,
    fields: &[FieldSpec],
) -> Result<()> {
    if packing.is_some() && windows.is_some() {
        return Err(Error::config(
            format!("{option}.windows"),
            "a stage either packs documents or cuts windows, not both",
        ));
    }
    let Some(layout) = TokenLayout::of(packing, windows) else {
        if let Some((i, f)) = fields
            .iter()
            .enumerate()
            .find(|(_, f)| f.source.single().is_some_and(is_window_source))
        {
            return Err(Error::config(
                format!("fields[{i}].source"),
                format!(
                    "'{}' is filled by stages that pack or window tokens, and {option} does neither",
                    f.source
                ),
            ));
        }
        return Ok(());
    };
    let key = if packing.is_some() {
        "packing"
    } else {
        "windows"
    };
    let seq_len = match &layout {
        TokenLayout::Packed(p) => p.seq_len,
        TokenLayout::Windows(w) => w.seq_len,
    };
    if !(1..=MAX_SEQ_LEN).contains(&seq_len) {
        return Err(Error::config(
            format!("{option}.{key}.seq_len"),
            format!("must be between 1 and {MAX_SEQ_LEN}, got {seq_len}"),
        ));
    }
    if let TokenLayout::Packed(p) = &layout {
        if !(1..=MAX_BINS).contains(&p.bins) {
            return Err(Error::config(
                format!("{option}.packing.bins"),
                format!("must be between 1 and {MAX_BINS}, got {}", p.bins),
            ));
        }
    }
    if layout.field().is_empty() || layout.field().starts_with('@') {
        return Err(Error::config(
            format!("{option}.{key}.field"),
            format!("must name a record field, got '{}'", layout.field()),
        ));
    }
    let row = layout.row_tokens() as usize;
    let mut found = false;
    for (i, f) in fields.iter().enumerate() {
        let Some(source) = f.source.single() else {
            return Err(Error::config(
                format!("fields[{i}].source"),
                format!(
                    "{} stacks record fields, which {option}'s token windows cannot: a stack is \
                     for stages of records",
                    f.source
                ),
            ));
        };
        if source == SEGMENT_LENGTHS {
            // A row of the window's segment lengths: its length is the most segments a window
            // may hold (checked against each shard's windows at open).
            if !matches!(f.dtype, DType::I32 | DType::I64) || f.shape.len() != 1 || f.shape[0] == 0
            {
                return Err(Error::config(
                    format!("fields[{i}]"),
                    format!(
                        "'{SEGMENT_LENGTHS}' of {option} is a row of segment lengths: declare \
                         dtype i32 or i64 and a length of at least 1, the most segments a window \
                         may hold"
                    ),
                ));
            }
            continue;
        }
        if WindowColumn::of(source) == Some(WindowColumn::Labels) {
            validate_labels((option, i), f, row, fields, layout.field())?;
            continue;
        }
        if source.starts_with(super::schema::LENGTH_PREFIX) {
            return Err(Error::config(
                format!("fields[{i}].source"),
                format!(
                    "'{source}' measures a list of a record, and {option}'s rows are token \
                     windows: '@segment_lengths' gives their documents' lengths"
                ),
            ));
        }
        let token_column = source == layout.field() || is_window_source(source);
        if !token_column && source.starts_with('@') {
            continue; // the reserved scalars (`@row`, `@shard`, ...) describe the window
        }
        // Any other record field is aligned with the tokens (a loss mask, labels, role ids): a
        // list of the same length in each record, cut and padded where the tokens are.
        found |= source == layout.field();
        if f.overflow != Overflow::default() || f.pad_side != PadSide::default() {
            let instead = if packing.is_some() {
                ": a document longer than a window is split, left out or refused by \
                 packing.overflow ('split', 'drop', 'error')"
            } else {
                ""
            };
            return Err(Error::config(
                format!("fields[{i}]"),
                format!(
                    "'{}' is cut into {option}'s token windows, which place and pad it \
                     themselves: overflow and pad_side are for fields of records{instead}",
                    f.source
                ),
            ));
        }
        // An aligned field may be a mask of bools; the tokens are ids.
        let bool_mask = !token_column && f.dtype == DType::Bool;
        if !(matches!(f.dtype, DType::I32 | DType::I64) || bool_mask) || f.shape != [row] {
            if !token_column {
                return Err(Error::config(
                    format!("fields[{i}]"),
                    format!(
                        "'{}' is read beside the tokens of {option}, element for element (an \
                         aligned field, such as a loss mask): declare dtype i32, i64 or bool \
                         and length {row}, as the token field '{}'",
                        f.source,
                        layout.field()
                    ),
                ));
            }
            return Err(Error::config(
                format!("fields[{i}]"),
                format!(
                    "'{}' of {option} is a row of {row} tokens ({key} seq_len {seq_len}{}): declare \
                     dtype i32 or i64 and length {row}",
                    f.source,
                    if packing.is_some() { "" } else { " plus the overlapping token" }
                ),
            ));
        }
    }
    if !found {
        return Err(Error::config(
            format!("{option}.{key}.field"),
            format!("no projected field reads '{}'", layout.field()),
        ));
    }
    Ok(())
}

/// Checks field `i` of a token stage (`option`), whose source is `@labels` or
/// `@labels:<mask>`: a row of `row` integer targets whose pad, the ignore index, can be no token
/// id, and a mask that is an aligned field of the stage.
fn validate_labels(
    (option, i): (&str, usize),
    f: &FieldSpec,
    row: usize,
    fields: &[FieldSpec],
    token_field: &str,
) -> Result<()> {
    if !matches!(f.dtype, DType::I32 | DType::I64) || f.shape != [row] {
        return Err(Error::config(
            format!("fields[{i}]"),
            format!(
                "'{}' of {option} holds each token's target, element for element: declare \
                 dtype i32 or i64 and length {row}, as the token field",
                f.source
            ),
        ));
    }
    if f.pad.as_i64().is_none_or(|pad| pad >= 0) {
        return Err(Error::config(
            format!("fields[{i}].pad"),
            format!(
                "the pad of '{}' is the ignore index, which no token id may equal: declare a \
                 negative one, pad=-100 as PyTorch's cross_entropy ignores (got {})",
                f.source, f.pad
            ),
        ));
    }
    let Some(mask) = f
        .source
        .single()
        .and_then(|s| s.strip_prefix(LABELS_PREFIX))
    else {
        return Ok(());
    };
    let aligned = fields.iter().find(|m| m.name == mask).and_then(|m| {
        m.source
            .single()
            .filter(|s| !s.starts_with('@') && *s != token_field)
    });
    if aligned.is_none() {
        return Err(Error::config(
            format!("fields[{i}].source"),
            format!(
                "'{}' ignores the targets that the field '{mask}' masks, and no field of that \
                 name is read beside the tokens of {option}: name an aligned field (a loss \
                 mask) by its name",
                f.source
            ),
        ));
    }
    Ok(())
}

/// The checks a config and a resolved document share, in the order their errors are reported;
/// `source(option, source)` checks a source, whose option path is `option`.
pub(super) fn validate_document<S: MappedSource>(
    fields: &[FieldSpec],
    stages: &[Stage<S>],
    validation_pass: bool,
    (threads, rank, world_size): (usize, usize, usize),
    mut source: impl FnMut(&str, &S) -> Result<()>,
) -> Result<()> {
    validate_fields(fields)?;
    if stages.is_empty() {
        return Err(Error::config("stages", "at least one stage is required"));
    }
    for (s, stage) in stages.iter().enumerate() {
        let option = format!("stages[{s}]");
        validate_stage(&option, stage.batch_size, stage.shuffle)?;
        validate_ramp(&option, stage.batch_size, stage.ramp, world_size)?;
        validate_tokens(
            &option,
            stage.packing.as_ref(),
            stage.windows.as_ref(),
            fields,
        )?;
        if stage.sources.is_empty() {
            return Err(Error::config(
                format!("{option}.sources"),
                "at least one source is required",
            ));
        }
        let layout = stage.token_layout();
        for (j, spec) in stage.sources.iter().enumerate() {
            let at = format!("{option}.sources[{j}]");
            source(&at, spec)?;
            validate_columns(&at, spec.columns(), fields, layout.as_ref())?;
        }
    }
    if validation_pass {
        let stages = stages.iter().map(|s| (s.infinite, s.shuffle, s.ramp));
        validate_validation_pass(fields, stages)?;
    }
    validate_resources(threads, rank, world_size)
}

pub(super) fn validate_fields(fields: &[FieldSpec]) -> Result<()> {
    if fields.is_empty() {
        return Err(Error::config(
            "fields",
            "at least one projected field is required",
        ));
    }
    for (i, field) in fields.iter().enumerate() {
        let option = format!("fields[{i}]");
        if field.name.is_empty() {
            return Err(Error::config(format!("{option}.name"), "must not be empty"));
        }
        validate_source(&option, field)?;
        if field.shape.contains(&0) {
            return Err(Error::config(
                format!("{option}.shape"),
                format!("every axis must be at least 1, got {:?}", field.shape),
            ));
        }
        if field
            .row_width()
            .and_then(|w| w.checked_mul(field.dtype.byte_width()))
            .is_none()
        {
            return Err(Error::config(
                format!("{option}.shape"),
                format!(
                    "{:?} holds more bytes per row than 64 bits can count",
                    field.shape
                ),
            ));
        }
        field.pad_scalar(&format!("{option}.pad"))?;
        for (j, other) in fields[..i].iter().enumerate() {
            if other.name == field.name {
                return Err(Error::config(
                    format!("{option}.name"),
                    format!("'{}' is already the name of fields[{j}]", field.name),
                ));
            }
            if let Some(part) = field
                .source
                .parts()
                .iter()
                .find(|p| other.source.parts().contains(p))
            {
                return Err(Error::config(
                    format!("{option}.source"),
                    format!(
                        "'{part}' is already projected by fields[{j}] ('{}'); project each record field once",
                        other.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A field's source: a name, or a stack of distinct record fields' names whose count is the
/// length of the field's leading axis.
fn validate_source(option: &str, field: &FieldSpec) -> Result<()> {
    let parts = match &field.source {
        FieldSource::One(name) if name.is_empty() => {
            return Err(Error::config(
                format!("{option}.source"),
                "must not be empty",
            ))
        }
        FieldSource::One(_) => return Ok(()),
        FieldSource::Stack(parts) => parts,
    };
    if parts.is_empty() {
        return Err(Error::config(
            format!("{option}.source"),
            "a stack names at least one record field",
        ));
    }
    for (k, part) in parts.iter().enumerate() {
        if part.is_empty() || part.starts_with('@') {
            return Err(Error::config(
                format!("{option}.source[{k}]"),
                format!("a stack's entries are record fields, got '{part}'"),
            ));
        }
        if parts[..k].contains(part) {
            return Err(Error::config(
                format!("{option}.source[{k}]"),
                format!("'{part}' is already in the stack; project each record field once"),
            ));
        }
    }
    if field.shape.first() != Some(&parts.len()) {
        return Err(Error::config(
            format!("{option}.shape"),
            format!(
                "a stack of {} fields is delivered on a leading axis of {}: declare a shape \
                 starting with {}, got {:?}",
                parts.len(),
                parts.len(),
                parts.len(),
                field.shape
            ),
        ));
    }
    Ok(())
}

pub(super) fn validate_stage(
    option: &str,
    batch_size: usize,
    shuffle: Option<ShuffleSpec>,
) -> Result<()> {
    if batch_size == 0 {
        return Err(Error::config(
            format!("{option}.batch_size"),
            "must be at least 1",
        ));
    }
    if let Some(shuffle) = shuffle {
        if shuffle.buffer_rows == 0 {
            return Err(Error::config(
                format!("{option}.shuffle.buffer_rows"),
                "must be at least 1",
            ));
        }
        if shuffle.unit_rows == Some(0) {
            return Err(Error::config(
                format!("{option}.shuffle.unit_rows"),
                "must be at least 1",
            ));
        }
        if shuffle.block_rows == Some(0) {
            return Err(Error::config(
                format!("{option}.shuffle.block_rows"),
                "must be at least 1",
            ));
        }
    }
    Ok(())
}

pub use crate::limits::MAX_RAMP_STEPS;
use crate::limits::{MAX_THREADS, MAX_WORLD_SIZE};

/// Checks a ramp against its stage's batch size and the world it is split over: every ramp
/// step's global batch is shared by all ranks, so each must divide by `world_size`.
pub fn validate_ramp(
    option: &str,
    batch_size: usize,
    ramp: Option<RampSpec>,
    world_size: usize,
) -> Result<()> {
    let Some(ramp) = ramp else {
        return Ok(());
    };
    let option = format!("{option}.ramp");
    let bs = batch_size as u64;
    for (name, value) in [
        ("start", ramp.start),
        ("increment", ramp.increment),
        ("rows", ramp.rows),
    ] {
        if value == 0 {
            return Err(Error::config(
                format!("{option}.{name}"),
                "must be at least 1",
            ));
        }
    }
    if ramp.start >= bs {
        return Err(Error::config(
            format!("{option}.start"),
            format!(
                "{} rows is not below the stage's batch_size {bs}; a ramp grows the batch",
                ramp.start
            ),
        ));
    }
    if !(bs - ramp.start).is_multiple_of(ramp.increment) {
        return Err(Error::config(
            format!("{option}.increment"),
            format!(
                "{} does not reach batch_size {bs} from start {} in whole steps",
                ramp.increment, ramp.start
            ),
        ));
    }
    let steps = (bs - ramp.start) / ramp.increment;
    if steps > MAX_RAMP_STEPS {
        return Err(Error::config(
            format!("{option}.increment"),
            format!("the ramp has {steps} steps, more than the {MAX_RAMP_STEPS} allowed"),
        ));
    }
    if ramp.rows > crate::limits::MAX_POSITION {
        return Err(Error::config(
            format!("{option}.rows"),
            format!(
                "{} is beyond any position a stream reaches (2^62 rows)",
                ramp.rows
            ),
        ));
    }
    let world = world_size.max(1) as u64;
    if let Some(size) = (0..=steps)
        .map(|i| ramp.start + i * ramp.increment)
        .find(|size| !size.is_multiple_of(world))
    {
        return Err(Error::config(
            option,
            format!(
                "the ramp's global batch of {size} rows does not split evenly over \
                 world_size {world} ranks; every ramp step (start {}, increment {}, up to \
                 batch_size {bs}) must be a multiple of the world size",
                ramp.start, ramp.increment
            ),
        ));
    }
    Ok(())
}

/// The name of the mask column a validation pass adds to every batch.
pub const VALID_COLUMN: &str = "valid";

/// A validation pass reads each row once in order: its stages are finite, unshuffled and keep
/// one batch size, and no field takes the mask column's name.
pub(super) fn validate_validation_pass(
    fields: &[FieldSpec],
    stages: impl Iterator<Item = (bool, Option<ShuffleSpec>, Option<RampSpec>)>,
) -> Result<()> {
    for (s, (infinite, shuffle, ramp)) in stages.enumerate() {
        let why = if infinite {
            Some((
                "infinite",
                "must be false: a validation pass reads every row once",
            ))
        } else if shuffle.is_some() {
            Some((
                "shuffle",
                "must be None: a validation pass reads rows in order",
            ))
        } else if ramp.is_some() {
            Some((
                "ramp",
                "must be None: a validation pass scores every batch at the same size",
            ))
        } else {
            None
        };
        if let Some((name, message)) = why {
            return Err(Error::config(
                format!("stages[{s}].{name}"),
                format!("{message} (validation_pass is set)"),
            ));
        }
    }
    if let Some(i) = fields.iter().position(|f| f.name == VALID_COLUMN) {
        return Err(Error::config(
            format!("fields[{i}].name"),
            format!("'{VALID_COLUMN}' is the validation pass's mask column; rename the field"),
        ));
    }
    Ok(())
}

pub(super) fn validate_weight(option: &str, weight: f64) -> Result<()> {
    if weight.is_finite() && weight > 0.0 {
        Ok(())
    } else {
        Err(Error::config(
            format!("{option}.weight"),
            format!("must be a positive finite number, got {weight}"),
        ))
    }
}

/// Partitions deal shuffle windows to ranks, so every stage of a partitioned stream shuffles
/// and hands whole batches to ranks in turn (a ramp shares each batch among all ranks).
pub(super) fn validate_partitions(
    partitions: u64,
    validation_pass: bool,
    stages: impl Iterator<Item = (Option<ShuffleSpec>, Option<RampSpec>)>,
) -> Result<()> {
    if partitions == 0 || partitions > MAX_WORLD_SIZE {
        return Err(Error::config(
            "partitions",
            format!("must be between 1 and {MAX_WORLD_SIZE}, got {partitions}"),
        ));
    }
    if partitions == 1 {
        return Ok(());
    }
    if validation_pass {
        return Err(Error::config(
            "partitions",
            format!(
                "must be 1 in a validation pass, which reads its rows in order, got {partitions}"
            ),
        ));
    }
    for (s, (shuffle, ramp)) in stages.enumerate() {
        if shuffle.is_none() {
            return Err(Error::config(
                format!("stages[{s}].shuffle"),
                format!(
                    "partitions={partitions} deals shuffle windows to ranks; shuffle this stage \
                     or set partitions=1"
                ),
            ));
        }
        if ramp.is_some() {
            return Err(Error::config(
                format!("stages[{s}].ramp"),
                format!(
                    "a ramped stage shares every batch among all ranks, which partitions={partitions} \
                     cannot keep local; drop the ramp or set partitions=1"
                ),
            ));
        }
    }
    Ok(())
}

pub(super) fn validate_resources(threads: usize, rank: usize, world_size: usize) -> Result<()> {
    if threads == 0 || threads as u64 > MAX_THREADS {
        return Err(Error::config(
            "threads",
            format!("must be between 1 and {MAX_THREADS}, got {threads}"),
        ));
    }
    if world_size == 0 || world_size as u64 > MAX_WORLD_SIZE {
        return Err(Error::config(
            "world_size",
            format!("must be between 1 and {MAX_WORLD_SIZE}, got {world_size}"),
        ));
    }
    if rank >= world_size {
        return Err(Error::config(
            "rank",
            format!("{rank} is not below world_size {world_size}"),
        ));
    }
    Ok(())
}

impl StreamConfig {
    /// Checks everything that can be checked without touching storage.
    pub fn validate(&self) -> Result<()> {
        crate::skips::validate(&self.skip_batches)?;
        let stages = self.stages.iter().map(|s| (s.shuffle, s.ramp));
        validate_partitions(self.partitions, self.validation_pass, stages)?;
        let resources = (self.threads, self.rank, self.world_size);
        let (fields, stages) = (&self.fields, &self.stages);
        validate_document(
            fields,
            stages,
            self.validation_pass,
            resources,
            |option, source| {
                match source {
                    SourceSpec::Files {
                        files, encoding, ..
                    } => {
                        if let Some(name) = encoding {
                            Encoding::parse(name, &format!("{option}.encoding"))?;
                        }
                        if files.is_empty() {
                            return Err(Error::config(
                                format!("{option}.files"),
                                "at least one file is required",
                            ));
                        }
                    }
                    SourceSpec::Manifest {
                        manifest_uri,
                        curriculum_stages,
                        ..
                    } => {
                        if manifest_uri.is_empty() {
                            return Err(Error::config(
                                format!("{option}.manifest_uri"),
                                "must not be empty",
                            ));
                        }
                        if curriculum_stages.as_ref().is_some_and(Vec::is_empty) {
                            return Err(Error::config(
                            format!("{option}.curriculum_stages"),
                            "name at least one stage, or omit it to read the split's root order",
                        ));
                        }
                    }
                }
                validate_weight(option, source.weight())
            },
        )
    }
}

impl ResolvedConfig {
    /// Checks the rules a resolved document keeps, as [`StreamConfig::validate`] does for a
    /// config: a checkpoint's document is read from a file and trusted no further than that.
    pub fn validate(&self) -> Result<()> {
        crate::skips::validate(&self.skip_batches)?;
        let stages = self.stages.iter().map(|s| (s.shuffle, s.ramp));
        validate_partitions(self.partitions, self.validation_pass, stages)?;
        if !(1..=PARTITION_LAYOUT).contains(&self.partition_layout) {
            return Err(Error::config(
                "partition_layout",
                format!(
                    "layout {} is not one this release reads (1 to {PARTITION_LAYOUT})",
                    self.partition_layout
                ),
            ));
        }
        let resources = (self.threads, self.rank, self.world_size);
        let (fields, stages) = (&self.fields, &self.stages);
        validate_document(
            fields,
            stages,
            self.validation_pass,
            resources,
            |option, source| {
                validate_weight(option, source.weight)?;
                let rows = source
                    .shards
                    .iter()
                    .try_fold(0u64, |acc, shard| acc.checked_add(shard.rows));
                if rows.is_none_or(|rows| rows == 0) {
                    return Err(Error::config(
                        format!("{option}.shards"),
                        "the source must hold between 1 and 2^64 - 1 rows",
                    ));
                }
                Ok(())
            },
        )
    }
}
