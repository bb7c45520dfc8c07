//! `MosaicML` MDS shards (`streaming`'s `MDSWriter`, llm-foundry's corpora), read in place
//! (`docs/corpora.md`).
//!
//! A dataset is a directory: `index.json` (version 2) lists each shard's columns, their
//! encodings, its sample count, and its file, raw or compressed as a whole. A raw shard is a
//! sample count, a table of sample offsets and the samples; a sample is the sizes of its
//! variable-size columns, then every column's bytes. Counts come from `index.json` alone and are
//! checked against a shard's own header when it is read. A raw shard is read by byte ranges; a
//! compressed one is read and inflated whole by the reader that needs it, held to the size
//! `index.json` gives.

use std::io::{Read, Write};
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::IntoDeserializer;
use serde::Deserialize;

use super::format::{
    EachRecord, EachTokens, RecordInspection, RecordSource, ShardFormat, TokenRecords,
};
use super::value::{Record, Value};
use super::{PageCache, ReadFailure, ShardData, ShardIndex, ShardMeta, ShardReader};
use crate::columns::Chunk;
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::record::project_record;
use crate::storage::{sibling, Object, Pin, Storage};

/// The file that describes an MDS dataset.
pub const INDEX_FILE: &str = "index.json";
/// An `index.json` larger than this is not one.
const MAX_INDEX_BYTES: u64 = 256 << 20;

fn malformed(path: &str, row: Option<u64>, message: String) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: Encoding::Mds.name(),
        row,
        message,
    }
}

fn unsupported(path: &str, message: String) -> Error {
    Error::Unsupported {
        path: path.to_owned(),
        encoding: Encoding::Mds.name(),
        message,
    }
}

/// `index.json`.
#[derive(Debug, Deserialize)]
struct IndexFile {
    version: u64,
    shards: Vec<ShardInfo>,
}

/// One shard as `index.json` lists it.
#[derive(Debug, Clone, Deserialize)]
struct ShardInfo {
    format: String,
    #[serde(default)]
    column_names: Vec<String>,
    #[serde(default)]
    column_encodings: Vec<String>,
    #[serde(default)]
    column_sizes: Vec<Option<u64>>,
    #[serde(default)]
    compression: Option<String>,
    raw_data: FileInfo,
    #[serde(default)]
    zip_data: Option<FileInfo>,
    samples: u64,
}

#[derive(Debug, Clone, Deserialize)]
struct FileInfo {
    basename: String,
    bytes: u64,
}

impl ShardInfo {
    /// The file a stream reads: the compressed one where there is one.
    fn file(&self) -> &FileInfo {
        match (&self.compression, &self.zip_data) {
            (Some(_), Some(zip)) => zip,
            _ => &self.raw_data,
        }
    }
}

/// Reads the `index.json` of the dataset directory `dir`.
fn read_index(storage: &Storage, dir: &str) -> Result<(String, IndexFile)> {
    let path = format!("{}/{INDEX_FILE}", dir.trim_end_matches('/'));
    let object = storage.open(&path)?;
    if object.size() > MAX_INDEX_BYTES {
        return Err(malformed(
            &path,
            None,
            format!("{} bytes is not an MDS index.json", object.size()),
        ));
    }
    let bytes = object.read_range(0..object.size())?;
    let index: IndexFile = serde_json::from_slice(&bytes)
        .map_err(|e| malformed(&path, None, format!("not an MDS index.json: {e}")))?;
    if index.version != 2 {
        return Err(unsupported(
            &path,
            format!(
                "index version {}; MDS index version 2 is read",
                index.version
            ),
        ));
    }
    Ok((path, index))
}

/// A file name `index.json` gives: relative, inside the dataset's directory.
fn check_basename<'a>(index_path: &str, name: &'a str) -> Result<&'a str> {
    let inside = !name.is_empty()
        && !name.starts_with('/')
        && name.split('/').all(|part| !matches!(part, "" | "." | ".."));
    if inside {
        Ok(name)
    } else {
        Err(malformed(
            index_path,
            None,
            format!("shard file '{name}' is not a file inside the dataset's directory"),
        ))
    }
}

