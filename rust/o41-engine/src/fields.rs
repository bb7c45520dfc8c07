//! The projected fields of a stream, validated: which record field each column reads, its dtype,
//! fixed shape and pad, and the reserved `@` sources the engine fills itself.

use crate::config::{FieldSource, FieldSpec, Overflow, PadSide, LENGTH_PREFIX};
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};

/// A value the engine supplies instead of reading it from the record, selected by a reserved
/// source name; they make exactly-once delivery auditable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synthetic {
    /// `@row_id`: `stage << 56 | source << 40 | row index within the source's listed shards`.
    RowId,
    /// `@source`: source index within its stage.
    Source,
    /// `@shard`: shard index within its source's listed shards.
    Shard,
    /// `@row`: row within the shard.
    Row,
    /// `@epoch`: the source pass the row was read in.
    Epoch,
    /// `@stage`: the stage the row belongs to (a drained row keeps its old stage).
    Stage,
    /// The `valid` mask of a validation pass: 1 for a row of data, 0 for padding. Added by the
    /// engine, never declared (it has no `@` name).
    Valid,
}

impl Synthetic {
    const ALL: [(&'static str, Synthetic); 6] = [
        ("@row_id", Synthetic::RowId),
        ("@source", Synthetic::Source),
        ("@shard", Synthetic::Shard),
        ("@row", Synthetic::Row),
        ("@epoch", Synthetic::Epoch),
        ("@stage", Synthetic::Stage),
    ];

    fn parse(source: &str, option: &str) -> Result<Option<Self>> {
        // Token stages fill these per token, as the reader of a record field would; a length is
        // read with the field it measures.
        if !source.starts_with('@')
            || crate::config::is_window_source(source)
            || source.starts_with(LENGTH_PREFIX)
        {
            return Ok(None);
        }
        Self::ALL
            .iter()
            .find(|(name, _)| *name == source)
            .map(|(_, s)| Some(*s))
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|(n, _)| *n).collect();
                Error::config(
                    format!("{option}.source"),
                    format!(
                        "'{source}' is not a reserved source; sources starting with '@' are one of \
                         {}, or {LENGTH_PREFIX}<field>",
                        names.join(", ")
                    ),
                )
            })
    }
}

/// A validated projected field.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectedColumn {
    /// Column name in batches.
    pub name: String,
    /// Record field read; for a stack, its fields in brackets (messages only: readers see the
    /// stack's parts, [`Projection::record_columns`]).
    pub source: String,
    /// A stack's record fields, in the order of the leading axis; empty for one field.
    pub parts: Vec<String>,
    /// Element type.
    pub dtype: DType,
    /// Fixed shape of one row (empty for scalars).
    pub shape: Vec<usize>,
    /// Elements per row.
    pub width: usize,
    /// Pad value.
    pub pad: Scalar,
    /// Set when the engine supplies the value (a reserved `@` source).
    pub synthetic: Option<Synthetic>,
    /// What a list longer than the first axis does.
    pub overflow: Overflow,
    /// Which end of the first axis the pad goes to.
    pub pad_side: PadSide,
    /// For `@length:<field>`: the first axis of the field measured, whose record field this
    /// column reads (`source`); its value is how many of that axis' entries hold values.
    pub measure: Option<usize>,
}

