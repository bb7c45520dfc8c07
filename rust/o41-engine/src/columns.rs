//! Fixed-shape column buffers: what decoders write rows into and what batches hand to Python.
//!
//! A column is one contiguous buffer of `rows * width` elements, pre-filled with the field's pad
//! so that short lists need no second pass. Batches become Arrow arrays without copying: the
//! buffer turns into an Arrow buffer, wrapped in one `FixedSizeList` level per axis.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use arrow_array::{ArrayRef, FixedSizeListArray, PrimitiveArray, RecordBatch};
use arrow_buffer::{Buffer, MutableBuffer, ScalarBuffer, ToByteSlice};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::dtype::{DType, Element, Scalar};
use crate::error::Result;
use crate::fields::{ProjectedColumn, Projection};
use crate::pool::BufferPool;

/// A fixed-length run of elements in memory aligned as Arrow recommends (64 bytes or more).
///
/// A `Vec<T>` is only aligned to `T`. Consumers that can alias host memory, such as JAX's CPU
/// client, copy a batch whose columns do not start on an aligned address and view one that
/// does, so batches are built in Arrow's own allocations.
///
/// A buffer taken from a [`BufferPool`] goes back to it when dropped, or, once moved into an
/// Arrow array, when the last array using it is dropped (in whichever thread that happens).
pub struct Aligned<T: Element> {
    buffer: MutableBuffer,
    pool: Option<Arc<BufferPool>>,
    elements: PhantomData<T>,
}

impl<T: Element> Aligned<T> {
    /// `len` copies of `value`.
    pub fn filled(value: T, len: usize) -> Self {
        Self::filled_from(None, value, len)
    }

    /// `len` copies of `value`, in a buffer from `pool` when one is given.
    pub fn filled_from(pool: Option<&Arc<BufferPool>>, value: T, len: usize) -> Self {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("column sizes are checked against the memory bound first");
        let pool = pool.filter(|_| bytes > 0);
        let zero = value.to_byte_slice().iter().all(|&b| b == 0);
        // Zeroed memory comes from the allocator already cleared (as `vec![0; n]` does); a
        // pooled buffer is cleared only when zeros are what it is to hold, since any other
        // value is written over every element anyway.
        let mut buffer = match pool {
            Some(pool) if zero => pool.take(bytes),
            Some(pool) => pool.take_dirty(bytes),
            None => MutableBuffer::from_len_zeroed(bytes),
        };
        if !zero {
            buffer.typed_data_mut::<T>().fill(value);
        }
        Aligned {
            buffer,
            pool: pool.cloned(),
            elements: PhantomData,
        }
    }

    /// `len` elements whose values are undefined (a previous batch's, or zeros), for a caller
    /// that writes every one of them: a buffer from `pool` is not cleared first.
    pub fn dirty_from(pool: &Arc<BufferPool>, len: usize) -> Self {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("column sizes are checked against the memory bound first");
        if bytes == 0 {
            return Self::filled(T::default(), 0);
        }
        Aligned {
            buffer: pool.take_dirty(bytes),
            pool: Some(pool.clone()),
            elements: PhantomData,
        }
    }

    /// Moves the elements into an Arrow buffer without copying them.
    pub fn into_scalar_buffer(mut self) -> ScalarBuffer<T> {
        let len = self.len();
        let buffer = std::mem::take(&mut self.buffer);
        let buffer = match self.pool.take() {
            None => Buffer::from(buffer),
            // `Bytes::from_owner` keeps the buffer, unmoved, until the last array is dropped.
            Some(pool) => Buffer::from(bytes::Bytes::from_owner(Lent {
                buffer: Some(buffer),
                pool,
            })),
        };
        ScalarBuffer::new(buffer, 0, len)
    }
}

impl<T: Element> Drop for Aligned<T> {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give(std::mem::take(&mut self.buffer));
        }
    }
}

/// A pooled buffer lent to Arrow arrays: back to its pool when the last of them is dropped.
struct Lent {
    buffer: Option<MutableBuffer>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref().map_or(&[], |b| b.as_slice())
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.pool.give(buffer);
        }
    }
}