/// The shard files of the MDS dataset in directory `dir`, in its `index.json`'s order.
pub fn dataset_files(storage: &Storage, dir: &str, option: &str) -> Result<Vec<String>> {
    let (index_path, index) = read_index(storage, dir).map_err(|e| match e {
        Error::NotFound { path } => Error::config(
            option,
            format!(
                "{path} does not exist: {dir} is neither an MDS shard nor an MDS dataset directory"
            ),
        ),
        other => other,
    })?;
    if index.shards.is_empty() {
        return Err(Error::config(
            option,
            format!("{index_path} lists no shards"),
        ));
    }
    index
        .shards
        .iter()
        .map(|shard| {
            if shard.format != "mds" {
                return Err(unsupported(
                    &index_path,
                    format!(
                        "its shards are '{}' shards; MDS shards are read",
                        shard.format
                    ),
                ));
            }
            let name = check_basename(&index_path, &shard.file().basename)?;
            Ok(sibling(&index_path, name))
        })
        .collect()
}

/// How one column's bytes become a value.
#[derive(Debug, Clone, PartialEq)]
enum Column {
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
enum Elem {
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
    fn of(encoding: &str) -> Column {
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
    fn fixed_size(&self) -> Option<u64> {
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
    fn decode(&self, data: &[u8]) -> std::result::Result<Value, String> {
        match self {
            Column::Number(e) if data.len() == e.width() => Ok(e.value(data)),
            Column::Int if data.len() == 8 => Ok(Elem::I64.value(data)),
            Column::Number(_) | Column::Int => Err(format!("{} bytes for a number", data.len())),
            Column::Str => std::str::from_utf8(data)
                .map(|s| Value::Str(s.to_owned()))
                .map_err(|e| format!("text that is not UTF-8: {e}")),
            Column::Bytes => Ok(Value::Bytes(data.to_vec())),
            Column::Json => super::value::json_value(data),
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

/// What inspection learnt of a shard: its entry in `index.json`, decoded.
#[derive(Debug)]
pub struct MdsIndex {
    info: ShardInfo,
    columns: Vec<Column>,
}

/// Finds the shard `object` in the `index.json` beside it and checks its entry.
fn inspect_index(storage: &Storage, object: &Object) -> Result<MdsIndex> {
    let path = object.uri();
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    let (index_path, index) = read_index(storage, dir).map_err(|e| match e {
        Error::NotFound { path: missing } => malformed(
            path,
            None,
            format!("an MDS shard is described by {missing}, which does not exist"),
        ),
        other => other,
    })?;
    let info = index
        .shards
        .into_iter()
        .find(|s| s.file().basename.rsplit('/').next() == Some(name))
        .ok_or_else(|| {
            malformed(
                &index_path,
                None,
                format!("it does not list {name}, so its columns and count are unknown"),
            )
        })?;
    let bad = |message: String| malformed(&index_path, None, format!("{name}: {message}"));
    if info.format != "mds" {
        return Err(unsupported(
            path,
            format!("a '{}' shard; MDS shards are read", info.format),
        ));
    }
    let n = info.column_names.len();
    if info.column_encodings.len() != n || info.column_sizes.len() != n {
        return Err(bad(format!(
            "{n} column names, {} encodings and {} sizes",
            info.column_encodings.len(),
            info.column_sizes.len()
        )));
    }
    let columns: Vec<Column> = info
        .column_encodings
        .iter()
        .map(|e| Column::of(e))
        .collect();
    for (k, column) in columns.iter().enumerate() {
        if let (Some(fixed), Some(listed)) = (column.fixed_size(), info.column_sizes[k]) {
            if fixed != listed {
                return Err(bad(format!(
                    "column '{}' ({}) is listed as {listed} bytes; its encoding takes {fixed}",
                    info.column_names[k], info.column_encodings[k]
                )));
            }
        }
    }
    if info.file().bytes != object.size() {
        return Err(bad(format!(
            "listed as {} bytes; the file holds {}",
            info.file().bytes,
            object.size()
        )));
    }
    if let Some(codec) = &info.compression {
        codec_of(path, codec)?;
        if info.zip_data.is_none() {
            return Err(bad(format!(
                "compressed with {codec}, but no compressed file is listed"
            )));
        }
    }
    Ok(MdsIndex { info, columns })
}

/// The codecs `streaming` compresses shards with (`zstd`, `zstd:7`, `gz`, `br`, `snappy`).
#[derive(Debug, Clone, Copy)]
enum Codec {
    Zstd,
    Gzip,
    Brotli,
    Snappy,
}

fn codec_of(path: &str, name: &str) -> Result<Codec> {
    match name.split(':').next().unwrap_or("") {
        "zstd" => Ok(Codec::Zstd),
        "gz" => Ok(Codec::Gzip),
        "br" => Ok(Codec::Brotli),
        "snappy" => Ok(Codec::Snappy),
        _ => Err(unsupported(
            path,
            format!("it is compressed with '{name}', a codec this build does not read (zstd, gz, br and snappy are)"),
        )),
    }
}

/// Inflates a whole shard compressed with `codec` to exactly `raw` bytes.
fn inflate(path: &str, codec: Codec, data: &[u8], raw: u64) -> Result<Vec<u8>> {
    let bad = |message: String| malformed(path, None, message);
    let mut out = Vec::new();
    let read = |reader: &mut dyn Read, out: &mut Vec<u8>| {
        reader
            .take(raw + 1)
            .read_to_end(out)
            .map_err(|e| bad(format!("it does not inflate: {e}")))
    };
    match codec {
        Codec::Zstd => {
            let mut decoder = zstd::stream::read::Decoder::new(data)
                .map_err(|e| bad(format!("it does not inflate: {e}")))?;
            read(&mut decoder, &mut out)?;
        }
        Codec::Gzip => {
            read(&mut flate2::read::MultiGzDecoder::new(data), &mut out)?;
        }
        Codec::Brotli => {
            read(&mut brotli::Decompressor::new(data, 4096), &mut out)?;
        }
        Codec::Snappy => {
            let len = snap::raw::decompress_len(data)
                .map_err(|e| bad(format!("it does not inflate: {e}")))?;
            if len as u64 != raw {
                return Err(bad(format!(
                    "it inflates to {len} bytes; index.json says {raw}"
                )));
            }
            out = snap::raw::Decoder::new()
                .decompress_vec(data)
                .map_err(|e| bad(format!("it does not inflate: {e}")))?;
        }
    }
    if out.len() as u64 != raw {
        return Err(bad(format!(
            "it inflates to {}{} bytes; index.json says {raw}",
            if out.len() as u64 > raw {
                "more than "
            } else {
                ""
            },
            out.len().min(raw as usize)
        )));
    }
    Ok(out)
}

/// MDS shards.
pub struct Mds;

impl ShardFormat for Mds {
    fn encoding(&self) -> Encoding {
        Encoding::Mds
    }

    fn reads_tokens(&self) -> bool {
        true
    }

    fn token_records(
        &self,
        storage: &Storage,
        object: &Arc<Object>,
        field: &str,
    ) -> Result<Option<Arc<dyn TokenRecords>>> {
        let index = Arc::new(inspect_index(storage, object)?);
        let column = index
            .info
            .column_names
            .iter()
            .position(|name| name == field)
            .ok_or_else(|| Error::Projection {
                path: object.uri().to_owned(),
                row: 0,
                field: field.to_owned(),
                source_field: field.to_owned(),
                message: format!(
                    "the shard has no such column (its columns: {})",
                    index.info.column_names.join(", ")
                ),
            })?;
        Ok(Some(Arc::new(MdsTokens { index, column })))
    }

    fn inspect(&self, object: Arc<Object>, how: RecordInspection<'_>) -> Result<ShardMeta> {
        let index = Arc::new(inspect_index(how.storage, &object)?);
        for column in &how.projection.columns {
            if !index.info.column_names.contains(&column.source) {
                return Err(Error::Projection {
                    path: object.uri().to_owned(),
                    row: 0,
                    field: column.name.clone(),
                    source_field: column.source.clone(),
                    message: format!(
                        "the shard has no such column (its columns: {})",
                        index.info.column_names.join(", ")
                    ),
                });
            }
        }
        let rows = index.info.samples;
        let raw = index.info.raw_data.bytes;
        let compressed = index.info.compression.is_some();
        if how.first_record && rows > 0 {
            let mut reader = SampleReader::new(object.clone(), index.clone());
            let mut chunk = Chunk::padded(how.projection, 1);
            reader.project(0..1, how.projection, &mut chunk, 0)?;
        }
        Ok(ShardMeta {
            rows,
            // A raw shard's job reads at most the whole shard; a compressed one holds it
            // inflated beside its compressed bytes.
            scratch_bytes: raw + if compressed { object.size() } else { 0 },
            pin: Pin::default(),
            longest_record: 0,
            index,
        })
    }

    fn records(
        &self,
        storage: &Storage,
        object: Arc<Object>,
        _chunk_rows: usize,
    ) -> Result<Box<dyn RecordSource>> {
        let index = Arc::new(inspect_index(storage, &object)?);
        let reader = SampleReader::new(object, index);
        Ok(Box::new(EachRecord::new(reader, SampleReader::next_record)))
    }

    fn write(&self, _out: &mut (dyn Write + Send), _data: ShardData<'_>, name: &str) -> Result<()> {
        Err(Error::config(
            "data_format",
            format!(
                "{name}: MDS shards are read in place, not written by the dataset saver; save \
                 as parquet"
            ),
        ))
    }
}

impl ShardIndex for MdsIndex {
    fn open(
        self: Arc<Self>,
        object: Arc<Object>,
        _meta: &ShardMeta,
        _pages: Option<&Arc<PageCache>>,
    ) -> Result<Box<dyn ShardReader>> {
        Ok(Box::new(SampleReader::new(object, self)))
    }
}

/// Reads a shard's samples.
struct SampleReader {
    object: Arc<Object>,
    index: Arc<MdsIndex>,
    /// A compressed shard, inflated once.
    inflated: Option<Bytes>,
    /// Whether the shard's own sample count was checked against `index.json`.
    checked: bool,
    next: u64,
}

impl SampleReader {
    fn new(object: Arc<Object>, index: Arc<MdsIndex>) -> Self {
        SampleReader {
            object,
            index,
            inflated: None,
            checked: false,
            next: 0,
        }
    }

    fn path(&self) -> &str {
        self.object.uri()
    }

    /// Bytes `range` of the raw shard.
    fn raw(&mut self, range: Range<u64>) -> Result<Bytes> {
        let raw_len = self.index.info.raw_data.bytes;
        if range.end > raw_len || range.start > range.end {
            return Err(malformed(
                self.path(),
                None,
                format!(
                    "bytes {}..{} of a {raw_len}-byte shard",
                    range.start, range.end
                ),
            ));
        }
        if let Some(codec) = &self.index.info.compression {
            if self.inflated.is_none() {
                let codec = codec_of(self.path(), codec)?;
                let data = self.object.read_range(0..self.object.size())?;
                let inflated = inflate(self.path(), codec, &data, raw_len)?;
                self.inflated = Some(Bytes::from(inflated));
            }
            let all = self.inflated.as_ref().expect("inflated above");
            return Ok(all.slice(range.start as usize..range.end as usize));
        }
        self.object.read_range(range)
    }

    /// The samples `rows`: their bytes, and where each starts in them (then the end).
    fn samples(&mut self, rows: Range<u64>) -> Result<(Bytes, Vec<u64>)> {
        let samples = self.index.info.samples;
        if !self.checked {
            let head = self.raw(0..4)?;
            let n = u64::from(u32::from_le_bytes([head[0], head[1], head[2], head[3]]));
            if n != samples {
                return Err(malformed(
                    self.path(),
                    None,
                    format!("the shard holds {n} samples; index.json says {samples}"),
                ));
            }
            self.checked = true;
        }
        if rows.end > samples {
            return Err(malformed(
                self.path(),
                Some(rows.end - 1),
                format!("the shard has {samples} samples"),
            ));
        }
        let table = self.raw(4 + 4 * rows.start..4 + 4 * (rows.end + 1))?;
        let offsets: Vec<u64> = table
            .chunks_exact(4)
            .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect();
        let floor = 4 + 4 * (samples + 1);
        for (k, w) in offsets.windows(2).enumerate() {
            if w[0] < floor || w[1] < w[0] {
                return Err(malformed(
                    self.path(),
                    Some(rows.start + k as u64),
                    format!("sample offsets {}..{} are not a sample's bytes", w[0], w[1]),
                ));
            }
        }
        let (first, last) = (offsets[0], offsets[offsets.len() - 1]);
        let bytes = self.raw(first..last)?;
        Ok((bytes, offsets.iter().map(|o| o - first).collect()))
    }

    /// Sample `row` (its `bytes`) as a record of the columns `wanted` selects.
    fn record(&self, bytes: &[u8], row: u64, wanted: &dyn Fn(&str) -> bool) -> Result<Record> {
        let info = &self.index.info;
        let bad = |message: String| malformed(self.path(), Some(row), message);
        let mut at = 0usize;
        let mut sizes = Vec::with_capacity(info.column_sizes.len());
        for size in &info.column_sizes {
            if let Some(s) = size {
                sizes.push(*s as usize);
            } else {
                let b = bytes
                    .get(at..at + 4)
                    .ok_or_else(|| bad("the sample's column sizes are cut short".to_owned()))?;
                sizes.push(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
                at += 4;
            }
        }
        let mut record = Vec::new();
        for (k, size) in sizes.into_iter().enumerate() {
            let data = at
                .checked_add(size)
                .and_then(|end| bytes.get(at..end))
                .ok_or_else(|| {
                    bad(format!(
                        "column '{}' runs past the sample's {} bytes",
                        info.column_names[k],
                        bytes.len()
                    ))
                })?;
            at += size;
            let name = &info.column_names[k];
            if !wanted(name) {
                continue;
            }
            let value = self.index.columns[k].decode(data).map_err(|message| {
                match &self.index.columns[k] {
                    Column::Other(_) => {
                        unsupported(self.path(), format!("column '{name}': {message}"))
                    }
                    _ => bad(format!("column '{name}': {message}")),
                }
            })?;
            record.push((name.clone(), value));
        }
        Ok(record)
    }

    /// Projects samples `rows` into consecutive rows of `chunk` from `out_row`.
    fn project(
        &mut self,
        rows: Range<u64>,
        projection: &Projection,
        chunk: &mut Chunk,
        out_row: usize,
    ) -> Result<()> {
        let (bytes, starts) = self.samples(rows.clone())?;
        let wanted = |name: &str| projection.columns.iter().any(|c| c.source == name);
        for (k, row) in rows.enumerate() {
            let sample = &bytes[starts[k] as usize..starts[k + 1] as usize];
            let record = self.record(sample, row, &wanted)?;
            project_record(
                Value::Map(record).into_deserializer(),
                projection,
                &mut chunk.columns,
                out_row + k,
            )
            .map_err(|e| e.into_error(projection, self.path(), Encoding::Mds.name(), row))?;
        }
        Ok(())
    }

    /// The next whole sample and its number; `None` after the last.
    fn next_record(&mut self) -> Result<Option<(u64, Record)>> {
        let row = self.next;
        if row >= self.index.info.samples {
            return Ok(None);
        }
        let (bytes, _) = self.samples(row..row + 1)?;
        let record = self.record(&bytes, row, &|_| true)?;
        self.next += 1;
        Ok(Some((row, record)))
    }
}

/// An MDS shard's token lists: column `column` of each sample (an `ndarray` or a JSON list of
/// integers).
#[derive(Debug)]
struct MdsTokens {
    index: Arc<MdsIndex>,
    column: usize,
}

impl TokenRecords for MdsTokens {
    fn rows(&self) -> u64 {
        self.index.info.samples
    }

    fn scratch(&self) -> u64 {
        2 * self.index.info.raw_data.bytes
    }

    fn for_each(
        &self,
        object: &Arc<Object>,
        records: &[Range<u64>],
        _values: bool,
        each: &mut EachTokens<'_>,
    ) -> Result<()> {
        let mut reader = SampleReader::new(object.clone(), self.index.clone());
        let name = &self.index.info.column_names[self.column];
        let mut ids: Vec<i64> = Vec::new();
        for range in records {
            let (bytes, starts) = reader.samples(range.clone())?;
            for (k, row) in range.clone().enumerate() {
                let sample = &bytes[starts[k] as usize..starts[k + 1] as usize];
                let record = reader.record(sample, row, &|c| c == name)?;
                let not_ids = |what: &str| Error::Projection {
                    path: object.uri().to_owned(),
                    row,
                    field: name.clone(),
                    source_field: name.clone(),
                    message: format!("a token stage reads a list of integer ids; this is {what}"),
                };
                ids.clear();
                match record.into_iter().next().map(|(_, v)| v) {
                    Some(Value::List(items)) => {
                        for item in items {
                            match item {
                                Value::Int(v) => ids.push(v),
                                other => {
                                    return Err(not_ids(&format!(
                                        "a list holding {}",
                                        other.kind()
                                    )))
                                }
                            }
                        }
                    }
                    Some(other) => return Err(not_ids(other.kind())),
                    None => return Err(not_ids("missing")),
                }
                each(row, ids.len() as u64, &ids)?;
            }
        }
        Ok(())
    }
}

impl ShardReader for SampleReader {
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        _prefetched: Option<super::Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        let mut out_row = 0usize;
        for range in ranges {
            self.project(range.clone(), projection, chunk, out_row)
                .map_err(|error| ReadFailure {
                    rows_done: out_row,
                    error,
                })?;
            out_row += (range.end - range.start) as usize;
        }
        Ok(())
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
