//! The stream configuration as the engine receives it (JSON from the Python face): fields,
//! sources, stages and their token layouts, the reserved sources and their limits.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};

/// One projected column: which record field it reads and the fixed shape it is delivered in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    /// Column name in delivered batches.
    pub name: String,
    /// Record field the column is read from, or several stacked on a new leading axis.
    pub source: FieldSource,
    /// Element type.
    pub dtype: DType,
    /// Fixed shape of one row's value; empty for a scalar.
    #[serde(default)]
    pub shape: Vec<usize>,
    /// Value used where a record's list is shorter than the shape.
    #[serde(default = "default_pad")]
    pub pad: serde_json::Value,
    /// What a list longer than the first axis does: truncated, or an error naming the row.
    #[serde(default, skip_serializing_if = "Overflow::is_default")]
    pub overflow: Overflow,
    /// Which end of the first axis the pad goes to: after the values, or before them.
    #[serde(default, skip_serializing_if = "PadSide::is_default")]
    pub pad_side: PadSide,
}

/// The record field(s) a projected field reads: one, or several of the same shape stacked on a
/// new leading axis (a preference pair's chosen and rejected completions, `[2, S]`). Written as
/// a name or a list of names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldSource {
    /// One record field.
    One(String),
    /// Record fields, in the order of the leading axis.
    Stack(Vec<String>),
}

impl FieldSource {
    /// The record fields read: one, or the stack's in order.
    pub fn parts(&self) -> &[String] {
        match self {
            FieldSource::One(name) => std::slice::from_ref(name),
            FieldSource::Stack(names) => names,
        }
    }

    /// The one record field read; `None` for a stack.
    pub fn single(&self) -> Option<&str> {
        match self {
            FieldSource::One(name) => Some(name),
            FieldSource::Stack(_) => None,
        }
    }
}

impl std::fmt::Display for FieldSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FieldSource::One(name) => f.write_str(name),
            FieldSource::Stack(names) => write!(f, "[{}]", names.join(", ")),
        }
    }
}

impl From<&str> for FieldSource {
    fn from(name: &str) -> Self {
        FieldSource::One(name.to_owned())
    }
}

impl From<String> for FieldSource {
    fn from(name: String) -> Self {
        FieldSource::One(name)
    }
}

impl Serialize for FieldSource {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        match self {
            FieldSource::One(name) => serializer.serialize_str(name),
            FieldSource::Stack(names) => names.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for FieldSource {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        struct Names;
        impl<'de> serde::de::Visitor<'de> for Names {
            type Value = FieldSource;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a record field's name, or a list of names to stack")
            }
            fn visit_str<E: serde::de::Error>(
                self,
                v: &str,
            ) -> std::result::Result<FieldSource, E> {
                Ok(FieldSource::One(v.to_owned()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<FieldSource, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    names.push(name);
                }
                Ok(FieldSource::Stack(names))
            }
        }
        deserializer.deserialize_any(Names)
    }
}

/// What projecting a list longer than its field's first axis does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    /// The values past the axis are dropped (the default).
    #[default]
    Truncate,
    /// The row fails with a projection error naming the shard, row and field.
    Error,
    /// The row is left out of the stream: open finds every such row, so that the order is
    /// planned without them, the same on every rank and after every resume.
    Drop,
}

impl Overflow {
    // A reference: serde's `skip_serializing_if` passes one.
    #[allow(clippy::trivially_copy_pass_by_ref)]
    fn is_default(&self) -> bool {
        *self == Overflow::default()
    }
}

/// Where the pad of a list shorter than its field's first axis goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PadSide {
    /// Values first, then the pad (the default).
    #[default]
    Right,
    /// The pad first, then the values: the last value ends the row (prompts for generation).
    Left,
}

impl PadSide {
    // A reference: serde's `skip_serializing_if` passes one.
    #[allow(clippy::trivially_copy_pass_by_ref)]
    fn is_default(&self) -> bool {
        *self == PadSide::default()
    }
}