impl ProjectedColumn {
    /// Validates a field spec; `option` names it in errors.
    pub fn new(spec: &FieldSpec, option: &str) -> Result<Self> {
        let synthetic = match spec.source.single() {
            Some(source) => Synthetic::parse(source, option)?,
            None => None,
        };
        if synthetic.is_some()
            && (!spec.shape.is_empty() || !matches!(spec.dtype, DType::I32 | DType::I64))
        {
            return Err(Error::config(
                option,
                format!(
                    "'{}' is a scalar integer: declare dtype i64 (or i32) and no length or shape",
                    spec.source
                ),
            ));
        }
        let parts = match &spec.source {
            FieldSource::One(_) => Vec::new(),
            FieldSource::Stack(parts) => parts.clone(),
        };
        // A stack's overflow rule and pad side apply to each part's first axis.
        let list_axes = spec
            .shape
            .len()
            .saturating_sub(usize::from(!parts.is_empty()));
        if spec.dtype == DType::U8 && list_axes != 1 {
            return Err(Error::config(
                format!("{option}.shape"),
                format!(
                    "'{}' is u8, a row of a string's bytes: declare a length (a stack: a shape \
                     of two axes), got {:?}",
                    spec.source, spec.shape
                ),
            ));
        }
        if (spec.overflow != Overflow::default() || spec.pad_side != PadSide::default())
            && (list_axes == 0 || synthetic.is_some())
        {
            let which = if spec.overflow == Overflow::default() {
                "pad_side"
            } else {
                "overflow"
            };
            return Err(Error::config(
                format!("{option}.{which}"),
                format!(
                    "'{}' is a scalar: {which} applies to a list field (a length or shape)",
                    spec.source
                ),
            ));
        }
        Ok(ProjectedColumn {
            synthetic,
            overflow: spec.overflow,
            pad_side: spec.pad_side,
            name: spec.name.clone(),
            source: spec.source.to_string(),
            parts,
            measure: None,
            dtype: spec.dtype,
            shape: spec.shape.clone(),
            width: spec
                .row_width()
                .filter(|w| w.checked_mul(spec.dtype.byte_width()).is_some())
                .ok_or_else(|| {
                    Error::config(
                        format!("{option}.shape"),
                        format!(
                            "{:?} holds more bytes per row than 64 bits can count",
                            spec.shape
                        ),
                    )
                })?,
            pad: spec.pad_scalar(&format!("{option}.pad"))?,
        })
    }

    /// Whether the field truncates and pads on the right, as every fast path assumes (a length
    /// is not: only the general readers measure lists).
    pub fn plain(&self) -> bool {
        self.overflow == Overflow::default()
            && self.pad_side == PadSide::default()
            && self.measure.is_none()
            && self.dtype != DType::U8
    }

    /// Describes the declared shape for messages, e.g. `i32[2048]`.
    pub fn describe(&self) -> String {
        if self.shape.is_empty() {
            self.dtype.name().to_owned()
        } else {
            let dims: Vec<String> = self.shape.iter().map(ToString::to_string).collect();
            format!("{}[{}]", self.dtype.name(), dims.join(", "))
        }
    }
}

impl ProjectedColumn {
    /// The bool mask column a validation pass adds to every batch.
    pub fn valid_mask() -> Self {
        ProjectedColumn {
            name: crate::config::VALID_COLUMN.to_owned(),
            source: crate::config::VALID_COLUMN.to_owned(),
            parts: Vec::new(),
            measure: None,
            dtype: DType::Bool,
            shape: Vec::new(),
            width: 1,
            pad: Scalar::Bool(false),
            synthetic: Some(Synthetic::Valid),
            overflow: Overflow::default(),
            pad_side: PadSide::default(),
        }
    }
}

/// All projected columns of a stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Projection {
    /// Columns in config order.
    pub columns: Vec<ProjectedColumn>,
}

impl Projection {
    /// Validates the field specs.
    pub fn new(fields: &[FieldSpec]) -> Result<Self> {
        let columns = fields
            .iter()
            .enumerate()
            .map(|(i, f)| ProjectedColumn::new(f, &format!("fields[{i}]")))
            .collect::<Result<Vec<_>>>()?;
        let columns = measured(columns)?;
        let projection = Projection { columns };
        if projection.checked_row_bytes().is_none() {
            return Err(Error::config(
                "fields",
                "one row of all fields holds more bytes than 64 bits can count",
            ));
        }
        Ok(projection)
    }

    /// The columns a stream delivers, in order: the fields, then a validation pass's `valid`
    /// mask. The one rule adapters learn a stream's schema from (names, dtypes, shapes).
    pub fn delivered(fields: &[FieldSpec], validation_pass: bool) -> Result<Self> {
        let mut projection = Projection::new(fields)?;
        if validation_pass {
            projection.columns.push(ProjectedColumn::valid_mask());
        }
        Ok(projection)
    }

