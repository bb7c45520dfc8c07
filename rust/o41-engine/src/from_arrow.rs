//! Projection of Arrow arrays (what a Parquet reader decodes) onto fixed-shape column buffers;
//! `record` is its counterpart for self-describing records.
//!
//! Every axis truncates or pads: projection writes every element of a row, the values that
//! exist and the field's pad after them, so it can fill a buffer that holds anything before.
//! Values that do not fit the declared dtype or shape are errors naming the shard, row and
//! field.

use std::ops::Range;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrowPrimitiveType, OffsetSizeTrait};
use arrow_schema::DataType;

use crate::columns::ColumnBuf;
use crate::config::{Overflow, PadSide};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::fields::ProjectedColumn;

/// Projects `rows` of an Arrow column into `out`, starting at `out_row`.
///
/// `row_base` is the shard row of `array`'s first element, used only for error messages.
pub fn project_arrow_column(
    array: &dyn Array,
    column: &ProjectedColumn,
    rows: Range<usize>,
    out: &mut ColumnBuf,
    out_row: usize,
    path: &str,
    row_base: u64,
) -> Result<()> {
    let at = |i: usize, message: String| Error::Projection {
        path: path.to_owned(),
        row: row_base + i as u64,
        field: column.name.clone(),
        source_field: column.source.clone(),
        message,
    };
    if let Some(axis) = column.measure {
        for (k, i) in rows.enumerate() {
            out.set_int(
                out_row + k,
                list_length(array, i, axis).map_err(|m| at(i, m))?,
            );
        }
        return Ok(());
    }
    let w = column.width;
    crate::with_column!(out, buf => {
        let pad = column.pad.element();
        for (k, i) in rows.enumerate() {
            let dst = &mut buf[(out_row + k) * w..(out_row + k + 1) * w];
            project_row(array, i, column, dst, pad).map_err(|m| at(i, m))?;
        }
        Ok(())
    })
}

/// How many entries of a list field's first axis (`axis`) row `i`'s list (or string) fills: a
/// `@length:<field>` value.
fn list_length(array: &dyn Array, i: usize, axis: usize) -> Result<i64, String> {
    if array.is_null(i) {
        return Err("value is null".to_owned());
    }
    list_range(array, i)
        .map(|(_, range)| range.len())
        .or_else(|| bytes_of(array, i).map(<[u8]>::len))
        .map(|len| len.min(axis) as i64)
        .ok_or_else(|| format!("expected a list to measure, found {}", array.data_type()))
}

/// Projects row `i` of `array` into `out` as `column` says: its first axis under the column's
/// overflow rule and pad side (the inner axes truncate and pad on the right).
fn project_row<T: Element>(
    array: &dyn Array,
    i: usize,
    column: &ProjectedColumn,
    out: &mut [T],
    pad: T,
) -> Result<(), String> {
    if column.dtype == DType::U8 {
        return project_bytes(array, i, column, out, pad);
    }
    let value = project_value(array, i, &column.shape, out, (column.dtype, pad));
    if column.plain() || value.is_err() {
        return value;
    }
    let Some((_, range)) = list_range(array, i) else {
        return value;
    };
    fit_first_axis(out, &column.shape, range.len(), column, pad)
}

/// Projects row `i` of a string or binary array into a `u8` field: its bytes, then pad, fitted
/// to the field's one axis.
fn project_bytes<T: Element>(
    array: &dyn Array,
    i: usize,
    column: &ProjectedColumn,
    out: &mut [T],
    pad: T,
) -> Result<(), String> {
    if array.is_null(i) {
        return Err("value is null".to_owned());
    }
    let bytes = bytes_of(array, i).ok_or_else(|| {
        format!(
            "found {} where u8 (a string's bytes) is declared",
            array.data_type()
        )
    })?;
    write_bytes(bytes, column, out, pad)
}