impl<T: Element> From<&[T]> for Aligned<T> {
    fn from(values: &[T]) -> Self {
        let mut buffer = MutableBuffer::with_capacity(std::mem::size_of_val(values));
        buffer.extend_from_slice(values);
        Aligned {
            buffer,
            pool: None,
            elements: PhantomData,
        }
    }
}

impl<T: Element> Deref for Aligned<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.buffer.typed_data()
    }
}

impl<T: Element> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.buffer.typed_data_mut()
    }
}

impl<T: Element> Clone for Aligned<T> {
    fn clone(&self) -> Self {
        Self::from(&self[..])
    }
}

impl<T: Element + std::fmt::Debug> std::fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// One column's elements, typed by the field's dtype.
#[derive(Debug, Clone)]
pub enum ColumnBuf {
    /// `i32` elements.
    I32(Aligned<i32>),
    /// `i64` elements.
    I64(Aligned<i64>),
    /// `f32` elements.
    F32(Aligned<f32>),
    /// `f64` elements.
    F64(Aligned<f64>),
    /// `bool` elements as 0/1.
    Bool(Aligned<u8>),
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

fn filled<T: Element>(pool: Option<&Arc<BufferPool>>, pad: Scalar, len: usize) -> Aligned<T> {
    Aligned::filled_from(pool, pad.element(), len)
}

impl ColumnBuf {
    /// A buffer of `rows` rows, every element set to the column's pad.
    pub fn padded(column: &ProjectedColumn, rows: usize) -> Self {
        Self::padded_from(None, column, rows)
    }

    /// [`ColumnBuf::padded`], in a buffer from `pool` when one is given.
    pub fn padded_from(
        pool: Option<&Arc<BufferPool>>,
        column: &ProjectedColumn,
        rows: usize,
    ) -> Self {
        let len = rows * column.width;
        match column.dtype {
            DType::I32 => ColumnBuf::I32(filled(pool, column.pad, len)),
            DType::I64 => ColumnBuf::I64(filled(pool, column.pad, len)),
            DType::F32 => ColumnBuf::F32(filled(pool, column.pad, len)),
            DType::F64 => ColumnBuf::F64(filled(pool, column.pad, len)),
            DType::Bool | DType::U8 => ColumnBuf::Bool(filled(pool, column.pad, len)),
        }
    }

