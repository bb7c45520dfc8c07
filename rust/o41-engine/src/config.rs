//! The stream configuration as the engine receives it (JSON from the Python face), its
//! validation, and the resolved form that pins every shard and its row count.
//!
//! The resolved document is what a checkpoint will store, so it carries a version and no
//! credentials: only locations, row counts and the user's own settings.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::dtype::{DType, Scalar};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fnv::Fnv1a;
use crate::formats::{Promise, PromiseOrigin};

/// Version of the resolved-config document.
pub const RESOLVED_CONFIG_VERSION: u32 = 1;

/// One projected column: which record field it reads and the fixed shape it is delivered in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    /// Column name in delivered batches.
    pub name: String,
    /// Record field the column is read from.
    pub source: String,
    /// Element type.
    pub dtype: DType,
    /// Fixed shape of one row's value; empty for a scalar.
    #[serde(default)]
    pub shape: Vec<usize>,
    /// Value used where a record's list is shorter than the shape.
    #[serde(default = "default_pad")]
    pub pad: serde_json::Value,
}

fn default_pad() -> serde_json::Value {
    serde_json::Value::from(0)
}

impl FieldSpec {
    /// Elements per row (product of the shape; 1 for a scalar); `None` when the product does
    /// not fit a `usize`.
    pub fn row_width(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// The pad value as a scalar, validated against the dtype.
    pub fn pad_scalar(&self, option: &str) -> Result<Scalar> {
        let scalar = match &self.pad {
            serde_json::Value::Bool(b) => Scalar::Bool(*b),
            serde_json::Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Scalar::Int(i)
                } else if let Some(f) = n.as_f64() {
                    Scalar::Float(f)
                } else {
                    return Err(Error::config(option, format!("pad {n} is out of range")));
                }
            }
            other => {
                return Err(Error::config(
                    option,
                    format!("pad must be a number or a bool, got {other}"),
                ))
            }
        };
        let fits = match self.dtype {
            DType::I32 => <i32 as crate::dtype::Element>::from_scalar(scalar).is_some(),
            DType::I64 => <i64 as crate::dtype::Element>::from_scalar(scalar).is_some(),
            DType::F32 | DType::F64 => !matches!(scalar, Scalar::Bool(_)),
            DType::Bool => <u8 as crate::dtype::Element>::from_scalar(scalar).is_some(),
        };
        if fits {
            Ok(scalar)
        } else {
            Err(Error::config(
                option,
                format!(
                    "pad {} ({}) does not fit dtype {}",
                    self.pad,
                    scalar.kind(),
                    self.dtype.name()
                ),
            ))
        }
    }
}

/// A weighted source of records within a stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceSpec {
    /// A plain list of shard files of one encoding.
    Files {
        /// Shard locations, read in this order.
        files: Vec<String>,
        /// Encoding name; `None` infers it from each file's suffix.
        #[serde(default)]
        encoding: Option<String>,
        /// Relative share of the stage's rows.
        #[serde(default = "default_weight")]
        weight: f64,
    },
    /// A selection of a data manifest's split.
    Manifest {
        /// Location of the manifest.
        manifest_uri: String,
        /// Split to read.
        split: String,
        /// Curriculum selections or stages whose union is read, in this order; `None` reads the
        /// split's root order.
        #[serde(default)]
        curriculum_stages: Option<Vec<String>>,
        /// Relative share of the stage's rows.
        #[serde(default = "default_weight")]
        weight: f64,
    },
}

impl SourceSpec {
    /// The source's weight.
    pub fn weight(&self) -> f64 {
        match self {
            SourceSpec::Files { weight, .. } | SourceSpec::Manifest { weight, .. } => *weight,
        }
    }
}

fn default_weight() -> f64 {
    1.0
}

/// Row shuffling with a locality window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShuffleSpec {
    /// Window size in rows.
    pub buffer_rows: u64,
    /// Consecutive rows moved together (default `order::DEFAULT_UNIT_ROWS`); larger units read
    /// fewer, longer ranges, which keeps each rank's cost flat as the world grows.
    #[serde(default)]
    pub unit_rows: Option<u64>,
}

/// A batch ramp: the stage's global batch grows from `start` rows to its `batch_size` in steps
/// of `increment` over the stage's first `rows` rows (`docs/order.md#batch-ramps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RampSpec {
    /// Rows of the first global batch.
    pub start: u64,
    /// Rows added at each ramp step.
    pub increment: u64,
    /// Rows of the stage read before the full batch size is reached.
    pub rows: u64,
}

