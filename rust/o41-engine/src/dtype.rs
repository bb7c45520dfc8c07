//! Column element types and the checked conversions from record values into them.
//!
//! Conversions are strict on purpose: a float or string where integers are declared is an error,
//! never a silent truncation or zero. Integers narrow only when the value fits.

use arrow_array::types::{Float32Type, Float64Type, Int32Type, Int64Type, UInt8Type};
use arrow_array::ArrowPrimitiveType;
use arrow_buffer::ArrowNativeType;
use serde::{Deserialize, Serialize};

/// A projected column's element type. `Bool` is delivered as `uint8` 0/1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// 32-bit float.
    F32,
    /// 64-bit float (double precision is kept end to end).
    F64,
    /// Boolean, stored as `uint8` 0 or 1.
    Bool,
    /// Bytes: a UTF-8 string (or binary value) as a row of its bytes, for text a trainer needs
    /// in the batch itself (reward context).
    U8,
}

impl DType {
    /// The name users write in configs.
    pub fn name(self) -> &'static str {
        match self {
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::Bool => "bool",
            DType::U8 => "u8",
        }
    }

    /// Bytes per element in the delivered buffer.
    pub fn byte_width(self) -> usize {
        match self {
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
            DType::Bool | DType::U8 => 1,
        }
    }
}

/// A field's padding value, kept in the widest form so `i64` pads do not pass through `f64`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// An integer value.
    Int(i64),
    /// A floating-point value.
    Float(f64),
    /// A boolean value.
    Bool(bool),
    /// The pad of a `u8` field (validated to fit a byte).
    Byte(u8),
}

impl Scalar {
    /// The value as a `T`: a pad, which the config check has already found to fit the dtype.
    pub fn element<T: Element>(self) -> T {
        T::from_scalar(self).unwrap_or_default()
    }

    /// Describes the value's kind for error messages.
    pub fn kind(self) -> &'static str {
        match self {
            Scalar::Int(_) => "integer",
            Scalar::Float(_) => "float",
            Scalar::Bool(_) => "bool",
            Scalar::Byte(_) => "byte",
        }
    }
}

/// A Rust element type that a column of some [`DType`] stores.
pub trait Element: ArrowNativeType + Default {
    /// The dtype this element type implements.
    const DTYPE: DType;
    /// The Arrow primitive type holding these elements.
    type Arrow: ArrowPrimitiveType<Native = Self>;
    /// Converts a signed integer, `None` if it does not fit or the dtype refuses integers.
    fn from_i64(v: i64) -> Option<Self>;
    /// Converts an unsigned integer, `None` if it does not fit.
    fn from_u64(v: u64) -> Option<Self>;
    /// Converts a float, `None` where the dtype is integral (no silent truncation).
    fn from_f64(v: f64) -> Option<Self>;
    /// Converts a boolean, `None` where the dtype is numeric.
    fn from_bool(v: bool) -> Option<Self>;
    /// A byte of a string, as a `u8` field's element (only `u8` columns receive them).
    fn from_byte(v: u8) -> Self;

    /// Converts any scalar.
    fn from_scalar(v: Scalar) -> Option<Self> {
        match v {
            Scalar::Int(i) => Self::from_i64(i),
            Scalar::Float(f) => Self::from_f64(f),
            Scalar::Bool(b) => Self::from_bool(b),
            Scalar::Byte(b) => Some(Self::from_byte(b)),
        }
    }
}

macro_rules! int_element {
    ($t:ty, $arrow:ty, $dtype:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            type Arrow = $arrow;
            #[inline]
            fn from_i64(v: i64) -> Option<Self> {
                <$t>::try_from(v).ok()
            }
            #[inline]
            fn from_u64(v: u64) -> Option<Self> {
                <$t>::try_from(v).ok()
            }
            #[inline]
            fn from_f64(_: f64) -> Option<Self> {
                None
            }
            #[inline]
            fn from_bool(_: bool) -> Option<Self> {
                None
            }
            #[inline]
            fn from_byte(v: u8) -> Self {
                Self::from(v)
            }
        }
    };
}