pub(super) fn default_pad() -> serde_json::Value {
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
            // A float beyond f32's range would be stored as infinity: refused, not padded with it.
            DType::F32 => match scalar {
                Scalar::Bool(_) | Scalar::Byte(_) => false,
                Scalar::Int(_) => true,
                Scalar::Float(f) => (f as f32).is_finite(),
            },
            DType::F64 => !matches!(scalar, Scalar::Bool(_)),
            DType::Bool => <u8 as crate::dtype::Element>::from_scalar(scalar).is_some(),
            DType::U8 => match scalar {
                Scalar::Int(i) => match u8::try_from(i) {
                    Ok(byte) => return Ok(Scalar::Byte(byte)),
                    Err(_) => false,
                },
                _ => false,
            },
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
        /// The names the fields read, mapped to the columns this source's shards hold them
        /// under (`{"input_ids": "tokens"}`); a name not mapped is read as it is.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        columns: BTreeMap<String, String>,
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
        /// See `Files::columns`.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        columns: BTreeMap<String, String>,
    },
}

impl SourceSpec {
    /// The source's weight.
    pub fn weight(&self) -> f64 {
        match self {
            SourceSpec::Files { weight, .. } | SourceSpec::Manifest { weight, .. } => *weight,
        }
    }

    /// The source's column mapping (empty: every name is read as it is).
    pub fn columns(&self) -> &BTreeMap<String, String> {
        match self {
            SourceSpec::Files { columns, .. } | SourceSpec::Manifest { columns, .. } => columns,
        }
    }
}

pub(super) fn default_weight() -> f64 {
    1.0
}

/// Row shuffling with a locality window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShuffleSpec {
    /// Window size in rows.
    pub buffer_rows: u64,
    /// Consecutive rows moved together (default `order::default_unit_rows`: 8, or 1 when
    /// partitioned); larger units read fewer, longer ranges, which keeps each rank's cost flat
    /// as the world grows.
    #[serde(default)]
    pub unit_rows: Option<u64>,
    /// Rows each source is cut into for its per-epoch order: with it, every epoch of a source
    /// permutes runs of `block_rows` rows across the whole source (instead of its shards), so
    /// that a shuffle window gathers rows from all over the corpus while each run is still read
    /// in one piece; absent, shards are permuted and read through (`docs/order.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_rows: Option<u64>,
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

/// One curriculum stage: a weighted mix of sources cut into batches. One struct serves the
/// config users write ([`StageSpec`], its sources as written) and the resolved document
/// (`ResolvedStage`, each source's shard list pinned): only the sources differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage<S> {
    /// Sources mixed in this stage.
    pub sources: Vec<S>,
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
    /// What a document longer than a window does.
    #[serde(default, skip_serializing_if = "PackOverflow::is_default")]
    pub overflow: PackOverflow,
}

/// What packing does with a document longer than a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PackOverflow {
    /// Cut into full windows and a tail, the tail placed as any document (the default).
    #[default]
    Split,
    /// Left out of the stream: found when the shard's windows are planned, so every rank and
    /// every resume plans the same windows; counted in the source's `dropped_rows`. A
    /// conversation is never trained on from its middle.
    Drop,
    /// The shard fails with a projection error naming it, the document and its length.
    Error,
}

impl PackOverflow {
    // A reference: serde's `skip_serializing_if` passes one.
    #[allow(clippy::trivially_copy_pass_by_ref)]
    fn is_default(&self) -> bool {
        *self == PackOverflow::default()
    }
}

