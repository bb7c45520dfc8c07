//! Projection of self-describing records (JSON Lines, `MessagePack`) straight into column buffers.
//!
//! A record is deserialised with a seed that writes each projected value into its row slot as it
//! is parsed; fields that are not projected are skipped with `IgnoredAny`, so no values are built
//! for them. The same seed serves every serde format.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::columns::ColumnBuf;
use crate::dtype::{DType, Element};
use crate::error::Error;
use crate::fields::{ProjectedColumn, Projection};

/// Where a record's projection failed.
#[derive(Debug)]
pub enum RecordError {
    /// A projected value did not fit its column (column index, message).
    Field(usize, String),
    /// A projected field is absent from the record (column index).
    Missing(usize),
    /// The record could not be decoded at all.
    Malformed(String),
}

/// Where the fields of a record that lacks a projected one can be listed from, for its error:
/// read again only then, so reading records costs nothing for it.
#[derive(Clone, Copy)]
pub enum RecordFields<'a> {
    /// A JSON object's bytes.
    Json(&'a [u8]),
    /// A `MessagePack` map's bytes.
    Msgpack(&'a [u8]),
    /// Fields every record of the format has.
    Known(&'a [&'a str]),
}

/// Fields listed in an error at most; a record may have thousands.
const LISTED_FIELDS: usize = 32;

impl RecordFields<'_> {
    /// The record's field names, in order (at most [`LISTED_FIELDS`]); `None` when the bytes
    /// are no map.
    fn names(self) -> Option<Vec<String>> {
        match self {
            RecordFields::Json(bytes) => Keys
                .deserialize(&mut serde_json::Deserializer::from_slice(bytes))
                .ok(),
            RecordFields::Msgpack(bytes) => Keys
                .deserialize(&mut rmp_serde::Deserializer::from_read_ref(bytes))
                .ok(),
            RecordFields::Known(names) => Some(names.iter().map(|&n| n.to_owned()).collect()),
        }
    }
}

/// Reads a map's keys, skipping its values.
struct Keys;

impl<'de> DeserializeSeed<'de> for Keys {
    type Value = Vec<String>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<String>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Keys {
    type Value = Vec<String>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a record")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<String>, A::Error> {
        let mut names = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            map.next_value::<IgnoredAny>()?;
            if names.len() < LISTED_FIELDS {
                names.push(name);
            }
        }
        Ok(names)
    }
}

impl RecordError {
    /// Attaches shard and row to make an engine error; a missing field's names the record's
    /// fields, read from `fields`.
    pub fn into_error(
        self,
        projection: &Projection,
        path: &str,
        (encoding, fields): (&'static str, Option<RecordFields<'_>>),
        row: u64,
    ) -> Error {
        let projection_error = |k: usize, message: String| Error::Projection {
            path: path.to_owned(),
            row,
            field: projection.columns[k].name.clone(),
            source_field: projection.columns[k].source.clone(),
            message,
        };
        match self {
            RecordError::Field(k, message) => projection_error(k, message),
            RecordError::Missing(k) => {
                let names = fields.and_then(RecordFields::names);
                let listed = names.map_or(String::new(), |names| {
                    format!(" (its fields: {})", names.join(", "))
                });
                projection_error(k, format!("the record has no such field{listed}"))
            }
            RecordError::Malformed(message) => Error::Format {
                path: path.to_owned(),
                encoding,
                row: Some(row),
                message,
            },
        }
    }
}

/// Projects one record from `deserializer` into row `row` of `columns`.
pub fn project_record<'de, D: Deserializer<'de>>(
    deserializer: D,
    projection: &Projection,
    columns: &mut [ColumnBuf],
    row: usize,
) -> Result<(), RecordError> {
    let field_error: Cell<Option<String>> = Cell::new(None);
    let current = Cell::new(usize::MAX);
    let mut seen = vec![false; projection.columns.len()];
    let seed = RecordSeed {
        projection,
        columns,
        row,
        seen: &mut seen,
        current: &current,
        field_error: &field_error,
    };
    match seed.deserialize(deserializer) {
        Ok(()) => {}
        Err(e) => {
            // A message set by our own visitor is a type/shape problem of one field; anything
            // else the format's decoder raised is a malformed record.
            return Err(match field_error.take() {
                Some(message) => RecordError::Field(current.get(), message),
                None => RecordError::Malformed(e.to_string()),
            });
        }
    }
    match seen.iter().position(|s| !s) {
        Some(k) => Err(RecordError::Missing(k)),
        None => Ok(()),
    }
}