/// Writes `bytes` into a `u8` field's row: as many as fit, then pad, under the field's overflow
/// rule and pad side. The one rule both projections (records and Arrow arrays) follow.
pub(crate) fn write_bytes<T: Element>(
    bytes: &[u8],
    column: &ProjectedColumn,
    out: &mut [T],
    pad: T,
) -> Result<(), String> {
    let n = bytes.len().min(out.len());
    for (slot, &byte) in out.iter_mut().zip(&bytes[..n]) {
        *slot = T::from_byte(byte);
    }
    out[n..].fill(pad);
    fit_first_axis(out, &[out.len()], bytes.len(), column, pad)
}

/// The bytes of row `i` of a string or binary array; `None` for any other type.
fn bytes_of(array: &dyn Array, i: usize) -> Option<&[u8]> {
    Some(match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().value(i).as_bytes(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(i).as_bytes(),
        DataType::Utf8View => array.as_string_view().value(i).as_bytes(),
        DataType::Binary => array.as_binary::<i32>().value(i),
        DataType::LargeBinary => array.as_binary::<i64>().value(i),
        DataType::BinaryView => array.as_binary_view().value(i),
        DataType::FixedSizeBinary(_) => array.as_fixed_size_binary().value(i),
        _ => return None,
    })
}

/// Applies a list field's overflow rule and pad side to a row projected with the list's values
/// first: `len` is the list's length along the first axis.
pub(crate) fn fit_first_axis<T: Element>(
    out: &mut [T],
    shape: &[usize],
    len: usize,
    column: &ProjectedColumn,
    pad: T,
) -> Result<(), String> {
    let Some(&dim) = shape.first() else {
        return Ok(());
    };
    if len > dim && column.overflow != Overflow::Truncate {
        let rule = if column.overflow == Overflow::Drop {
            // Open leaves such rows out: one read here means the shard is not what open saw.
            "(overflow 'drop')"
        } else {
            "(overflow 'error')"
        };
        return Err(format!(
            "a list of {len} values, longer than the field's {dim} {rule}"
        ));
    }
    if column.pad_side == PadSide::Left && len < dim {
        // Values first, then pad: turned so the pad comes first and the last value ends the row.
        let w = out.len() / dim;
        out.rotate_right((dim - len) * w);
        debug_assert!(out[..(dim - len) * w].iter().all(|v| *v == pad));
    }
    Ok(())
}

/// Projects value `i` of `array` (a scalar or a nested list) into `out`, every element of it:
/// where a list is shorter than its axis, the rest is `pad`.
fn project_value<T: Element>(
    array: &dyn Array,
    i: usize,
    shape: &[usize],
    out: &mut [T],
    (dtype, pad): (DType, T),
) -> Result<(), String> {
    if array.is_null(i) {
        return Err("value is null".to_owned());
    }
    let Some((&dim, inner)) = shape.split_first() else {
        return leaf_values(array, i..i + 1, out, dtype);
    };
    let (child, range) = list_range(array, i).ok_or_else(|| {
        format!(
            "expected a list for a field shaped {shape:?}, found {}",
            array.data_type()
        )
    })?;
    let n = range.len().min(dim);
    let w: usize = inner.iter().product();
    out[n * w..].fill(pad);
    if inner.is_empty() {
        return leaf_values(child, range.start..range.start + n, &mut out[..n], dtype);
    }
    for j in 0..n {
        project_value(
            child,
            range.start + j,
            inner,
            &mut out[j * w..(j + 1) * w],
            (dtype, pad),
        )?;
    }
    Ok(())
}

fn offsets_range<O: OffsetSizeTrait>(offsets: &[O], i: usize) -> Range<usize> {
    offsets[i].as_usize()..offsets[i + 1].as_usize()
}

