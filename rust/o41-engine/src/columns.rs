//! Fixed-shape column buffers: what decoders write rows into and what batches hand to Python.
//!
//! A column is one contiguous buffer of `rows * width` elements, pre-filled with the field's pad
//! so that short lists need no second pass. Batches become Arrow arrays without copying: the
//! `Vec` turns into an Arrow buffer, wrapped in one `FixedSizeList` level per axis.

use std::sync::Arc;

use arrow_array::{ArrayRef, FixedSizeListArray, PrimitiveArray, RecordBatch};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::dtype::{DType, Element, Scalar};
use crate::error::Result;
use crate::fields::{ProjectedColumn, Projection};

/// One column's elements, typed by the field's dtype.
#[derive(Debug, Clone)]
pub enum ColumnBuf {
    /// `i32` elements.
    I32(Vec<i32>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f64` elements.
    F64(Vec<f64>),
    /// `bool` elements as 0/1.
    Bool(Vec<u8>),
}

/// Runs `$body` with `$v` bound to the typed `Vec` inside a [`ColumnBuf`].
#[macro_export]
#[doc(hidden)]
macro_rules! with_column {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            $crate::columns::ColumnBuf::I32($v) => $body,
            $crate::columns::ColumnBuf::I64($v) => $body,
            $crate::columns::ColumnBuf::F32($v) => $body,
            $crate::columns::ColumnBuf::F64($v) => $body,
            $crate::columns::ColumnBuf::Bool($v) => $body,
        }
    };
}

fn filled<T: Element>(pad: Scalar, len: usize) -> Vec<T> {
    // The pad was validated against the dtype when the config was checked.
    vec![T::from_scalar(pad).unwrap_or_default(); len]
}

impl ColumnBuf {
    /// A buffer of `rows` rows, every element set to the column's pad.
    pub fn padded(column: &ProjectedColumn, rows: usize) -> Self {
        let len = rows * column.width;
        match column.dtype {
            DType::I32 => ColumnBuf::I32(filled(column.pad, len)),
            DType::I64 => ColumnBuf::I64(filled(column.pad, len)),
            DType::F32 => ColumnBuf::F32(filled(column.pad, len)),
            DType::F64 => ColumnBuf::F64(filled(column.pad, len)),
            DType::Bool => ColumnBuf::Bool(filled(column.pad, len)),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_column!(self, v => v.len())
    }

    /// True when the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets element `index` of an integer column (synthetic columns are scalar integers).
    pub fn set_int(&mut self, index: usize, value: i64) {
        match self {
            ColumnBuf::I32(v) => v[index] = value as i32,
            ColumnBuf::I64(v) => v[index] = value,
            _ => unreachable!("synthetic columns are integers"),
        }
    }

    /// Copies `rows` rows of `width` elements from `src` (starting at `src_row`) to `dst_row`.
    pub fn copy_rows(
        &mut self,
        dst_row: usize,
        src: &ColumnBuf,
        src_row: usize,
        rows: usize,
        width: usize,
    ) {
        let (d, s, n) = (dst_row * width, src_row * width, rows * width);
        match (self, src) {
            (ColumnBuf::I32(a), ColumnBuf::I32(b)) => a[d..d + n].copy_from_slice(&b[s..s + n]),
            (ColumnBuf::I64(a), ColumnBuf::I64(b)) => a[d..d + n].copy_from_slice(&b[s..s + n]),
            (ColumnBuf::F32(a), ColumnBuf::F32(b)) => a[d..d + n].copy_from_slice(&b[s..s + n]),
            (ColumnBuf::F64(a), ColumnBuf::F64(b)) => a[d..d + n].copy_from_slice(&b[s..s + n]),
            (ColumnBuf::Bool(a), ColumnBuf::Bool(b)) => a[d..d + n].copy_from_slice(&b[s..s + n]),
            _ => unreachable!("columns of one field always share a dtype"),
        }
    }

    /// Moves the buffer into an Arrow array of `FixedSizeList`s shaped like the column.
    pub fn into_arrow(self, column: &ProjectedColumn) -> ArrayRef {
        let values: ArrayRef = match self {
            ColumnBuf::I32(v) => primitive::<i32>(v),
            ColumnBuf::I64(v) => primitive::<i64>(v),
            ColumnBuf::F32(v) => primitive::<f32>(v),
            ColumnBuf::F64(v) => primitive::<f64>(v),
            ColumnBuf::Bool(v) => primitive::<u8>(v),
        };
        // Innermost axis first: each level groups `dim` consecutive items of the level below.
        column.shape.iter().rev().fold(values, |inner, &dim| {
            let field = Arc::new(Field::new("item", inner.data_type().clone(), false));
            Arc::new(FixedSizeListArray::new(field, dim as i32, inner, None))
        })
    }
}

fn primitive<T: Element>(values: Vec<T>) -> ArrayRef {
    // `ScalarBuffer::from(Vec)` takes ownership of the allocation: no copy.
    Arc::new(PrimitiveArray::<T::Arrow>::new(
        ScalarBuffer::from(values),
        None,
    ))
}

/// Arrow data type of a delivered column.
pub fn arrow_type(column: &ProjectedColumn) -> DataType {
    let leaf = match column.dtype {
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::F32 => DataType::Float32,
        DType::F64 => DataType::Float64,
        DType::Bool => DataType::UInt8,
    };
    column.shape.iter().rev().fold(leaf, |inner, &dim| {
        DataType::FixedSizeList(Arc::new(Field::new("item", inner, false)), dim as i32)
    })
}

/// Arrow schema of delivered batches.
pub fn batch_schema(projection: &Projection) -> SchemaRef {
    Arc::new(Schema::new(
        projection
            .columns
            .iter()
            .map(|c| Field::new(&c.name, arrow_type(c), false))
            .collect::<Vec<_>>(),
    ))
}

/// Decoded rows of some shard range, one buffer per projected column.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// Rows held.
    pub rows: usize,
    /// One buffer per projected column, in projection order.
    pub columns: Vec<ColumnBuf>,
}

impl Chunk {
    /// A chunk of `rows` rows, every element padded.
    pub fn padded(projection: &Projection, rows: usize) -> Self {
        Chunk {
            rows,
            columns: projection
                .columns
                .iter()
                .map(|c| ColumnBuf::padded(c, rows))
                .collect(),
        }
    }

    /// Bytes held by the chunk's buffers.
    pub fn bytes(&self, projection: &Projection) -> usize {
        self.rows * projection.row_bytes()
    }

    /// Turns the chunk into a record batch without copying its buffers.
    pub fn into_record_batch(
        self,
        projection: &Projection,
        schema: &SchemaRef,
    ) -> Result<RecordBatch> {
        let arrays: Vec<ArrayRef> = self
            .columns
            .into_iter()
            .zip(&projection.columns)
            .map(|(buf, column)| buf.into_arrow(column))
            .collect();
        Ok(RecordBatch::try_new(schema.clone(), arrays).expect("batch columns match the schema"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FieldSpec;
    use arrow_array::Array;

    fn column(shape: Vec<usize>) -> ProjectedColumn {
        let spec = FieldSpec {
            name: "x".into(),
            source: "x".into(),
            dtype: DType::I32,
            shape,
            pad: serde_json::Value::from(-1),
        };
        ProjectedColumn::new(&spec, "fields[0]").unwrap()
    }

    #[test]
    fn nested_shape_becomes_nested_fixed_size_lists() {
        let c = column(vec![2, 3]);
        let buf = ColumnBuf::padded(&c, 4);
        assert_eq!(buf.len(), 24);
        let arr = buf.into_arrow(&c);
        assert_eq!(arr.len(), 4);
        assert_eq!(arr.data_type(), &arrow_type(&c));
    }

    #[test]
    fn into_arrow_keeps_the_allocation() {
        let c = column(vec![3]);
        let buf = ColumnBuf::I32(vec![1, 2, 3, 4, 5, 6]);
        let ptr = with_column!(&buf, v => v.as_ptr().cast::<u8>());
        let arr = buf.into_arrow(&c);
        let list = arr.as_any().downcast_ref::<FixedSizeListArray>().unwrap();
        assert_eq!(list.values().to_data().buffers()[0].as_ptr(), ptr);
    }
}