struct RecordSeed<'a> {
    projection: &'a Projection,
    columns: &'a mut [ColumnBuf],
    row: usize,
    seen: &'a mut [bool],
    current: &'a Cell<usize>,
    field_error: &'a Cell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for RecordSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RecordSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a record (an object/map of fields)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(KeySeed(self.projection))? {
            let Some(k) = key else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let column = &self.projection.columns[k];
            let w = column.width;
            self.current.set(k);
            self.seen[k] = true;
            let ctx = SlotCtx {
                dtype: column.dtype,
                error: self.field_error,
            };
            let length = Cell::new(0);
            crate::with_column!(&mut self.columns[k], buf => {
                map.next_value_seed(Slot {
                    out: &mut buf[self.row * w..(self.row + 1) * w],
                    shape: &column.shape,
                    pad: column.pad.element(),
                    ctx,
                    fit: (!column.plain()).then_some(column),
                    length: Some(&length),
                })?;
            });
            // The lengths measuring this list (`@length:<field>`) read it as it went by.
            for (m, measure) in self.projection.columns.iter().enumerate() {
                if let Some(axis) = measure.measure.filter(|_| measure.source == column.source) {
                    self.seen[m] = true;
                    self.columns[m].set_int(self.row, length.get().min(axis) as i64);
                }
            }
        }
        Ok(())
    }
}

/// Matches a record key against the projected sources without allocating.
struct KeySeed<'a>(&'a Projection);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<usize>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Option<usize>, E> {
        Ok(self
            .0
            .columns
            .iter()
            .position(|c| c.source == v && c.measure.is_none()))
    }
    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Option<usize>, E> {
        Ok(self
            .0
            .columns
            .iter()
            .position(|c| c.source.as_bytes() == v && c.measure.is_none()))
    }
}

/// What a record holding a `MessagePack` extension value is refused with.
pub const EXT_REFUSED: &str =
    "a MessagePack extension value (ext type), whose bytes only the application that wrote them \
     can interpret; store the value as binary, a string or a number";

#[derive(Clone, Copy)]
struct SlotCtx<'a> {
    dtype: DType,
    error: &'a Cell<Option<String>>,
}

impl SlotCtx<'_> {
    fn fail<E: serde::de::Error>(self, message: String) -> E {
        let err = E::custom(&message);
        self.error.set(Some(message));
        err
    }
}

/// Writes one value (scalar or nested list) into its slot, every element of it: where a list
/// is shorter than its axis, the rest is `pad`.
struct Slot<'a, 'c, T> {
    out: &'a mut [T],
    shape: &'a [usize],
    pad: T,
    ctx: SlotCtx<'c>,
    /// The field of a row's slot, whose first axis follows its overflow rule and pad side;
    /// `None` for the inner axes and for plain fields.
    fit: Option<&'a ProjectedColumn>,
    /// Where a row's slot tells the length of its list (its first axis); `None` for inner axes.
    length: Option<&'a Cell<usize>>,
}

impl<'de, T: Element> DeserializeSeed<'de> for Slot<'_, '_, T> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<T: Element> Slot<'_, '_, T> {
    /// Writes a converted scalar; `refused` says why when the conversion returned `None`.
    fn scalar<E: serde::de::Error>(
        self,
        value: Option<T>,
        found: fmt::Arguments,
        refused: &str,
    ) -> Result<(), E> {
        if self.ctx.dtype == DType::U8 {
            return Err(self.ctx.fail(format!(
                "found {found} where u8 (a string's bytes) is declared"
            )));
        }
        if !self.shape.is_empty() {
            return Err(self.ctx.fail(format!(
                "expected a list for a field shaped {:?}, found {found}",
                self.shape
            )));
        }
        match value {
            Some(v) => {
                self.out[0] = v;
                Ok(())
            }
            None => Err(self
                .ctx
                .fail(format!("{found} {refused} {}", self.ctx.dtype.name()))),
        }
    }

    /// A string's (or binary value's) bytes into a `u8` field's row.
    fn bytes<E: serde::de::Error>(self, bytes: &[u8], found: &str) -> Result<(), E> {
        let Some(column) = self.fit.filter(|_| self.ctx.dtype == DType::U8) else {
            return self.refuse(found);
        };
        if let Some(length) = self.length {
            length.set(bytes.len());
        }
        crate::from_arrow::write_bytes(bytes, column, self.out, self.pad)
            .map_err(|message| self.ctx.fail(message))
    }