/// The child array and element range of list value `i`, or `None` if `array` is not a list.
fn list_range(array: &dyn Array, i: usize) -> Option<(&dyn Array, Range<usize>)> {
    match array.data_type() {
        DataType::List(_) => {
            let l = array.as_list::<i32>();
            Some((l.values().as_ref(), offsets_range(l.value_offsets(), i)))
        }
        DataType::LargeList(_) => {
            let l = array.as_list::<i64>();
            Some((l.values().as_ref(), offsets_range(l.value_offsets(), i)))
        }
        DataType::FixedSizeList(_, size) => {
            let l = array.as_fixed_size_list();
            let size = *size as usize;
            Some((l.values().as_ref(), i * size..(i + 1) * size))
        }
        _ => None,
    }
}

fn convert_slice<A, T>(
    array: &dyn Array,
    range: Range<usize>,
    out: &mut [T],
    dtype: DType,
    convert: impl Fn(A::Native) -> Option<T>,
) -> Result<(), String>
where
    A: ArrowPrimitiveType,
    A::Native: std::fmt::Debug,
    T: Element,
{
    check_nulls(array, &range)?;
    let values = &array.as_primitive::<A>().values()[range];
    // Branch-free first pass so widening copies vectorise; a failure is located afterwards.
    let mut ok = true;
    for (o, v) in out.iter_mut().zip(values) {
        let converted = convert(*v);
        ok &= converted.is_some();
        *o = converted.unwrap_or_default();
    }
    if ok {
        return Ok(());
    }
    let v = values
        .iter()
        .find(|v| convert(**v).is_none())
        .expect("a value failed to convert");
    Err(format!(
        "value {v:?} ({}) does not fit dtype {}",
        A::DATA_TYPE,
        dtype.name()
    ))
}

fn check_nulls(array: &dyn Array, range: &Range<usize>) -> Result<(), String> {
    if let Some(nulls) = array.logical_nulls() {
        let nulls = nulls.slice(range.start, range.len());
        if nulls.null_count() > 0 {
            let k = (0..range.len())
                .find(|&k| nulls.is_null(k))
                .expect("a null exists");
            return Err(format!("element {k} is null"));
        }
    }
    Ok(())
}

