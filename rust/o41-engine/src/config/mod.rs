//! The stream configuration as the engine receives it (JSON from the Python face), its
//! validation, and the resolved form that pins every shard and its row count.
//!
//! `schema` holds the config users write, `validate` the rules a config and a resolved document
//! share, `resolved` the resolved document a checkpoint stores, `fingerprint` its hash.

mod fingerprint;
mod mapping;
mod resolved;
mod schema;
mod validate;

#[cfg(test)]
mod tests;

pub use mapping::{renamed_fields, renamed_layout, MappedSource};
pub use resolved::{
    ManifestSelection, NamedFile, ResolvedConfig, ResolvedShard, ResolvedSource, ResolvedStage,
    RESOLVED_CONFIG_VERSION,
};
pub use schema::{
    is_window_source, parse_named, FieldSource, FieldSpec, Overflow, PackOverflow, PackingSpec,
    PadSide, RampSpec, ShuffleSpec, SourceSpec, Stage, StageSpec, StreamConfig, TokenLayout,
    WindowColumn, WindowsSpec, LABELS, LABELS_PREFIX, LENGTH_PREFIX, MAX_BINS, MAX_SEQ_LEN,
    PARTITION_LAYOUT, POSITIONS, SEGMENT_IDS, SEGMENT_LENGTHS,
};
pub use validate::{validate_ramp, MAX_RAMP_STEPS, VALID_COLUMN};
