//! Whole records in and out: `_core.ShardRecords` reads a shard of any encoding for
//! `iter_shard`, and `_core.write_shard` writes one for the dataset saver. Python objects and
//! the engine's record values convert here, in one place.

use std::sync::Mutex;

use arrow_pyarrow::{FromPyArrow, Table, ToPyArrow};
use o41_engine::cancel::Cancel;
use o41_engine::encoding::Encoding;
use o41_engine::formats::{
    write_shard as engine_write_shard, Record, RecordChunk, ShardData,
    ShardRecords as EngineRecords, Value,
};
use o41_engine::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMapping, PyString, PyTuple,
};

use crate::blocking::{blocking, blocking_with};
use crate::errors::to_py;
use crate::storage::{engine, Storage};

/// The records of one shard, in order, in chunks, decoded by the engine.
#[pyclass(module = "o41_training_data._core")]
pub struct ShardRecords {
    inner: Mutex<EngineRecords>,
    /// The flag the reader's storage obeys: Ctrl-C in any call stops its reads.
    cancel: Cancel,
}

#[pymethods]
impl ShardRecords {
    #[new]
    #[pyo3(signature = (path, encoding, storage=None, chunk_rows=1024))]
    fn new(
        py: Python<'_>,
        path: &str,
        encoding: &str,
        storage: Option<&Storage>,
        chunk_rows: usize,
    ) -> PyResult<Self> {
        let storage = engine(storage);
        let cancel = Cancel::new();
        let inner = blocking_with(py, &cancel, |cancel| {
            let encoding = Encoding::parse(encoding, "data_format")?;
            EngineRecords::open(
                &storage.with_cancel(cancel.clone()),
                path,
                encoding,
                chunk_rows,
            )
        })?;
        Ok(ShardRecords {
            inner: Mutex::new(inner),
            cancel,
        })
    }

    /// The next records as a list of dicts (JSON Lines, `MessagePack`) or a
    /// `pyarrow.RecordBatch` (Parquet); None at the end of the shard.
    fn next_chunk<'py>(
        &self,
        py: Python<'py>,
        max_rows: usize,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let mut reader = self
            .inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("the shard reader's lock is poisoned"))?;
        let reader = &mut *reader;
        let chunk = blocking_with(py, &self.cancel, |_| reader.next_chunk(max_rows))?;
        match chunk {
            None => Ok(None),
            Some(RecordChunk::Arrow(batch)) => Ok(Some(batch.to_pyarrow(py)?)),
            Some(RecordChunk::Records(records)) => {
                let list = PyList::empty(py);
                for record in &records {
                    list.append(dict_of(py, record)?)?;
                }
                Ok(Some(list.into_any()))
            }
        }
    }
}

fn dict_of<'py>(py: Python<'py>, record: &Record) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (key, value) in record {
        dict.set_item(key, object_of(py, value)?)?;
    }
    Ok(dict)
}

fn object_of<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::UInt(u) => u.into_pyobject(py)?.into_any(),
        Value::Float(f) => PyFloat::new(py, *f).into_any(),
        Value::Str(s) => PyString::new(py, s).into_any(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        Value::List(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(object_of(py, item)?)?;
            }
            list.into_any()
        }
        Value::Map(fields) => dict_of(py, fields)?.into_any(),
    })
}

/// A value refused while converting, with its path in the record.
struct Refused {
    at: String,
    message: String,
}