/// Converts the leaf values `range` of a primitive or boolean array into `out`.
fn leaf_values<T: Element>(
    array: &dyn Array,
    range: Range<usize>,
    out: &mut [T],
    dtype: DType,
) -> Result<(), String> {
    macro_rules! ints {
        ($a:ty) => {
            convert_slice::<$a, T>(array, range, out, dtype, |v| T::from_i64(i64::from(v)))
        };
    }
    match array.data_type() {
        DataType::Int8 => ints!(Int8Type),
        DataType::Int16 => ints!(Int16Type),
        DataType::Int32 => ints!(Int32Type),
        DataType::Int64 => ints!(Int64Type),
        DataType::UInt8 => ints!(UInt8Type),
        DataType::UInt16 => ints!(UInt16Type),
        DataType::UInt32 => ints!(UInt32Type),
        DataType::UInt64 => convert_slice::<UInt64Type, T>(array, range, out, dtype, T::from_u64),
        DataType::Float32 => {
            convert_slice::<Float32Type, T>(array, range, out, dtype, |v| T::from_f64(f64::from(v)))
        }
        DataType::Float64 => convert_slice::<Float64Type, T>(array, range, out, dtype, T::from_f64),
        DataType::Boolean => {
            check_nulls(array, &range)?;
            let (Some(t), Some(f)) = (T::from_bool(true), T::from_bool(false)) else {
                return Err(format!("found bool where {} is declared", dtype.name()));
            };
            let bits = array.as_boolean().values().slice(range.start, range.len());
            // Sixty-four bits at a time: a loop over one word's bits vectorises, where a bit
            // iterator steps through the buffer one index at a time.
            let chunks = bits.inner().bit_chunks(bits.offset(), bits.len());
            let n = bits.len().min(out.len());
            let mut words = out[..n].chunks_mut(64);
            for (word, o) in chunks
                .iter()
                .chain([chunks.remainder_bits()])
                .zip(&mut words)
            {
                for (i, o) in o.iter_mut().enumerate() {
                    *o = if (word >> i) & 1 == 1 { t } else { f };
                }
            }
            Ok(())
        }
        // Writers infer `list<null>` for a column whose lists are all empty: nothing to convert.
        DataType::Null if range.is_empty() => Ok(()),
        DataType::Null => Err("element 0 is null".to_owned()),
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) => {
            Err("nested list is deeper than the declared shape".to_owned())
        }
        other => Err(format!("found {other} where {} is declared", dtype.name())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FieldSpec;
    use arrow_array::builder::{Int32Builder, ListBuilder};
    use arrow_array::ListArray;

    fn column(shape: Vec<usize>, pad: i64) -> ProjectedColumn {
        let spec = FieldSpec {
            overflow: crate::config::Overflow::Truncate,
            pad_side: crate::config::PadSide::Right,
            name: "x".into(),
            source: "x".into(),
            dtype: DType::I32,
            shape,
            pad: serde_json::Value::from(pad),
        };
        ProjectedColumn::new(&spec, "fields[0]").unwrap()
    }

    /// Projects `array`'s rows into a buffer holding 99 everywhere before.
    fn projected(array: &dyn Array, shape: Vec<usize>) -> Vec<i32> {
        let mut out = ColumnBuf::padded(&column(shape.clone(), 99), array.len());
        let column = column(shape, -1);
        project_arrow_column(array, &column, 0..array.len(), &mut out, 0, "shard", 0).unwrap();
        let ColumnBuf::I32(values) = out else {
            unreachable!()
        };
        values.to_vec()
    }

    #[test]
    fn left_padding_and_overflow_errors_follow_the_first_axis() {
        let array = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            Some(vec![Some(3), Some(4), Some(5), Some(6)]),
            Some(vec![]),
        ]);
        let mut column = column(vec![3], 0);
        column.pad_side = PadSide::Left;
        let mut out = ColumnBuf::padded(&column, 3);
        project_arrow_column(&array, &column, 0..3, &mut out, 0, "p", 0).unwrap();
        let ColumnBuf::I32(values) = &out else {
            panic!("i32")
        };
        // Short lists end the row; a long one keeps its first values.
        assert_eq!(&values[..], &[0, 1, 2, 3, 4, 5, 0, 0, 0]);
        column.overflow = Overflow::Error;
        let error = project_arrow_column(&array, &column, 0..3, &mut out, 0, "p", 7)
            .err()
            .unwrap();
        let Error::Projection { row, message, .. } = error else {
            panic!("a projection error")
        };
        assert_eq!(row, 8);
        assert!(message.contains("a list of 4 values"), "{message}");
    }

    #[test]
    fn every_element_of_a_row_is_written_values_then_pad() {
        let lists = ListArray::from_iter_primitive::<Int32Type, _, _>([
            Some(vec![Some(1), Some(2)]),
            Some(vec![]),
            Some(vec![Some(3), Some(4), Some(5), Some(6), Some(7)]),
        ]);
        assert_eq!(
            projected(&lists, vec![4]),
            [1, 2, -1, -1, -1, -1, -1, -1, 3, 4, 5, 6]
        );

        // Nested: a short inner list and a missing one are padded alike.
        let mut nested = ListBuilder::new(ListBuilder::new(Int32Builder::new()));
        nested.values().values().append_value(1);
        nested.values().append(true);
        nested.append(true);
        nested.values().values().append_value(2);
        nested.values().values().append_value(3);
        nested.values().append(true);
        nested.values().append(true);
        nested.append(true);
        let nested = nested.finish();
        assert_eq!(
            projected(&nested, vec![2, 2]),
            [1, -1, -1, -1, 2, 3, -1, -1]
        );
    }
}