int_element!(i32, Int32Type, DType::I32);
int_element!(i64, Int64Type, DType::I64);

macro_rules! float_element {
    ($t:ty, $arrow:ty, $dtype:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            type Arrow = $arrow;
            #[inline]
            fn from_i64(v: i64) -> Option<Self> {
                Some(v as $t)
            }
            #[inline]
            fn from_u64(v: u64) -> Option<Self> {
                Some(v as $t)
            }
            #[inline]
            fn from_f64(v: f64) -> Option<Self> {
                Some(v as $t)
            }
            #[inline]
            fn from_bool(_: bool) -> Option<Self> {
                None
            }
            #[inline]
            fn from_byte(v: u8) -> Self {
                Self::from(v)
            }
        }
    };
}

float_element!(f64, Float64Type, DType::F64);

/// `f32` columns refuse a finite value beyond the type's range instead of storing infinity;
/// NaN and infinities themselves convert as they are.
impl Element for f32 {
    const DTYPE: DType = DType::F32;
    type Arrow = Float32Type;
    #[inline]
    fn from_i64(v: i64) -> Option<Self> {
        Some(v as f32)
    }
    #[inline]
    fn from_u64(v: u64) -> Option<Self> {
        Some(v as f32)
    }
    #[inline]
    fn from_f64(v: f64) -> Option<Self> {
        let narrowed = v as f32;
        (narrowed.is_finite() || !v.is_finite()).then_some(narrowed)
    }
    #[inline]
    fn from_bool(_: bool) -> Option<Self> {
        None
    }
    #[inline]
    fn from_byte(v: u8) -> Self {
        Self::from(v)
    }
}

/// `bool` columns are `u8` 0/1. Integers 0 and 1 are accepted too (masks are often stored as
/// int8); any other value is refused rather than coerced. `u8` columns share the element type:
/// they receive a string's bytes (`from_byte`), never numbers.
impl Element for u8 {
    const DTYPE: DType = DType::Bool;
    type Arrow = UInt8Type;
    #[inline]
    fn from_i64(v: i64) -> Option<Self> {
        match v {
            0 => Some(0),
            1 => Some(1),
            _ => None,
        }
    }
    #[inline]
    fn from_u64(v: u64) -> Option<Self> {
        match v {
            0 => Some(0),
            1 => Some(1),
            _ => None,
        }
    }
    #[inline]
    fn from_f64(_: f64) -> Option<Self> {
        None
    }
    #[inline]
    fn from_bool(v: bool) -> Option<Self> {
        Some(u8::from(v))
    }
    #[inline]
    fn from_byte(v: u8) -> Self {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_narrow_only_when_they_fit() {
        assert_eq!(i32::from_i64(7), Some(7));
        assert_eq!(i32::from_i64(i64::from(i32::MAX) + 1), None);
        assert_eq!(i64::from_u64(u64::MAX), None);
        assert_eq!(i32::from_f64(1.0), None);
    }

    #[test]
    fn bool_accepts_only_zero_and_one() {
        assert_eq!(u8::from_bool(true), Some(1));
        assert_eq!(u8::from_i64(1), Some(1));
        assert_eq!(u8::from_i64(2), None);
        assert_eq!(u8::from_f64(1.0), None);
    }

    #[test]
    fn f32_refuses_finite_values_beyond_its_range() {
        assert_eq!(f32::from_f64(1e300), None);
        assert_eq!(f32::from_f64(-1e39), None);
        assert_eq!(f32::from_f64(1.5), Some(1.5));
        assert!(f32::from_f64(f64::INFINITY).is_some_and(f32::is_infinite));
        assert!(f32::from_f64(f64::NAN).is_some_and(f32::is_nan));
    }

    #[test]
    fn f64_keeps_double_precision() {
        let v = 0.1_f64 + 0.2_f64;
        assert_eq!(f64::from_f64(v).map(f64::to_bits), Some(v.to_bits()));
    }
}