/// One curriculum stage: a weighted mix of sources cut into batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// Sources mixed in this stage.
    pub sources: Vec<SourceSpec>,
    /// Rows per global batch.
    pub batch_size: usize,
    /// Row shuffling; `None` keeps source order.
    #[serde(default)]
    pub shuffle: Option<ShuffleSpec>,
    /// Repeat sources endlessly (epochs) instead of reading each once.
    #[serde(default)]
    pub infinite: bool,
    /// Grow the global batch to `batch_size` over the stage's first rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp: Option<RampSpec>,
    /// Read token corpora as packed documents: a row is a window of whole documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing: Option<PackingSpec>,
    /// Read token corpora as overlapping windows of the token stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<WindowsSpec>,
}

/// Document packing of a stage's token sources (`docs/order.md`, "Token corpora").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackingSpec {
    /// The projected field's `source` that receives the tokens: a Parquet column of token
    /// lists, or any name for `.bin` shards, which are the token stream itself.
    pub field: String,
    /// Tokens per window (the token field's length).
    pub seq_len: u64,
    /// Windows open at once; more leave less padding.
    #[serde(default = "default_bins")]
    pub bins: u64,
    /// The id that ends a document. Without it a Parquet record is one document; `.bin` shards
    /// take it from their `meta.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_id: Option<u64>,
}

fn default_bins() -> u64 {
    8
}

/// Windows of `seq_len + 1` tokens starting every `seq_len` tokens of each shard's stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowsSpec {
    /// The projected field's `source` that receives the tokens (see [`PackingSpec::field`]).
    pub field: String,
    /// Tokens between window starts; a window holds `seq_len + 1`.
    pub seq_len: u64,
    /// The id that ends a document, when the windows' segments are to follow documents cut at
    /// it (open then scans each shard for it); without it a Parquet record is a document and a
    /// `.bin` window is one segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_id: Option<u64>,
}

/// Most windows a packing keeps open: first-fit looks at each of them for every document.
pub const MAX_BINS: u64 = 4096;
/// Longest window: a piece's length is stored in 32 bits.
pub const MAX_SEQ_LEN: u64 = 1 << 30;
/// The reserved sources a token stage fills besides its tokens: which document of the window
/// each token is from (1 for the first, pad for padding), and its position in that document.
pub const SEGMENT_IDS: &str = "@segment_ids";
/// See [`SEGMENT_IDS`].
pub const POSITIONS: &str = "@positions";
/// The reserved source a token stage fills with the lengths of a window's segments, in order,
/// then pad: per row rather than per token, what variable-length attention kernels take (their
/// running sums are the `cu_seqlens` that `FlashAttention`'s varlen functions take).
pub const SEGMENT_LENGTHS: &str = "@segment_lengths";

/// Whether `source` is one of the columns a token stage fills from its windows.
pub fn is_window_source(source: &str) -> bool {
    [SEGMENT_IDS, POSITIONS, SEGMENT_LENGTHS].contains(&source)
}

/// How a token stage turns shards into rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenLayout {
    /// Whole documents packed into windows.
    Packed(PackingSpec),
    /// Overlapping windows of the stream.
    Windows(WindowsSpec),
}

impl TokenLayout {
    /// The layout of a stage with these options; `None` for a stage of records.
    pub fn of(packing: Option<&PackingSpec>, windows: Option<&WindowsSpec>) -> Option<Self> {
        match (packing, windows) {
            (Some(p), _) => Some(TokenLayout::Packed(p.clone())),
            (None, Some(w)) => Some(TokenLayout::Windows(w.clone())),
            (None, None) => None,
        }
    }

    /// The record field the tokens come from.
    pub fn field(&self) -> &str {
        match self {
            TokenLayout::Packed(p) => &p.field,
            TokenLayout::Windows(w) => &w.field,
        }
    }

    /// Tokens in one row.
    pub fn row_tokens(&self) -> u64 {
        match self {
            TokenLayout::Packed(p) => p.seq_len,
            TokenLayout::Windows(w) => w.seq_len + 1,
        }
    }
}

