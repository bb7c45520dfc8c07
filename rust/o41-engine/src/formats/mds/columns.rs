//! MDS column encodings: how a sample's bytes for one column become a value, for every
//! encoding `streaming` defines that holds numbers or text.

use crate::formats::value::{json_value, Value};

/// How one column's bytes become a value.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Column {
    /// A fixed-size little-endian number.
    Number(Elem),
    /// `int`: an `int64`.
    Int,
    /// `str`: UTF-8 text.
    Str,
    /// `bytes`.
    Bytes,
    /// `json`: a JSON document.
    Json,
    /// `str_int` / `str_float`: a number written as text.
    TextInt,
    TextFloat,
    /// `ndarray[:dtype[:shape]]`: an array, its dtype and shape in the column or in each value.
    NdArray {
        dtype: Option<Elem>,
        shape: Option<Vec<u64>>,
    },
    /// An encoding not read (images, pickles): named when its column is read.
    Other(String),
}

/// An element type of MDS numbers and arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Elem {
    U8,
    I8,
    U16,
    I16,
    F16,
    U32,
    I32,
    F32,
    U64,
    I64,
    F64,
}

impl Elem {
    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "uint8" => Elem::U8,
            "int8" => Elem::I8,
            "uint16" => Elem::U16,
            "int16" => Elem::I16,
            "float16" => Elem::F16,
            "uint32" => Elem::U32,
            "int32" => Elem::I32,
            "float32" => Elem::F32,
            "uint64" => Elem::U64,
            "int64" => Elem::I64,
            "float64" => Elem::F64,
            _ => return None,
        })
    }

    /// The dtype `streaming` writes as this code before a dynamic-dtype array.
    fn of_code(code: u8) -> Option<Self> {
        Some(match code {
            8 => Elem::U8,
            9 => Elem::I8,
            16 => Elem::U16,
            17 => Elem::I16,
            18 => Elem::F16,
            32 => Elem::U32,
            33 => Elem::I32,
            34 => Elem::F32,
            64 => Elem::U64,
            65 => Elem::I64,
            66 => Elem::F64,
            _ => return None,
        })
    }

    fn width(self) -> usize {
        match self {
            Elem::U8 | Elem::I8 => 1,
            Elem::U16 | Elem::I16 | Elem::F16 => 2,
            Elem::U32 | Elem::I32 | Elem::F32 => 4,
            Elem::U64 | Elem::I64 | Elem::F64 => 8,
        }
    }

    /// The value of one element (`bytes` holds exactly `width`).
    fn value(self, b: &[u8]) -> Value {
        let mut le = [0u8; 8];
        le[..b.len()].copy_from_slice(b);
        let raw = u64::from_le_bytes(le);
        match self {
            Elem::U8 | Elem::U16 | Elem::U32 | Elem::I64 => Value::Int(raw as i64),
            Elem::U64 => i64::try_from(raw).map_or(Value::UInt(raw), Value::Int),
            Elem::I8 => Value::Int(i64::from(b[0] as i8)),
            Elem::I16 => Value::Int(i64::from(i16::from_le_bytes([b[0], b[1]]))),
            Elem::I32 => Value::Int(i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            Elem::F16 => Value::Float(half_to_f64(u16::from_le_bytes([b[0], b[1]]))),
            Elem::F32 => Value::Float(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            Elem::F64 => Value::Float(f64::from_bits(raw)),
        }
    }
}

/// An IEEE half-precision float, widened.
fn half_to_f64(h: u16) -> f64 {
    let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f64::from(h & 0x3ff);
    match exp {
        0 => sign * frac * 2f64.powi(-24),
        31 if frac == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        _ => sign * (1.0 + frac / 1024.0) * 2f64.powi(exp - 15),
    }
}

impl Column {
    /// The column `encoding` names (`streaming`'s names; `ndarray:int32:2,3`).
    pub(super) fn of(encoding: &str) -> Column {
        let mut parts = encoding.splitn(3, ':');
        let name = parts.next().unwrap_or("");
        if let Some(elem) = Elem::named(name) {
            return Column::Number(elem);
        }
        match name {
            "int" => Column::Int,
            "str" => Column::Str,
            "bytes" => Column::Bytes,
            "json" => Column::Json,
            "str_int" => Column::TextInt,
            "str_float" => Column::TextFloat,
            "ndarray" => {
                let dtype = parts.next().filter(|d| !d.is_empty());
                let shape = parts.next().filter(|s| !s.is_empty());
                let dtype = match dtype.map(Elem::named) {
                    None => None,
                    Some(Some(elem)) => Some(elem),
                    Some(None) => return Column::Other(encoding.to_owned()),
                };
                let shape = match shape.map(|s| {
                    s.split(',')
                        .map(|d| d.trim().parse::<u64>().ok())
                        .collect::<Option<Vec<_>>>()
                }) {
                    None => None,
                    Some(Some(dims)) => Some(dims),
                    Some(None) => return Column::Other(encoding.to_owned()),
                };
                Column::NdArray { dtype, shape }
            }
            _ => Column::Other(encoding.to_owned()),
        }
    }

    /// The size every value of the column has, where the encoding fixes it.
    pub(super) fn fixed_size(&self) -> Option<u64> {
        match self {
            Column::Number(e) => Some(e.width() as u64),
            Column::Int => Some(8),
            Column::NdArray {
                dtype: Some(e),
                shape: Some(dims),
            } => dims
                .iter()
                .try_fold(e.width() as u64, |n, &d| n.checked_mul(d)),
            _ => None,
        }
    }

    /// The value `data` holds.
    pub(super) fn decode(&self, data: &[u8]) -> std::result::Result<Value, String> {
        match self {
            Column::Number(e) if data.len() == e.width() => Ok(e.value(data)),
            Column::Int if data.len() == 8 => Ok(Elem::I64.value(data)),
            Column::Number(_) | Column::Int => Err(format!("{} bytes for a number", data.len())),
            Column::Str => std::str::from_utf8(data)
                .map(|s| Value::Str(s.to_owned()))
                .map_err(|e| format!("text that is not UTF-8: {e}")),
            Column::Bytes => Ok(Value::Bytes(data.to_vec())),
            Column::Json => json_value(data),
            Column::TextInt => std::str::from_utf8(data)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .map(Value::Int)
                .ok_or_else(|| "a str_int that is not an integer".to_owned()),
            Column::TextFloat => std::str::from_utf8(data)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .map(Value::Float)
                .ok_or_else(|| "a str_float that is not a number".to_owned()),
            Column::NdArray { dtype, shape } => decode_array(*dtype, shape.as_deref(), data),
            Column::Other(name) => Err(format!(
                "its encoding '{name}' is not read (images and pickles are not numbers)"
            )),
        }
    }
}

/// An `ndarray` value: `[dtype code]` when the column has none, `[ndim << 2 | shape width]` and
/// the shape when it has none, then the elements.
fn decode_array(
    dtype: Option<Elem>,
    shape: Option<&[u64]>,
    data: &[u8],
) -> std::result::Result<Value, String> {
    let mut at = 0usize;
    let mut byte = || -> std::result::Result<u8, String> {
        let b = *data.get(at).ok_or("an array cut short")?;
        at += 1;
        Ok(b)
    };
    let elem = if let Some(e) = dtype {
        e
    } else {
        let code = byte()?;
        Elem::of_code(code).ok_or_else(|| format!("array dtype code {code}"))?
    };
    let dims: Vec<u64> = if let Some(dims) = shape {
        dims.to_vec()
    } else {
        let b = byte()?;
        let (ndim, width) = (usize::from(b >> 2), 1usize << (b & 3));
        let need = ndim * width;
        let raw = data.get(at..at + need).ok_or("an array shape cut short")?;
        at += need;
        raw.chunks_exact(width)
            .map(|c| {
                let mut le = [0u8; 8];
                le[..width].copy_from_slice(c);
                u64::from_le_bytes(le)
            })
            .collect()
    };
    let count = dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .ok_or("an array shape that overflows")?;
    let values = &data[at..];
    if Some(values.len() as u64) != count.checked_mul(elem.width() as u64) {
        return Err(format!(
            "an array of shape {dims:?} of {}-byte elements in {} bytes",
            elem.width(),
            values.len()
        ));
    }
    let flat: Vec<Value> = values
        .chunks_exact(elem.width())
        .map(|b| elem.value(b))
        .collect();
    Ok(nest(flat, &dims))
}

/// Elements in row-major order as nested lists of `dims` (a scalar for no dimensions).
fn nest(flat: Vec<Value>, dims: &[u64]) -> Value {
    match dims {
        [] => flat.into_iter().next().unwrap_or(Value::Null),
        [_] => Value::List(flat),
        [_, rest @ ..] => {
            let inner: usize = rest.iter().product::<u64>() as usize;
            if inner == 0 {
                return Value::List(Vec::new());
            }
            let mut out = Vec::new();
            let mut items = flat.into_iter();
            loop {
                let part: Vec<Value> = items.by_ref().take(inner).collect();
                if part.is_empty() {
                    break;
                }
                out.push(nest(part, rest));
            }
            Value::List(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_array, half_to_f64, Column, Elem};
    use crate::formats::Value;

    #[test]
    fn column_encodings_parse_as_streaming_names_them() {
        assert_eq!(Column::of("int32"), Column::Number(Elem::I32));
        assert_eq!(Column::of("int"), Column::Int);
        assert_eq!(
            Column::of("ndarray:uint16:2,3"),
            Column::NdArray {
                dtype: Some(Elem::U16),
                shape: Some(vec![2, 3])
            }
        );
        assert_eq!(
            Column::of("ndarray:int32"),
            Column::NdArray {
                dtype: Some(Elem::I32),
                shape: None
            }
        );
        assert_eq!(Column::of("jpeg"), Column::Other("jpeg".into()));
        assert_eq!(Column::of("ndarray:int32").fixed_size(), None);
        assert_eq!(Column::of("ndarray:int32:2,3").fixed_size(), Some(24));
    }

    #[test]
    fn dynamic_arrays_carry_their_dtype_and_shape() {
        // dtype int16 (17), two dimensions of uint8 sizes (2 << 2 | 0), shape (2, 1).
        let data = [17u8, 8, 2, 1, 0xff, 0xff, 3, 0];
        let value = decode_array(None, None, &data).unwrap();
        assert_eq!(
            value,
            Value::List(vec![
                Value::List(vec![Value::Int(-1)]),
                Value::List(vec![Value::Int(3)])
            ])
        );
        assert!(decode_array(None, None, &data[..7]).is_err());
        assert!(decode_array(Some(Elem::U8), Some(&[u64::MAX, 2]), &[]).is_err());
    }

    #[test]
    #[allow(clippy::float_cmp)] // exact: each is a power of two
    fn half_floats_widen_exactly() {
        assert_eq!(half_to_f64(0x3c00), 1.0);
        assert_eq!(half_to_f64(0xc000), -2.0);
        assert_eq!(half_to_f64(0x0001), 2f64.powi(-24));
        assert!(half_to_f64(0x7e00).is_nan());
    }
}
