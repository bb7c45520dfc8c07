//! Whole records of self-describing shards (JSON Lines, `MessagePack`): what `iter_shard` reads
//! and the dataset saver writes. A record is an ordered map with string keys; values keep their
//! kind exactly (integers are not floats, bytes are not strings), in any serde format.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};

/// One value of a record.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// JSON `null`, `MessagePack` nil.
    Null,
    /// A boolean.
    Bool(bool),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer above `i64::MAX`.
    UInt(u64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// Binary data (`MessagePack` bin; JSON has none).
    Bytes(Vec<u8>),
    /// A list.
    List(Vec<Value>),
    /// A map with string keys, in the order they were read or given.
    Map(Vec<(String, Value)>),
}

/// A record: the fields of one row, in order.
pub type Record = Vec<(String, Value)>;

impl Value {
    /// The first part of the value that JSON cannot represent (a NaN or infinite float, binary
    /// data), as its dotted path (`a.b[2]`, where `at` is the value's own path) and what it is.
    pub fn not_json(&self, at: &str) -> Option<(String, &'static str)> {
        match self {
            Value::Float(f) if !f.is_finite() => Some((at.to_owned(), "NaN and infinity are")),
            Value::Bytes(_) => Some((at.to_owned(), "binary data is")),
            Value::List(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| v.not_json(&format!("{at}[{i}]"))),
            Value::Map(fields) => fields
                .iter()
                .find_map(|(k, v)| v.not_json(&format!("{at}.{k}"))),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::UInt(v), Value::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::Bytes(v.to_vec()))
    }
    fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Value, E> {
        Ok(Value::Bytes(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, _d: D) -> Result<Value, D::Error> {
        // rmp-serde hands a MessagePack extension value over as a newtype struct.
        Err(serde::de::Error::custom(crate::record::EXT_REFUSED))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        // The size hint comes from the input: it is not trusted for an allocation.
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::List(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut fields = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            fields.push((key, map.next_value()?));
        }
        Ok(Value::Map(fields))
    }
}

/// Map keys must be strings (or UTF-8 bytes, which `MessagePack` writers sometimes use).
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string map key")
    }
    fn visit_str<E>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }
    fn visit_string<E>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<String, E> {
        String::from_utf8(v.to_vec())
            .map_err(|_| E::custom("a map key is bytes that are not UTF-8"))
    }
}

/// Reads one record (a map) from `deserializer`; anything else is an error naming what it is.
pub fn read_record<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Record, String> {
    match Value::deserialize(deserializer).map_err(|e| e.to_string())? {
        Value::Map(fields) => Ok(fields),
        other => Err(format!(
            "a record must be a map of fields, found {}",
            other.kind()
        )),
    }
}

impl Value {
    /// Appends the ids of a token list (a list of integers) to `ids`; otherwise says what the
    /// value is, for a message ("a string", "a list holding a float").
    pub fn push_ids(self, ids: &mut Vec<i64>) -> Result<(), String> {
        let Value::List(items) = self else {
            return Err(self.kind().to_owned());
        };
        for item in items {
            match item {
                Value::Int(v) => ids.push(v),
                other => return Err(format!("a list holding {}", other.kind())),
            }
        }
        Ok(())
    }

    /// The kind of value, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a bool",
            Value::Int(_) | Value::UInt(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::Bytes(_) => "binary data",
            Value::List(_) => "a list",
            Value::Map(_) => "a map",
        }
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => serializer.serialize_unit(),
            Value::Bool(b) => serializer.serialize_bool(*b),
            Value::Int(i) => serializer.serialize_i64(*i),
            Value::UInt(u) => serializer.serialize_u64(*u),
            Value::Float(f) => serializer.serialize_f64(*f),
            Value::Str(s) => serializer.serialize_str(s),
            Value::Bytes(b) => serializer.serialize_bytes(b),
            Value::List(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Map(fields) => serialize_fields(fields, serializer),
        }
    }
}

/// Serialises a record's fields as a map.
pub fn serialize_fields<S: Serializer>(
    fields: &[(String, Value)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(fields.len()))?;
    for (key, value) in fields {
        map.serialize_entry(key, value)?;
    }
    map.end()
}

/// The value a JSON document holds (an MDS `json` column).
pub fn json_value(data: &[u8]) -> Result<Value, String> {
    Value::deserialize(&mut serde_json::Deserializer::from_slice(data)).map_err(|e| e.to_string())
}

/// A value as a serde `Deserializer`: a record built in memory (an MDS sample) is projected by
/// the same code as one parsed from JSON or `MessagePack`.
pub struct ValueDeserializer(Value);

impl de::IntoDeserializer<'_, de::value::Error> for Value {
    type Deserializer = ValueDeserializer;

    fn into_deserializer(self) -> ValueDeserializer {
        ValueDeserializer(self)
    }
}

impl<'de> Deserializer<'de> for ValueDeserializer {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(b),
            Value::Int(i) => visitor.visit_i64(i),
            Value::UInt(u) => visitor.visit_u64(u),
            Value::Float(f) => visitor.visit_f64(f),
            Value::Str(s) => visitor.visit_string(s),
            Value::Bytes(b) => visitor.visit_byte_buf(b),
            Value::List(items) => {
                visitor.visit_seq(de::value::SeqDeserializer::new(items.into_iter()))
            }
            Value::Map(fields) => {
                visitor.visit_map(de::value::MapDeserializer::new(fields.into_iter()))
            }
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

/// A record as a `Serialize` map.
pub struct RecordRef<'a>(pub &'a [(String, Value)]);

impl Serialize for RecordRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_fields(self.0, serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_json_and_msgpack_alike() {
        let json = r#"{"a": 1, "b": [1.5, "x", null, true], "c": {"d": 18446744073709551615}}"#;
        let from_json = read_record(&mut serde_json::Deserializer::from_str(json)).unwrap();
        let packed = rmp_serde::to_vec_named(&RecordRef(&from_json)).unwrap();
        let from_msgpack =
            read_record(&mut rmp_serde::Deserializer::from_read_ref(&packed)).unwrap();
        assert_eq!(from_json, from_msgpack);
        assert_eq!(
            from_json[2].1,
            Value::Map(vec![("d".into(), Value::UInt(u64::MAX))])
        );
    }

    #[test]
    fn a_value_deserializes_as_itself() {
        let json = r#"{"a": -1, "b": [1.5, "x", null, true], "c": {"d": 18446744073709551615}}"#;
        let record = read_record(&mut serde_json::Deserializer::from_str(json)).unwrap();
        let value = Value::Map(record.clone());
        let again = read_record(de::IntoDeserializer::into_deserializer(value)).unwrap();
        assert_eq!(again, record);
    }

    #[test]
    fn refuses_records_that_are_not_maps() {
        let err = read_record(&mut serde_json::Deserializer::from_str("[1, 2]")).unwrap_err();
        assert!(err.contains("found a list"), "{err}");
    }

    #[test]
    fn finds_what_json_cannot_hold() {
        let v = Value::Map(vec![(
            "x".into(),
            Value::List(vec![Value::Float(f64::NAN)]),
        )]);
        assert_eq!(v.not_json("r").map(|(at, _)| at).as_deref(), Some("r.x[0]"));
        assert!(Value::Bytes(vec![1]).not_json("b").is_some());
        assert!(Value::Float(1.5).not_json("f").is_none());
    }
}