/// Checks a stage's token options against the fields (`option` names the stage).
fn validate_tokens(
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
            .find(|(_, f)| is_window_source(&f.source))
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
        if f.source == SEGMENT_LENGTHS {
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
        let token_column = f.source == layout.field() || is_window_source(&f.source);
        if !token_column {
            if f.source.starts_with('@') {
                continue; // the reserved scalars (`@row`, `@shard`, ...) describe the window
            }
            return Err(Error::config(
                format!("fields[{i}].source"),
                format!(
                    "{option} reads its rows as token windows, which carry '{}', '{SEGMENT_IDS}', '{POSITIONS}', '{SEGMENT_LENGTHS}' and the reserved scalars, not '{}'",
                    layout.field(),
                    f.source
                ),
            ));
        }
        found |= f.source == layout.field();
        if !matches!(f.dtype, DType::I32 | DType::I64) || f.shape != [row] {
            return Err(Error::config(
                format!("fields[{i}]"),
                format!(
                    "'{}' of {option} is a row of {row} tokens ({key} seq_len {seq_len}{}): declare                      dtype i32 or i64 and length {row}",
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

/// The stream configuration users write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    /// Projected columns.
    pub fields: Vec<FieldSpec>,
    /// Ordered curriculum stages.
    pub stages: Vec<StageSpec>,
    /// Seed of every random choice.
    #[serde(default)]
    pub seed: u64,
    /// Decode threads.
    #[serde(default = "default_threads")]
    pub threads: usize,
    /// Batches assembled ahead of the consumer.
    #[serde(default = "default_prefetch")]
    pub prefetch_batches: usize,
    /// This process's rank.
    #[serde(default)]
    pub rank: usize,
    /// Number of ranks sharing the global batch sequence.
    #[serde(default = "default_world_size")]
    pub world_size: usize,
    /// Upper bound on the stream's working set; `None` means half the host's memory.
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// Read every row of the (finite, unshuffled) stages exactly once across ranks, padding the
    /// final round and marking real rows in a `valid` column instead of dropping it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub validation_pass: bool,
}

impl StageSpec {
    /// How the stage reads token corpora; `None` for a stage of records.
    pub fn token_layout(&self) -> Option<TokenLayout> {
        TokenLayout::of(self.packing.as_ref(), self.windows.as_ref())
    }
}

fn default_threads() -> usize {
    4
}
fn default_prefetch() -> usize {
    2
}
fn default_world_size() -> usize {
    1
}

/// What a config's stage and a resolved stage share, checked the same way in both.
struct StageRules<'a> {
    batch_size: usize,
    shuffle: Option<ShuffleSpec>,
    infinite: bool,
    ramp: Option<RampSpec>,
    packing: Option<&'a PackingSpec>,
    windows: Option<&'a WindowsSpec>,
    /// How many sources the stage has.
    sources: usize,
}

/// The checks a config and a resolved document share, in the order their errors are reported;
/// `source(option, s, j)` checks the `j`th source of stage `s`, whose option path is `option`.
fn validate_document(
    fields: &[FieldSpec],
    stages: &[StageRules<'_>],
    validation_pass: bool,
    (threads, rank, world_size): (usize, usize, usize),
    mut source: impl FnMut(&str, usize, usize) -> Result<()>,
) -> Result<()> {
    validate_fields(fields)?;
    if stages.is_empty() {
        return Err(Error::config("stages", "at least one stage is required"));
    }
    for (s, stage) in stages.iter().enumerate() {
        let option = format!("stages[{s}]");
        validate_stage(&option, stage.batch_size, stage.shuffle)?;
        validate_ramp(&option, stage.batch_size, stage.ramp, world_size)?;
        validate_tokens(&option, stage.packing, stage.windows, fields)?;
        if stage.sources == 0 {
            return Err(Error::config(
                format!("{option}.sources"),
                "at least one source is required",
            ));
        }
        for j in 0..stage.sources {
            source(&format!("{option}.sources[{j}]"), s, j)?;
        }
    }
    if validation_pass {
        let stages = stages.iter().map(|s| (s.infinite, s.shuffle, s.ramp));
        validate_validation_pass(fields, stages)?;
    }
    validate_resources(threads, rank, world_size)
}

/// [`validate_document`] for a config or a resolved document (they name these options alike),
/// with `$check` run on each source, bound to `$source` and named by `$option`.
macro_rules! validate_config {
    ($config:expr, |$option:ident, $source:ident| $check:expr) => {{
        let config = $config;
        let stages: Vec<StageRules<'_>> = config
            .stages
            .iter()
            .map(|stage| StageRules {
                batch_size: stage.batch_size,
                shuffle: stage.shuffle,
                infinite: stage.infinite,
                ramp: stage.ramp,
                packing: stage.packing.as_ref(),
                windows: stage.windows.as_ref(),
                sources: stage.sources.len(),
            })
            .collect();
        let resources = (config.threads, config.rank, config.world_size);
        validate_document(
            &config.fields,
            &stages,
            config.validation_pass,
            resources,
            |$option, s, j| {
                let $source = &config.stages[s].sources[j];
                $check
            },
        )
    }};
}

impl StreamConfig {
    /// Parses a config from JSON, naming the offending option on failure (its path in the
    /// document, such as `stages[0].batch_size`).
    pub fn from_json(text: &str) -> Result<Self> {
        let config: StreamConfig = parse_named(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks everything that can be checked without touching storage.
    pub fn validate(&self) -> Result<()> {
        validate_config!(self, |option, source| {
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
        })
    }
}

/// Parses `text` as a `T`, naming the path of the value at fault in a [`Error::Config`].
pub fn parse_named<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    let deserializer = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let option = if path.is_empty() || path == "." {
            "config".to_owned()
        } else {
            path
        };
        Error::config(option, e.into_inner().to_string())
    })
}

fn validate_fields(fields: &[FieldSpec]) -> Result<()> {
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
        if field.source.is_empty() {
            return Err(Error::config(
                format!("{option}.source"),
                "must not be empty",
            ));
        }
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
            if other.source == field.source {
                return Err(Error::config(
                    format!("{option}.source"),
                    format!(
                        "'{}' is already projected by fields[{j}] ('{}'); project each record field once",
                        field.source, other.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn validate_stage(option: &str, batch_size: usize, shuffle: Option<ShuffleSpec>) -> Result<()> {
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
    }
    Ok(())
}

/// Ramp steps a stage may have at most: the order tabulates one entry per step.
pub const MAX_RAMP_STEPS: u64 = 65_536;

/// Checks a ramp against its stage's batch size and the world it is split over: every ramp
/// step's global batch is shared by all ranks, so each must divide by `world_size`.
fn validate_ramp(
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
    if ramp.rows > crate::order::MAX_POSITION {
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
fn validate_validation_pass(
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

fn validate_weight(option: &str, weight: f64) -> Result<()> {
    if weight.is_finite() && weight > 0.0 {
        Ok(())
    } else {
        Err(Error::config(
            format!("{option}.weight"),
            format!("must be a positive finite number, got {weight}"),
        ))
    }
}

fn validate_resources(threads: usize, rank: usize, world_size: usize) -> Result<()> {
    if threads == 0 {
        return Err(Error::config("threads", "must be at least 1"));
    }
    if world_size == 0 {
        return Err(Error::config("world_size", "must be at least 1"));
    }
    if rank >= world_size {
        return Err(Error::config(
            "rank",
            format!("{rank} is not below world_size {world_size}"),
        ));
    }
    Ok(())
}

/// A shard pinned at resolution time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedShard {
    /// Location.
    pub path: String,
    /// Encoding.
    pub encoding: Encoding,
    /// Number of records.
    pub rows: u64,
    /// The version read at resolution: a remote object's `ETag`, a local file's modification
    /// time (`mtime:<ns>`). A resumed stream refuses a shard whose version changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Size in bytes, as the manifest listed it or as resolution saw it. A shard of another
    /// size fails closed when it is first read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Hex SHA-256 of the shard's bytes, as its manifest lists it (`sha256:` checksums only).
    /// An object stored with another checksum fails closed when it is first read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl ResolvedShard {
    /// What the document promises of the shard, as `origin` made the promise.
    pub fn promise(&self, origin: PromiseOrigin) -> Promise<'_> {
        Promise {
            origin,
            rows: self.rows,
            bytes: self.bytes,
            version: self.version.as_deref().map(Cow::Borrowed),
            sha256: self.sha256.as_deref().map(Cow::Borrowed),
        }
    }
}

/// The manifest selection a source was resolved from. Recorded so that a checkpoint can be
/// checked against a config without reading the manifest again: a manifest republished after
/// the checkpoint does not change what a resumed stream reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestSelection {
    /// Absolute location of the manifest.
    pub manifest_uri: String,
    /// Split read.
    pub split: String,
    /// Curriculum selections or stages read, in order; `None` for the split's root order.
    pub curriculum_stages: Option<Vec<String>>,
}

/// A source with its shard list pinned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedSource {
    /// Relative share of the stage's rows.
    pub weight: f64,
    /// Shards in reading order.
    pub shards: Vec<ResolvedShard>,
    /// The manifest selection the shards came from; absent for a plain file list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<ManifestSelection>,
}

impl ResolvedSource {
    /// Total records over all shards.
    pub fn rows(&self) -> u64 {
        self.shards.iter().map(|s| s.rows).sum()
    }
}

/// A stage with its sources resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedStage {
    /// Resolved sources.
    pub sources: Vec<ResolvedSource>,
    /// Rows per global batch.
    pub batch_size: usize,
    /// Row shuffling.
    pub shuffle: Option<ShuffleSpec>,
    /// Endless epochs.
    pub infinite: bool,
    /// Batch ramp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp: Option<RampSpec>,
    /// Document packing of token sources; each shard's rows are its packed windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing: Option<PackingSpec>,
    /// Overlapping token windows; each shard's rows are its windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<WindowsSpec>,
}

impl ResolvedStage {
    /// How the stage reads token corpora; `None` for a stage of records.
    pub fn token_layout(&self) -> Option<TokenLayout> {
        TokenLayout::of(self.packing.as_ref(), self.windows.as_ref())
    }
}

/// The resolved document: what a stream opens and what a checkpoint stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedConfig {
    /// Document version.
    pub version: u32,
    /// Projected columns.
    pub fields: Vec<FieldSpec>,
    /// Resolved stages.
    pub stages: Vec<ResolvedStage>,
    /// Seed.
    pub seed: u64,
    /// Decode threads.
    pub threads: usize,
    /// Prefetched batches.
    pub prefetch_batches: usize,
    /// Rank.
    pub rank: usize,
    /// World size.
    pub world_size: usize,
    /// Working-set limit in bytes.
    pub memory_limit_bytes: Option<u64>,
    /// Every row once, the final round padded and masked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub validation_pass: bool,
}

impl ResolvedConfig {
    /// Checks the rules a resolved document keeps, as [`StreamConfig::validate`] does for a
    /// config: a checkpoint's document is read from a file and trusted no further than that.
    pub fn validate(&self) -> Result<()> {
        validate_config!(self, |option, source| {
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
        })
    }

    /// Serialises the document as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a resolved config always serialises")
    }

    /// A hash of everything that decides the order: fields, stages with their resolved shards,
    /// and the seed (not rank, world size or resources). FNV-1a over canonical JSON: compact,
    /// keys sorted.
    pub fn fingerprint(&self) -> String {
        // The document without its shard lists goes through `Value` (whose maps sort keys);
        // each shard list is streamed in place of a marker, so a million-shard document is
        // hashed without building a `Value` per shard (that cost seconds per open).
        let stages: Vec<ResolvedStage> = self
            .stages
            .iter()
            .map(|stage| ResolvedStage {
                sources: stage
                    .sources
                    .iter()
                    .map(|source| ResolvedSource {
                        weight: source.weight,
                        shards: Vec::new(),
                        manifest: source.manifest.clone(),
                    })
                    .collect(),
                batch_size: stage.batch_size,
                shuffle: stage.shuffle,
                infinite: stage.infinite,
                ramp: stage.ramp,
                packing: stage.packing.clone(),
                windows: stage.windows.clone(),
            })
            .collect();
        let mut doc = serde_json::json!({
            "fields": self.fields,
            "stages": stages,
            "seed": self.seed,
        });
        // Added only when set, so streams without it keep their fingerprints.
        if self.validation_pass {
            doc["validation_pass"] = serde_json::Value::Bool(true);
        }
        for (s, stage) in doc["stages"]
            .as_array_mut()
            .expect("stages serialise as an array")
            .iter_mut()
            .enumerate()
        {
            for (j, source) in stage["sources"]
                .as_array_mut()
                .expect("sources serialise as an array")
                .iter_mut()
                .enumerate()
            {
                source["shards"] = serde_json::Value::String(shards_marker(s, j));
            }
        }
        let mut hash = Fnv1a::default();
        let mut rest = doc.to_string();
        for (s, stage) in self.stages.iter().enumerate() {
            for (j, source) in stage.sources.iter().enumerate() {
                let marker = serde_json::to_string(&shards_marker(s, j)).expect("a string");
                let at = rest.find(&marker).expect("each marker is in the document");
                hash.update(&rest.as_bytes()[..at]);
                hash.update(b"[");
                for (k, shard) in source.shards.iter().enumerate() {
                    if k > 0 {
                        hash.update(b",");
                    }
                    serde_json::to_writer(&mut hash, &CanonicalShard::of(shard))
                        .expect("writing to a hash cannot fail");
                }
                hash.update(b"]");
                rest.drain(..at + marker.len());
            }
        }
        hash.update(rest.as_bytes());
        format!("fnv1a64:{:016x}", hash.value())
    }
}

/// Stands for one source's shard list while the rest of the document is serialised; the NUL
/// (written escaped) cannot occur in a serialised option.
fn shards_marker(stage: usize, source: usize) -> String {
    format!("\0o41-shards:{stage}:{source}\0")
}

/// A shard as the canonical document writes it: `ResolvedShard`'s fields in sorted order, with
/// the same omissions.
#[derive(Serialize)]
struct CanonicalShard<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    encoding: Encoding,
    path: &'a str,
    rows: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'a str>,
}

impl<'a> CanonicalShard<'a> {
    fn of(shard: &'a ResolvedShard) -> Self {
        // Destructured so that a field added to `ResolvedShard` fails to compile here until
        // the canonical form covers it.
        let ResolvedShard {
            path,
            encoding,
            rows,
            version,
            bytes,
            sha256,
        } = shard;
        CanonicalShard {
            bytes: *bytes,
            encoding: *encoding,
            path,
            rows: *rows,
            sha256: sha256.as_deref(),
            version: version.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal(extra: &str) -> String {
        format!(
            r#"{{"fields":[{{"name":"t","source":"x","dtype":"i32","shape":[4]}}],
                "stages":[{{"sources":[{{"kind":"files","files":["a.parquet"]}}],"batch_size":2}}]{extra}}}"#
        )
    }

    /// The fingerprint as first specified: the whole document through `Value`.
    fn reference_fingerprint(config: &ResolvedConfig) -> String {
        let mut doc = serde_json::json!({
            "fields": config.fields,
            "stages": config.stages,
            "seed": config.seed,
        });
        if config.validation_pass {
            doc["validation_pass"] = serde_json::Value::Bool(true);
        }
        let mut hash = Fnv1a::default();
        hash.update(doc.to_string().as_bytes());
        format!("fnv1a64:{:016x}", hash.value())
    }

    #[test]
    fn streamed_fingerprint_equals_the_canonical_document_hash() {
        let shard = |k: usize| ResolvedShard {
            path: format!("/d/\"q\"\\é\u{1}/part-{k}.parquet"),
            encoding: if k.is_multiple_of(2) {
                Encoding::Parquet
            } else {
                Encoding::JsonlGz
            },
            rows: 1_000 + k as u64,
            version: k.is_multiple_of(3).then(|| format!("\"etag-{k}\"")),
            bytes: (k % 2 == 1).then_some(k as u64 * 7),
            sha256: (k % 4 == 1).then(|| "ab".repeat(32)),
        };
        let source = |w: f64, n: usize, manifest: bool| ResolvedSource {
            weight: w,
            shards: (0..n).map(shard).collect(),
            manifest: manifest.then(|| ManifestSelection {
                manifest_uri: "s3://b/m.json".into(),
                split: "train".into(),
                curriculum_stages: Some(vec!["a".into(), "\u{0}b".into()]),
            }),
        };
        let config = ResolvedConfig {
            version: RESOLVED_CONFIG_VERSION,
            fields: StreamConfig::from_json(&minimal("")).unwrap().fields,
            stages: vec![
                ResolvedStage {
                    sources: vec![source(0.75, 9, true), source(1.0 / 3.0, 1, false)],
                    batch_size: 8,
                    shuffle: Some(ShuffleSpec {
                        buffer_rows: 64,
                        unit_rows: Some(4),
                    }),
                    infinite: true,
                    ramp: Some(RampSpec {
                        start: 2,
                        increment: 2,
                        rows: 100,
                    }),
                    packing: None,
                    windows: None,
                },
                ResolvedStage {
                    sources: vec![source(2.0, 4, false)],
                    batch_size: 3,
                    shuffle: None,
                    infinite: false,
                    ramp: None,
                    packing: Some(PackingSpec {
                        field: "tokens".into(),
                        seq_len: 16,
                        bins: 4,
                        eos_id: Some(0),
                    }),
                    windows: None,
                },
            ],
            seed: 42,
            threads: 2,
            prefetch_batches: 1,
            rank: 0,
            world_size: 1,
            memory_limit_bytes: None,
            validation_pass: false,
        };
        assert_eq!(config.fingerprint(), reference_fingerprint(&config));
        let mut validation = config.clone();
        validation.validation_pass = true;
        assert_eq!(validation.fingerprint(), reference_fingerprint(&validation));
        assert_ne!(validation.fingerprint(), config.fingerprint());
        let mut other = config.clone();
        other.stages[0].sources[0].shards[3].rows += 1;
        assert_ne!(other.fingerprint(), config.fingerprint());
    }

    #[test]
    fn defaults_apply() {
        let config = StreamConfig::from_json(&minimal("")).unwrap();
        assert_eq!(config.threads, 4);
        assert_eq!(config.world_size, 1);
        assert_eq!(config.fields[0].pad, serde_json::Value::from(0));
    }

    #[test]
    fn errors_name_the_option() {
        let err = StreamConfig::from_json(&minimal(r#","rank":2,"world_size":2"#)).unwrap_err();
        assert!(err.to_string().starts_with("invalid rank"), "{err}");
        let err = StreamConfig::from_json(&minimal(r#","threads":0"#)).unwrap_err();
        assert!(err.to_string().contains("threads"), "{err}");
    }

    #[test]
    fn values_serde_refuses_are_named_by_their_path() {
        let err = StreamConfig::from_json(
            &minimal("").replace(r#""batch_size":2"#, r#""batch_size":-3"#),
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::Config { option, .. } if option == "stages[0].batch_size"),
            "{err}"
        );
        let err = StreamConfig::from_json(&minimal(r#","seed":18446744073709551616"#)).unwrap_err();
        assert!(
            matches!(&err, Error::Config { option, .. } if option == "seed"),
            "{err}"
        );
    }

    #[test]
    fn a_ramp_must_reach_batch_size_and_split_over_the_ranks() {
        let with = |ramp: &str, extra: &str| {
            let text = minimal(extra).replace(
                r#""batch_size":2"#,
                &format!(r#""batch_size":12,"ramp":{ramp}"#),
            );
            StreamConfig::from_json(&text)
        };
        let ok = r#"{"start":4,"increment":4,"rows":100}"#;
        assert!(with(ok, r#","world_size":2"#).is_ok());
        let option = |r: Result<StreamConfig>| match r.unwrap_err() {
            Error::Config { option, .. } => option,
            other => panic!("{other}"),
        };
        assert_eq!(option(with(ok, r#","world_size":8"#)), "stages[0].ramp");
        let cases = [
            (
                r#"{"start":0,"increment":4,"rows":100}"#,
                "stages[0].ramp.start",
            ),
            (
                r#"{"start":12,"increment":4,"rows":100}"#,
                "stages[0].ramp.start",
            ),
            (
                r#"{"start":4,"increment":5,"rows":100}"#,
                "stages[0].ramp.increment",
            ),
            (
                r#"{"start":4,"increment":4,"rows":0}"#,
                "stages[0].ramp.rows",
            ),
            (r#"{"start":4,"increment":4}"#, "stages[0].ramp"),
        ];
        for (ramp, expected) in cases {
            assert_eq!(option(with(ramp, "")), expected, "{ramp}");
        }
    }

    #[test]
    fn a_validation_pass_reads_finite_unshuffled_stages() {
        let pass = r#","validation_pass":true"#;
        assert!(StreamConfig::from_json(&minimal(pass)).is_ok());
        let infinite =
            minimal(pass).replace(r#""batch_size":2"#, r#""batch_size":2,"infinite":true"#);
        let err = StreamConfig::from_json(&infinite).unwrap_err();
        assert!(err.to_string().contains("stages[0].infinite"), "{err}");
        let named = minimal(pass).replace(r#""name":"t""#, r#""name":"valid""#);
        let err = StreamConfig::from_json(&named).unwrap_err();
        assert!(err.to_string().contains("fields[0].name"), "{err}");
    }

    #[test]
    fn pad_must_fit_the_dtype() {
        let text = minimal("").replace(r#""shape":[4]"#, r#""shape":[4],"pad":1.5"#);
        let err = StreamConfig::from_json(&text).unwrap_err();
        assert!(err.to_string().contains("fields[0].pad"), "{err}");
    }
}