    fn refuse<E: serde::de::Error>(self, found: &str) -> Result<(), E> {
        Err(self.ctx.fail(format!(
            "found {found} where {} is declared",
            self.ctx.dtype.name()
        )))
    }
}

impl<'de, T: Element> Visitor<'de> for Slot<'_, '_, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a value of {}", self.ctx.dtype.name())
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, _d: D) -> Result<(), D::Error> {
        // rmp-serde hands a MessagePack extension value over as a newtype struct.
        Err(self.ctx.fail(EXT_REFUSED.replacen("a ", "found a ", 1)))
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        self.scalar(
            T::from_bool(v),
            format_args!("bool {v}"),
            "is not allowed in",
        )
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.scalar(T::from_i64(v), format_args!("integer {v}"), "does not fit")
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.scalar(T::from_u64(v), format_args!("integer {v}"), "does not fit")
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        let refused = if T::DTYPE == DType::F32 {
            "does not fit"
        } else {
            "is not allowed in"
        };
        // Debug prints 1e300 as such, not as 301 digits.
        self.scalar(T::from_f64(v), format_args!("float {v:?}"), refused)
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.bytes(v.as_bytes(), "a string")
    }
    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<(), E> {
        self.bytes(v, "binary data")
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.refuse("null")
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.refuse("null")
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        self.refuse("an object")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.ctx.dtype == DType::U8 {
            return self.refuse("a list");
        }
        let Some((&dim, inner)) = self.shape.split_first() else {
            return Err(self
                .ctx
                .fail("nested list is deeper than the declared shape".to_owned()));
        };
        let w: usize = inner.iter().product();
        let mut j = 0;
        let mut ended = false;
        while j < dim {
            let slot = Slot {
                out: &mut self.out[j * w..(j + 1) * w],
                shape: inner,
                pad: self.pad,
                ctx: self.ctx,
                fit: None,
                length: None,
            };
            if seq.next_element_seed(slot)?.is_none() {
                self.out[j * w..].fill(self.pad);
                ended = true;
                break;
            }
            j += 1;
        }
        // Values beyond the declared length are truncated: skipped without building them, and
        // counted for a field whose overflow rule is an error.
        let mut len = j;
        if !ended {
            while seq.next_element::<IgnoredAny>()?.is_some() {
                len += 1;
            }
        }
        if let Some(length) = self.length {
            length.set(len);
        }
        match self.fit {
            Some(column) => {
                crate::from_arrow::fit_first_axis(self.out, self.shape, len, column, self.pad)
                    .map_err(|message| self.ctx.fail(message))
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::columns::test_projection as projection;

    fn run(p: &Projection, json: &str) -> (Vec<ColumnBuf>, Result<(), RecordError>) {
        let mut cols = crate::columns::junk_row(p);
        let mut de = serde_json::Deserializer::from_str(json);
        let r = project_record(&mut de, p, &mut cols, 0);
        (cols, r)
    }

    #[test]
    fn pads_truncates_and_skips_unprojected_fields() {
        let p = projection(&[("a", DType::I32, vec![3]), ("b", DType::F64, vec![])]);
        let (cols, r) = run(
            &p,
            r#"{"junk": {"x": [1, "s"]}, "a": [5, 6, 7, 8], "b": 0.5}"#,
        );
        r.unwrap();
        assert!(matches!(&cols[0], ColumnBuf::I32(v) if v[..] == [5, 6, 7]));
        assert!(matches!(&cols[1], ColumnBuf::F64(v) if v[..] == [0.5]));
        let (cols, r) = run(&p, r#"{"a": [5], "b": 1}"#);
        r.unwrap();
        assert!(matches!(&cols[0], ColumnBuf::I32(v) if v[..] == [5, 0, 0]));
    }

    #[test]
    fn wrong_types_name_the_field() {
        let p = projection(&[("a", DType::I32, vec![2])]);
        let (_, r) = run(&p, r#"{"a": [1, "x"]}"#);
        assert!(
            matches!(r, Err(RecordError::Field(0, ref m)) if m.contains("string")),
            "{r:?}"
        );
        let (_, r) = run(&p, r#"{"a": [[1], 2]}"#);
        assert!(
            matches!(r, Err(RecordError::Field(0, ref m)) if m.contains("deeper")),
            "{r:?}"
        );
        let (_, r) = run(&p, r#"{"b": 1}"#);
        assert!(matches!(r, Err(RecordError::Missing(0))), "{r:?}");
        let (_, r) = run(&p, r#"{"a": [1, 2"#);
        assert!(matches!(r, Err(RecordError::Malformed(_))), "{r:?}");
    }
}