pub(super) fn default_bins() -> u64 {
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

pub use crate::limits::{MAX_BINS, MAX_SEQ_LEN};
/// The reserved sources a token stage fills besides its tokens: which document of the window
/// each token is from (1 for the first, pad for padding), and its position in that document.
pub const SEGMENT_IDS: &str = "@segment_ids";
/// See [`SEGMENT_IDS`].
pub const POSITIONS: &str = "@positions";
/// The reserved source a token stage fills with the lengths of a window's segments, in order,
/// then pad: per row rather than per token, what variable-length attention kernels take (their
/// running sums are the `cu_seqlens` that `FlashAttention`'s varlen functions take).
pub const SEGMENT_LENGTHS: &str = "@segment_lengths";

/// The reserved source a token stage fills with next-token targets: each token's successor in
/// its document, or the ignore index (the field's pad) where it has none in the window (a
/// document's last token, padding). `@labels:<field>` also ignores a target whose token the
/// aligned mask `<field>` (a projected field's name) marks 0.
pub const LABELS: &str = "@labels";
/// See [`LABELS`].
pub const LABELS_PREFIX: &str = "@labels:";

/// The source prefix of a field's length: `@length:<name of another projected field>`.
pub const LENGTH_PREFIX: &str = "@length:";

/// Whether `source` is one of the columns a token stage fills from its windows.
pub fn is_window_source(source: &str) -> bool {
    WindowColumn::of(source).is_some()
}

/// A per-token column that a token stage derives from its windows' pieces rather than reads:
/// the planner fills it straight into the batch (`plan::Planner`), readers never see it. The
/// one rule naming them, below everything that reads or plans windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowColumn {
    /// `@segment_ids`: which piece of the window a token is from (from 1), 0 for padding.
    Segments,
    /// `@positions`: a token's position within its document, 0 for padding.
    Positions,
    /// `@segment_lengths`: the tokens of each piece of the window, in order, then pad; one
    /// element per piece rather than per token.
    Lengths,
    /// `@labels`: the planner marks which tokens have a successor in their piece (0) and
    /// which do not (pad); the batch's tokens fill the marks once read (`crate::labels`).
    Labels,
}

impl WindowColumn {
    /// The window column a field's source names, if any.
    pub fn of(source: &str) -> Option<Self> {
        match source {
            SEGMENT_IDS => Some(WindowColumn::Segments),
            POSITIONS => Some(WindowColumn::Positions),
            SEGMENT_LENGTHS => Some(WindowColumn::Lengths),
            LABELS => Some(WindowColumn::Labels),
            _ if source.starts_with(LABELS_PREFIX) => Some(WindowColumn::Labels),
            _ => None,
        }
    }
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
    /// Ranges `[start, end)` of global batches no rank receives (`crate::skips`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip_batches: Vec<crate::skips::SkipRange>,
    /// Partitions each stage's shuffle windows are dealt to: global batch `g` of a segment is
    /// cut from partition `(g - start) mod partitions`, so a rank of a world that divides it
    /// reads windows no other rank reads (`docs/order.md`, partitions).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub partitions: u64,
}

/// One: the partition count and the partition layout documents read when they leave them out
/// (every document written before each existed).
pub(crate) fn one<T: From<u8>>() -> T {
    T::from(1)
}

/// Whether `n` is one, which documents leave out.
pub(crate) fn is_one<T: From<u8> + PartialEq>(n: &T) -> bool {
    *n == T::from(1)
}

/// The partition layout new partitioned documents pin: each source's rows of every epoch cut
/// into one contiguous share per partition, each partition mixing and shuffling its own shares
/// (`docs/order.md`, "Partitions"). Layout 1 dealt windows of the stage's one mixed sequence.
pub const PARTITION_LAYOUT: u32 = 2;

/// A stage of the config users write.
pub type StageSpec = Stage<SourceSpec>;

impl<S> Stage<S> {
    /// How the stage reads token corpora; `None` for a stage of records.
    pub fn token_layout(&self) -> Option<TokenLayout> {
        TokenLayout::of(self.packing.as_ref(), self.windows.as_ref())
    }

    /// This stage with `sources` in place of its own (a resolved stage from a config's).
    pub fn with_sources<T>(&self, sources: Vec<T>) -> Stage<T> {
        Stage {
            sources,
            batch_size: self.batch_size,
            shuffle: self.shuffle,
            infinite: self.infinite,
            ramp: self.ramp,
            packing: self.packing.clone(),
            windows: self.windows.clone(),
        }
    }
}

pub(super) fn default_threads() -> usize {
    4
}
pub(super) fn default_prefetch() -> usize {
    2
}
pub(super) fn default_world_size() -> usize {
    1
}

impl StreamConfig {
    /// Parses a config from JSON, naming the offending option on failure (its path in the
    /// document, such as `stages[0].batch_size`).
    pub fn from_json(text: &str) -> Result<Self> {
        let config: StreamConfig = parse_named(text)?;
        config.validate()?;
        Ok(config)
    }

    /// The partition layout the config resolves to: the current one when partitioned (1, which
    /// one partition reads the same as any, otherwise).
    pub fn partition_layout(&self) -> u32 {
        if self.partitions > 1 {
            PARTITION_LAYOUT
        } else {
            1
        }
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