    fn checked_row_bytes(&self) -> Option<usize> {
        self.columns.iter().try_fold(0usize, |acc, c| {
            acc.checked_add(c.width.checked_mul(c.dtype.byte_width())?)
        })
    }

    /// Bytes of one projected row across all columns (checked to fit when the projection was
    /// built).
    pub fn row_bytes(&self) -> usize {
        self.checked_row_bytes()
            .expect("row bytes were checked at construction")
    }

    /// The columns read from records, and for each where its rows go here: not the synthetic
    /// ones, nor a token stage's window columns (`@segment_ids`, ...), which the planner fills
    /// from the windows' plan (`formats::fill_window`). A stack is read as one column per
    /// part (shaped as one entry of its leading axis), each filling its entry of the stack.
    pub fn record_columns(&self) -> (Projection, Vec<RecordSlot>) {
        let mut columns = Vec::new();
        let mut map = Vec::new();
        for (i, c) in self.columns.iter().enumerate() {
            if c.synthetic.is_some() || crate::config::WindowColumn::of(&c.source).is_some() {
                continue;
            }
            if c.parts.is_empty() {
                columns.push(c.clone());
                map.push(RecordSlot {
                    column: i,
                    offset: 0,
                });
                continue;
            }
            let width = c.width / c.parts.len();
            for (j, part) in c.parts.iter().enumerate() {
                columns.push(ProjectedColumn {
                    source: part.clone(),
                    parts: Vec::new(),
                    shape: c.shape[1..].to_vec(),
                    width,
                    ..c.clone()
                });
                map.push(RecordSlot {
                    column: i,
                    offset: j * width,
                });
            }
        }
        (Projection { columns }, map)
    }
}

/// Points each `@length:<field>` column at the record field of the field it measures.
fn measured(mut columns: Vec<ProjectedColumn>) -> Result<Vec<ProjectedColumn>> {
    for i in 0..columns.len() {
        let Some(name) = columns[i].source.strip_prefix(LENGTH_PREFIX) else {
            continue;
        };
        let option = format!("fields[{i}]");
        let column = &columns[i];
        let Some(target) = columns.iter().find(|c| c.name == name) else {
            return Err(Error::config(
                format!("{option}.source"),
                format!(
                    "'{}' measures a field named '{name}', and no field has that name",
                    column.source
                ),
            ));
        };
        // A stack's lengths are one per entry, each of the entry's first axis.
        let list_axis = usize::from(!target.parts.is_empty());
        if target.shape.len() <= list_axis
            || target.synthetic.is_some()
            || (target.parts.is_empty() && target.source.starts_with('@'))
        {
            return Err(Error::config(
                format!("{option}.source"),
                format!(
                    "'{}' measures a list read from record fields; '{name}' is not one (a \
                     scalar or a reserved source)",
                    column.source
                ),
            ));
        }
        let shape = &target.shape[..list_axis];
        if column.shape != shape || !matches!(column.dtype, DType::I32 | DType::I64) {
            let declare = match shape {
                [] => "no length or shape".to_owned(),
                [k] => format!("length {k} (one per entry of the stack)"),
                _ => unreachable!("a stack has one leading axis"),
            };
            return Err(Error::config(
                option,
                format!(
                    "'{}' is an integer per list measured: declare dtype i64 (or i32) and {declare}",
                    column.source
                ),
            ));
        }
        let (source, parts, axis) = (
            target.source.clone(),
            target.parts.clone(),
            target.shape[list_axis],
        );
        columns[i].source = source;
        columns[i].parts = parts;
        columns[i].measure = Some(axis);
    }
    Ok(columns)
}

/// Where a column read from records goes in a delivered row: the delivered column, and the
/// element its values start at within that column's row (a stack's part is one entry of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSlot {
    /// Index of the delivered column.
    pub column: usize,
    /// Elements before this part's values in each of the column's rows.
    pub offset: usize,
}