fn value_of(object: &Bound<'_, PyAny>, at: &str) -> Result<Value, Refused> {
    let refuse = |message: String| Refused {
        at: at.to_owned(),
        message,
    };
    // bool before int: Python's bool is an int.
    if let Ok(b) = object.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if object.is_instance_of::<PyInt>() {
        if let Ok(i) = object.extract::<i64>() {
            return Ok(Value::Int(i));
        }
        return object
            .extract::<u64>()
            .map(Value::UInt)
            .map_err(|_| refuse(format!("integer {object} does not fit in 64 bits")));
    }
    if let Ok(f) = object.cast::<PyFloat>() {
        return Ok(Value::Float(f.value()));
    }
    if let Ok(s) = object.cast::<PyString>() {
        return s
            .to_str()
            .map(|s| Value::Str(s.to_owned()))
            .map_err(|e| refuse(e.to_string()));
    }
    if let Ok(b) = object.cast::<PyBytes>() {
        return Ok(Value::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(b) = object.cast::<PyByteArray>() {
        return Ok(Value::Bytes(b.to_vec()));
    }
    if object.is_none() {
        return Ok(Value::Null);
    }
    if object.is_instance_of::<PyList>() || object.is_instance_of::<PyTuple>() {
        let mut items = Vec::new();
        for (i, item) in object
            .try_iter()
            .map_err(|e| refuse(e.to_string()))?
            .enumerate()
        {
            let item = item.map_err(|e| refuse(e.to_string()))?;
            items.push(value_of(&item, &format!("{at}[{i}]"))?);
        }
        return Ok(Value::List(items));
    }
    if let Ok(mapping) = object.cast::<PyMapping>() {
        return fields_of(mapping, at).map(Value::Map);
    }
    let kind = object
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string());
    Err(refuse(format!("values of type {kind} cannot be saved")))
}

fn fields_of(mapping: &Bound<'_, PyMapping>, at: &str) -> Result<Record, Refused> {
    let refuse = |message: String| Refused {
        at: at.to_owned(),
        message,
    };
    let items = mapping.items().map_err(|e| refuse(e.to_string()))?;
    let mut fields = Vec::with_capacity(items.len());
    for item in items.iter() {
        let (key, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
            item.extract().map_err(|e: PyErr| refuse(e.to_string()))?;
        let key: String = key
            .extract()
            .map_err(|_| refuse(format!("map key {key} is not a string")))?;
        let path = if at.is_empty() {
            key.clone()
        } else {
            format!("{at}.{key}")
        };
        fields.push((key, value_of(&value, &path)?));
    }
    Ok(fields)
}

fn records_of(path: &str, records: &Bound<'_, PyAny>) -> Result<Vec<Record>, Error> {
    let refused = |row: usize, field: Option<String>, message: String| Error::Data {
        path: path.to_owned(),
        row: Some(row as u64),
        field,
        message,
    };
    let mut out = Vec::new();
    let items = records.try_iter().map_err(|e| Error::Data {
        path: path.to_owned(),
        row: None,
        field: None,
        message: format!("records must be an iterable of mappings: {e}"),
    })?;
    for (row, record) in items.enumerate() {
        let record = record.map_err(|e| refused(row, None, e.to_string()))?;
        let Ok(mapping) = record.cast::<PyMapping>() else {
            let kind = record
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string());
            return Err(refused(
                row,
                None,
                format!("expected a mapping of fields, got {kind}"),
            ));
        };
        out.push(fields_of(mapping, "").map_err(|r| {
            let field = (!r.at.is_empty()).then_some(r.at);
            refused(row, field, r.message)
        })?);
    }
    Ok(out)
}

/// Writes the local file `path` in `encoding` from `records` (an iterable of mappings, for
/// JSON Lines and `MessagePack`) or `table` (an Arrow table or stream, for Parquet); errors call
/// the shard `name` (default `path`). Returns its size in bytes and hex SHA-256.
#[pyfunction]
#[pyo3(signature = (path, encoding, *, records=None, table=None, name=None))]
pub fn write_shard(
    py: Python<'_>,
    path: &str,
    encoding: &str,
    records: Option<&Bound<'_, PyAny>>,
    table: Option<&Bound<'_, PyAny>>,
    name: Option<&str>,
) -> PyResult<(u64, String)> {
    let name = name.unwrap_or(path);
    let encoding = Encoding::parse(encoding, "data_format").map_err(|e| to_py(py, &e))?;
    let written = if let Some(table) = table {
        let (batches, schema) = Table::from_pyarrow_bound(table)?.into_inner();
        blocking(py, |_| {
            engine_write_shard(
                path,
                name,
                encoding,
                ShardData::Arrow {
                    schema,
                    batches: &batches,
                },
            )
        })?
    } else {
        let records = match records {
            Some(records) => records_of(name, records).map_err(|e| to_py(py, &e))?,
            None => Vec::new(),
        };
        blocking(py, |_| {
            engine_write_shard(path, name, encoding, ShardData::Records(&records))
        })?
    };
    Ok((written.bytes, written.sha256))
}