    /// A buffer of `rows` rows whose values are undefined, for a caller that writes every
    /// element (see [`Aligned::dirty_from`]).
    pub fn dirty_from(pool: &Arc<BufferPool>, column: &ProjectedColumn, rows: usize) -> Self {
        let len = rows * column.width;
        match column.dtype {
            DType::I32 => ColumnBuf::I32(Aligned::dirty_from(pool, len)),
            DType::I64 => ColumnBuf::I64(Aligned::dirty_from(pool, len)),
            DType::F32 => ColumnBuf::F32(Aligned::dirty_from(pool, len)),
            DType::F64 => ColumnBuf::F64(Aligned::dirty_from(pool, len)),
            DType::Bool | DType::U8 => ColumnBuf::Bool(Aligned::dirty_from(pool, len)),
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

    /// Sets element `index` of an integer or bool column (synthetic columns are scalar
    /// integers, the validation mask a scalar bool).
    pub fn set_int(&mut self, index: usize, value: i64) {
        match self {
            ColumnBuf::I32(v) => v[index] = value as i32,
            ColumnBuf::I64(v) => v[index] = value,
            ColumnBuf::Bool(v) => v[index] = u8::from(value != 0),
            _ => unreachable!("synthetic columns are integers or the bool mask"),
        }
    }

    /// Element `index` of an integer or bool column as an `i64`.
    pub fn int_at(&self, index: usize) -> i64 {
        match self {
            ColumnBuf::I32(v) => i64::from(v[index]),
            ColumnBuf::I64(v) => v[index],
            ColumnBuf::Bool(v) => i64::from(v[index]),
            // Not read as integers: a float is never a token, a mask or a target.
            ColumnBuf::F32(_) | ColumnBuf::F64(_) => 0,
        }
    }

    /// Sets elements `range` of an integer column to `value` (a token stage's window columns).
    pub fn fill_int(&mut self, range: std::ops::Range<usize>, value: i64) {
        match self {
            ColumnBuf::I32(v) => v[range].fill(value as i32),
            ColumnBuf::I64(v) => v[range].fill(value),
            _ => unreachable!("window columns are i32 or i64 (checked with the config)"),
        }
    }

    /// Sets elements `range` to `pad`.
    pub fn fill_pad(&mut self, range: std::ops::Range<usize>, pad: Scalar) {
        with_column!(self, v => v[range].fill(pad.element()));
    }

    /// Sets row `row` (`width` elements) to zero: a validation pass's padding rows are zeros,
    /// whatever the field's pad.
    pub fn zero_row(&mut self, row: usize, width: usize) {
        let range = row * width..(row + 1) * width;
        with_column!(self, v => v[range].fill(Default::default()));
    }

    /// Copies row `src_row` of `src` (rows of `width` elements) into row `dst_row` of this
    /// column (rows of `dst_width`), from its element `offset`: a stack's part fills its entry.
    pub fn copy_row_into(
        &mut self,
        (dst_row, dst_width, offset): (usize, usize, usize),
        src: &ColumnBuf,
        src_row: usize,
        width: usize,
    ) {
        fn copy<T: Copy>(a: &mut [T], b: &[T], (d, s, n): (usize, usize, usize)) {
            a[d..d + n].copy_from_slice(&b[s..s + n]);
        }
        let at = (dst_row * dst_width + offset, src_row * width, width);
        match (self, src) {
            (ColumnBuf::I32(a), ColumnBuf::I32(b)) => copy(a, b, at),
            (ColumnBuf::I64(a), ColumnBuf::I64(b)) => copy(a, b, at),
            (ColumnBuf::F32(a), ColumnBuf::F32(b)) => copy(a, b, at),
            (ColumnBuf::F64(a), ColumnBuf::F64(b)) => copy(a, b, at),
            (ColumnBuf::Bool(a), ColumnBuf::Bool(b)) => copy(a, b, at),
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

fn primitive<T: Element>(values: Aligned<T>) -> ArrayRef {
    Arc::new(PrimitiveArray::<T::Arrow>::new(
        values.into_scalar_buffer(),
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
        DType::Bool | DType::U8 => DataType::UInt8,
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

    /// A chunk of `rows` rows whose values are undefined, its buffers from `pool`, for a
    /// reader that writes every element of every row it hands over (see
    /// [`ColumnBuf::dirty_from`]).
    pub fn dirty_from(pool: &Arc<BufferPool>, projection: &Projection, rows: usize) -> Self {
        Chunk {
            rows,
            columns: projection
                .columns
                .iter()
                .map(|c| ColumnBuf::dirty_from(pool, c, rows))
                .collect(),
        }
    }

    /// Sets row `row` of every column to zero.
    pub fn zero_row(&mut self, projection: &Projection, row: usize) {
        for (buf, column) in self.columns.iter_mut().zip(&projection.columns) {
            buf.zero_row(row, column.width);
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

/// A projection of fields named as their sources, each `(name, dtype, shape)`, padded with 0.
#[cfg(test)]
pub fn test_projection(specs: &[(&str, crate::dtype::DType, Vec<usize>)]) -> Projection {
    let fields: Vec<crate::config::FieldSpec> = specs
        .iter()
        .map(|(n, d, s)| crate::config::FieldSpec {
            overflow: crate::config::Overflow::Truncate,
            pad_side: crate::config::PadSide::Right,
            name: (*n).to_owned(),
            source: (*n).into(),
            dtype: *d,
            shape: s.clone(),
            pad: serde_json::Value::from(0),
        })
        .collect();
    Projection::new(&fields).expect("a valid test projection")
}

/// Buffers for one row of `p`'s columns holding junk, which projection must overwrite whole.
#[cfg(test)]
pub fn junk_row(p: &Projection) -> Vec<ColumnBuf> {
    p.columns
        .iter()
        .map(|c| {
            let mut buf = ColumnBuf::padded(c, 1);
            buf.fill_pad(0..c.width, crate::dtype::Scalar::Int(99));
            buf
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FieldSpec;
    use arrow_array::Array;

    #[test]
    fn a_pooled_buffer_holds_its_fill_whatever_it_held_before() {
        let pool = BufferPool::new(1 << 20);
        drop(Aligned::<i32>::filled_from(Some(&pool), 7, 1000));
        let padded = Aligned::<i32>::filled_from(Some(&pool), -1, 1000);
        assert!(padded.iter().all(|&v| v == -1));
        drop(padded);
        let zeros = Aligned::<i32>::filled_from(Some(&pool), 0, 1000);
        assert!(zeros.iter().all(|&v| v == 0));
    }

    fn column(shape: Vec<usize>) -> ProjectedColumn {
        let spec = FieldSpec {
            overflow: crate::config::Overflow::Truncate,
            pad_side: crate::config::PadSide::Right,
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
        let buf = ColumnBuf::I32(Aligned::from(&[1, 2, 3, 4, 5, 6][..]));
        let ptr = with_column!(&buf, v => v.as_ptr().cast::<u8>());
        let arr = buf.into_arrow(&c);
        let list = arr.as_any().downcast_ref::<FixedSizeListArray>().unwrap();
        assert_eq!(list.values().to_data().buffers()[0].as_ptr(), ptr);
    }

    #[test]
    fn a_pooled_column_goes_back_to_its_pool_when_its_array_is_dropped() {
        let c = column(vec![4]);
        let pool = BufferPool::new(1 << 20);
        let buf = ColumnBuf::padded_from(Some(&pool), &c, 8);
        let ptr = with_column!(&buf, v => v.as_ptr().cast::<u8>());
        let arr = buf.into_arrow(&c);
        let list = arr.as_any().downcast_ref::<FixedSizeListArray>().unwrap();
        assert_eq!(list.values().to_data().buffers()[0].as_ptr(), ptr);
        assert_eq!(pool.held(), (128, 0));
        drop(arr);
        assert_eq!(pool.held(), (0, 128));
        // Taken again, padded again: the pad of the next request, not the old contents.
        let again = ColumnBuf::padded_from(Some(&pool), &c, 8);
        let ColumnBuf::I32(values) = &again else {
            panic!("an i32 column")
        };
        assert_eq!(values.as_ptr().cast::<u8>(), ptr);
        assert!(values.iter().all(|&x| x == -1));
        drop(again);
        assert_eq!(pool.held(), (0, 128));
    }

    #[test]
    fn every_column_starts_on_an_arrow_aligned_address() {
        for rows in [1, 3, 7, 100] {
            for shape in [vec![1], vec![3], vec![5, 7]] {
                let buf = ColumnBuf::padded(&column(shape), rows);
                let address = with_column!(&buf, v => v.as_ptr() as usize);
                assert_eq!(address % 64, 0);
                let ColumnBuf::I32(values) = &buf else {
                    panic!("an i32 column")
                };
                assert!(values.iter().all(|&x| x == -1));
            }
        }
    }

    #[test]
    fn filled_buffers_hold_the_exact_pad_bits() {
        assert!(Aligned::filled(0i64, 9).iter().all(|&x| x == 0));
        assert!(Aligned::filled(7u8, 65).iter().all(|&x| x == 7));
        // -0.0 == 0.0, but a pad of -0.0 must not come out as +0.0.
        let negative_zero = Aligned::filled(-0.0f32, 5);
        assert!(negative_zero
            .iter()
            .all(|x| x.to_bits() == (-0.0f32).to_bits()));
        assert!(Aligned::filled(0.5f64, 0).is_empty());
    }
}
