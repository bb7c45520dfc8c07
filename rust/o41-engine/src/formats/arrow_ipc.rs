//! Arrow IPC files, read in place: what Hugging Face `datasets` writes (`save_to_disk`
//! directories and its cache), in the streaming format or the file format with a footer
//! (`docs/corpora.md`).
//!
//! Inspection walks the file's messages, reading each message's header and skipping its body:
//! row counts come from the record batch headers, nothing is decoded. A read decodes the record
//! batches its rows are in (only the projected columns) and projects them as Parquet columns
//! are. Every length a message claims is checked against the file before it is read.

use std::collections::HashMap;
use std::io::Write;
use std::ops::Range;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, RecordBatch};
use arrow_buffer::Buffer;
use arrow_ipc::{MessageHeader, MetadataVersion};
use arrow_schema::{DataType, SchemaRef};
use bytes::Bytes;
use serde::Deserialize;

use super::format::{
    read_in_place, EachTokens, Listed, RecordInspection, RecordSource, ShardFormat, TokenRecords,
};
use super::{PageCache, ReadFailure, RecordChunk, ShardData, ShardIndex, ShardMeta, ShardReader};
use crate::columns::Chunk;
use crate::encoding::Encoding;
use crate::error::{catch_quietly, Error, Result};
use crate::fields::Projection;
use crate::from_arrow::project_arrow_column;
use crate::storage::{sibling, Object, Pin, Storage};

/// The first bytes of an IPC file in the file format (the streaming format has none).
pub const FILE_MAGIC: &[u8; 6] = b"ARROW1";
/// The marker before each message's length (since Arrow 0.15).
const CONTINUATION: u32 = 0xFFFF_FFFF;
/// A message header larger than this is not one: headers describe buffers, they hold no data.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;
/// A `state.json` or `dataset_dict.json` larger than this is not one.
const MAX_STATE_BYTES: u64 = 16 << 20;

fn malformed(path: &str, message: String) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: Encoding::Arrow.name(),
        row: None,
        message,
    }
}

fn unsupported(path: &str, message: String) -> Error {
    Error::Unsupported {
        path: path.to_owned(),
        encoding: Encoding::Arrow.name(),
        message,
    }
}

/// One record batch of the file: where its message is, and its rows.
#[derive(Debug, Clone, Copy)]
struct Batch {
    /// Byte where the message's header (the flatbuffer) starts.
    header_at: u64,
    /// Bytes of the header.
    header_len: u64,
    /// Byte where the body starts (after the header and any padding).
    body_at: u64,
    /// Bytes of the body.
    body_len: u64,
    /// The shard row of its first row.
    first_row: u64,
    /// Rows.
    rows: u64,
}

/// What inspection learnt of an IPC file: its schema and where each record batch is.
#[derive(Debug)]
pub struct IpcIndex {
    schema: SchemaRef,
    version: MetadataVersion,
    batches: Vec<Batch>,
}

impl IpcIndex {
    /// Rows of the file.
    fn rows(&self) -> u64 {
        self.batches.last().map_or(0, |b| b.first_row + b.rows)
    }

    /// The batch holding `row`.
    fn batch_of(&self, row: u64) -> usize {
        self.batches
            .partition_point(|b| b.first_row + b.rows <= row)
            .min(self.batches.len().saturating_sub(1))
    }

    /// The largest message, header and body: what one decode holds.
    fn largest(&self) -> u64 {
        self.batches
            .iter()
            .map(|b| b.body_at + b.body_len - b.header_at)
            .max()
            .unwrap_or(0)
    }
}

/// One message's header: where its flatbuffer is, parsed by `parse`.
struct Header {
    /// Byte where the flatbuffer starts.
    at: u64,
    /// Its bytes.
    bytes: Bytes,
}

/// Reads the length prefix of the message at byte `at` (the continuation marker and a length,
/// or before Arrow 0.15 a length alone) and its header; `None` at an end-of-stream marker.
fn read_header(object: &Object, at: u64, end: u64) -> Result<Option<Header>> {
    let path = object.uri();
    let bad = |message: String| malformed(path, message);
    let prefix = object.read_range(at..(at + 8).min(end))?;
    if prefix.len() < 4 {
        return Err(bad(format!("{} stray bytes at byte {at}", prefix.len())));
    }
    let first = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    let (skip, len) = if first == CONTINUATION {
        if prefix.len() < 8 {
            return Err(bad(format!("a message at byte {at} is cut short")));
        }
        (
            8,
            u32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]),
        )
    } else {
        (4, first)
    };
    if len == 0 {
        return Ok(None);
    }
    let len = u64::from(len);
    let header_at = at + skip;
    if len > MAX_HEADER_BYTES || header_at + len > end {
        return Err(bad(format!(
            "the message at byte {at} claims a {len}-byte header; {} bytes remain (and a \
             header holds at most {MAX_HEADER_BYTES})",
            end - header_at.min(end)
        )));
    }
    Ok(Some(Header {
        at: header_at,
        bytes: object.read_range(header_at..header_at + len)?,
    }))
}

/// The rows of the record batch whose message header is `header` (at byte `at`).
fn batch_rows(path: &str, header: &Header, at: u64) -> Result<u64> {
    let bad = |message: String| malformed(path, message);
    let message = arrow_ipc::root_as_message(&header.bytes).map_err(|e| {
        bad(format!(
            "the message at byte {at} is not an Arrow message: {e}"
        ))
    })?;
    match message.header_type() {
        MessageHeader::RecordBatch => {}
        MessageHeader::DictionaryBatch => return Err(dictionaries(path)),
        other => {
            return Err(bad(format!(
                "a {other:?} message at byte {at} where a record batch belongs"
            )))
        }
    }
    let batch = message
        .header_as_record_batch()
        .ok_or_else(|| bad(format!("the record batch at byte {at} has no header")))?;
    if batch.compression().is_some() {
        return Err(unsupported(
            path,
            "its record batches are compressed (LZ4 or zstd IPC body compression), which this \
             build does not read"
                .to_owned(),
        ));
    }
    u64::try_from(batch.length()).map_err(|_| {
        bad(format!(
            "the record batch at byte {at} has {} rows",
            batch.length()
        ))
    })
}

fn dictionaries(path: &str) -> Error {
    unsupported(
        path,
        "it holds dictionary-encoded columns, which are not read; cast them to their value type \
         (datasets: Dataset.cast)"
            .to_owned(),
    )
}

/// Reads an IPC file's index: in the file format, from its footer (the schema and where each
/// record batch is) and each batch's message header; in the streaming format, by walking its
/// messages from the start to the end-of-stream marker or the end of its bytes. Bodies are
/// never read.
pub fn read_index(object: &Object) -> Result<IpcIndex> {
    let size = object.size();
    if size >= 18 && &object.read_range(0..6)?[..] == FILE_MAGIC {
        let tail = object.read_range(size - 10..size)?;
        if &tail[4..] == FILE_MAGIC {
            return read_file_index(object);
        }
    }
    read_stream_index(object)
}

/// The file format: the footer names the schema and every record batch's block.
fn read_file_index(object: &Object) -> Result<IpcIndex> {
    let path = object.uri();
    let size = object.size();
    let bad = |message: String| malformed(path, message);
    let tail = object.read_range(size - 10..size - 6)?;
    let footer_len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if footer_len > size - 18 {
        return Err(bad(format!(
            "its footer claims {footer_len} bytes of a {size}-byte file"
        )));
    }
    let footer_at = size - 10 - footer_len;
    let bytes = object.read_range(footer_at..size - 10)?;
    let footer = arrow_ipc::root_as_footer(&bytes)
        .map_err(|e| bad(format!("its footer is not an Arrow footer: {e}")))?;
    if footer.dictionaries().is_some_and(|d| !d.is_empty()) {
        return Err(dictionaries(path));
    }
    let fb = footer
        .schema()
        .ok_or_else(|| bad("its footer holds no schema".to_owned()))?;
    let schema = catch_quietly(|| arrow_ipc::convert::try_fb_to_schema(fb))
        .map_err(|panic| bad(format!("its footer's schema: {panic}")))?
        .map_err(|e| bad(format!("its footer's schema: {e}")))?;
    let mut batches = Vec::new();
    let mut rows = 0u64;
    for (k, block) in footer.recordBatches().into_iter().flatten().enumerate() {
        let at = u64::try_from(block.offset()).unwrap_or(u64::MAX);
        let meta = u64::try_from(block.metaDataLength()).unwrap_or(u64::MAX);
        let body = u64::try_from(block.bodyLength()).unwrap_or(u64::MAX);
        let body_at = at.checked_add(meta);
        let end = body_at.and_then(|b| b.checked_add(body));
        if end.is_none_or(|end| end > footer_at) {
            return Err(bad(format!(
                "record batch {k} of its footer lies at bytes {at}..+{meta}+{body}, past the \
                 data ({footer_at} bytes)"
            )));
        }
        let header = read_header(object, at, at + meta)?
            .ok_or_else(|| bad(format!("record batch {k} of its footer is an end marker")))?;
        let n = batch_rows(path, &header, at)?;
        batches.push(Batch {
            header_at: header.at,
            header_len: header.bytes.len() as u64,
            body_at: at + meta,
            body_len: body,
            first_row: rows,
            rows: n,
        });
        rows = rows
            .checked_add(n)
            .ok_or_else(|| bad("its batches' row counts overflow".to_owned()))?;
    }
    Ok(IpcIndex {
        schema: Arc::new(schema),
        version: footer.version(),
        batches,
    })
}

/// The streaming format: a schema message, then record batches.
fn read_stream_index(object: &Object) -> Result<IpcIndex> {
    let path = object.uri();
    let size = object.size();
    let bad = |message: String| malformed(path, message);
    let mut at = 0u64;
    let mut schema: Option<(SchemaRef, MetadataVersion)> = None;
    let mut batches: Vec<Batch> = Vec::new();
    let mut rows = 0u64;
    while at < size {
        let Some(header) = read_header(object, at, size)? else {
            break;
        };
        let message = arrow_ipc::root_as_message(&header.bytes).map_err(|e| {
            bad(format!(
                "the message at byte {at} is not an Arrow message: {e}"
            ))
        })?;
        let body_len = u64::try_from(message.bodyLength()).unwrap_or(u64::MAX);
        let body_at = header.at + header.bytes.len() as u64;
        if body_len > size - body_at {
            return Err(bad(format!(
                "the message at byte {at} claims a {}-byte body; {} bytes remain",
                message.bodyLength(),
                size - body_at
            )));
        }
        if message.header_type() == MessageHeader::Schema {
            if schema.is_some() {
                return Err(bad(format!("a second schema at byte {at}")));
            }
            let fb = message
                .header_as_schema()
                .ok_or_else(|| bad(format!("the schema at byte {at} has no fields")))?;
            let converted = catch_quietly(|| arrow_ipc::convert::try_fb_to_schema(fb))
                .map_err(|panic| bad(format!("the schema at byte {at}: {panic}")))?
                .map_err(|e| bad(format!("the schema at byte {at}: {e}")))?;
            schema = Some((Arc::new(converted), message.version()));
        } else {
            if schema.is_none() {
                return Err(bad(format!("a message at byte {at} before the schema")));
            }
            let n = batch_rows(path, &header, at)?;
            batches.push(Batch {
                header_at: header.at,
                header_len: header.bytes.len() as u64,
                body_at,
                body_len,
                first_row: rows,
                rows: n,
            });
            rows = rows
                .checked_add(n)
                .ok_or_else(|| bad("its batches' row counts overflow".to_owned()))?;
        }
        at = body_at + body_len;
    }
    let Some((schema, version)) = schema else {
        return Err(bad("it holds no schema: not an Arrow IPC file".to_owned()));
    };
    Ok(IpcIndex {
        schema,
        version,
        batches,
    })
}

/// Arrow IPC files (`datasets`' `.arrow` files).
pub struct ArrowIpc;

impl ShardFormat for ArrowIpc {
    fn encoding(&self) -> Encoding {
        Encoding::Arrow
    }

    fn names_directory(&self, configured: &str) -> bool {
        configured.strip_suffix(".arrow").is_none()
    }

    fn directory_shards(&self, storage: &Storage, dir: &str, option: &str) -> Result<Vec<Listed>> {
        // A `datasets` save_to_disk directory is the Arrow files its state.json lists.
        let files = dataset_files(storage, dir, option)?;
        Ok(files.into_iter().map(|path| (path, None)).collect())
    }

    fn reads_tokens(&self) -> bool {
        true
    }

    fn token_records(
        &self,
        _storage: &Storage,
        object: &Arc<Object>,
        field: &str,
    ) -> Result<Option<Arc<dyn TokenRecords>>> {
        let index = Arc::new(read_index(object)?);
        let not_ids = |message: String| Error::Projection {
            path: object.uri().to_owned(),
            row: 0,
            field: field.to_owned(),
            source_field: field.to_owned(),
            message,
        };
        let column = index
            .schema
            .index_of(field)
            .map_err(|_| not_ids(no_such_column(&index.schema)))?;
        let data_type = index.schema.field(column).data_type();
        let ids = match data_type {
            DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
                item.data_type().is_integer()
            }
            _ => false,
        };
        if !ids {
            return Err(not_ids(format!(
                "a token stage reads a list of integer ids from it; the column is {data_type}"
            )));
        }
        Ok(Some(Arc::new(IpcTokens { index, column })))
    }

    fn inspect(&self, object: Arc<Object>, how: RecordInspection<'_>) -> Result<ShardMeta> {
        let index = Arc::new(read_index(&object)?);
        let mut reader = BatchReader::new(object, index.clone());
        reader.columns(how.projection)?;
        if how.first_record && index.rows() > 0 {
            let mut chunk = Chunk::padded(how.projection, 1);
            reader
                .project(0..1, how.projection, &mut chunk, 0)
                .map_err(|f| f.error)?;
        }
        // A decode holds the message, and its buffers again where they must be realigned.
        let largest = index.largest();
        Ok(ShardMeta {
            dropped: crate::formats::Dropped::default(),
            rows: index.rows(),
            scratch_bytes: 2 * largest,
            pin: Pin::default(),
            longest_record: 0,
            index,
        })
    }

    fn records(
        &self,
        _storage: &Storage,
        object: Arc<Object>,
        _chunk_rows: usize,
    ) -> Result<Box<dyn RecordSource>> {
        let index = Arc::new(read_index(&object)?);
        Ok(Box::new(WholeBatches {
            reader: BatchReader::new(object, index),
            next: 0,
        }))
    }

    fn write(&self, _out: &mut (dyn Write + Send), _data: ShardData<'_>, name: &str) -> Result<()> {
        Err(read_in_place(name, "Arrow IPC files", "as parquet"))
    }
}

impl ShardIndex for IpcIndex {
    fn block_of(&self, row: u64) -> u64 {
        self.batch_of(row) as u64
    }

    fn open(
        self: Arc<Self>,
        object: Arc<Object>,
        _meta: &ShardMeta,
        _pages: Option<&Arc<PageCache>>,
    ) -> Result<Box<dyn ShardReader>> {
        Ok(Box::new(BatchReader::new(object, self)))
    }
}

/// Decodes a file's record batches, keeping the last one decoded.
struct BatchReader {
    object: Arc<Object>,
    index: Arc<IpcIndex>,
    /// The batch last decoded, and the schema columns it holds.
    last: Option<(usize, Vec<usize>, RecordBatch)>,
}

impl BatchReader {
    fn new(object: Arc<Object>, index: Arc<IpcIndex>) -> Self {
        BatchReader {
            object,
            index,
            last: None,
        }
    }

    /// The schema columns `projection` reads, in its order; a missing one is the error, which
    /// lists the shard's.
    fn columns(&self, projection: &Projection) -> Result<Vec<usize>> {
        projection
            .columns
            .iter()
            .map(|c| {
                self.index
                    .schema
                    .index_of(&c.source)
                    .map_err(|_| Error::Projection {
                        path: self.object.uri().to_owned(),
                        row: 0,
                        field: c.name.clone(),
                        source_field: c.source.clone(),
                        message: no_such_column(&self.index.schema),
                    })
            })
            .collect()
    }

    /// Batch `b`, decoded with the schema columns `columns` (every column for `None`).
    fn decode(&mut self, b: usize, columns: Option<&[usize]>) -> Result<&RecordBatch> {
        let wanted: Vec<usize> = columns.map_or_else(
            || (0..self.index.schema.fields().len()).collect(),
            <[_]>::to_vec,
        );
        let hit = matches!(&self.last, Some((k, c, _)) if *k == b && *c == wanted);
        if !hit {
            let batch = self.index.batches[b];
            let bytes = self
                .object
                .read_range(batch.header_at..batch.body_at + batch.body_len)?;
            let split = (
                batch.header_len as usize,
                (batch.body_at - batch.header_at) as usize,
            );
            let decoded = decode_batch(&self.index, &bytes, split, &wanted).map_err(|message| {
                Error::Format {
                    path: self.object.uri().to_owned(),
                    encoding: Encoding::Arrow.name(),
                    row: Some(batch.first_row),
                    message: format!(
                        "its record batch of rows {}..{}: {message}",
                        batch.first_row,
                        batch.first_row + batch.rows
                    ),
                }
            })?;
            if decoded.num_rows() as u64 != batch.rows {
                return Err(Error::Format {
                    path: self.object.uri().to_owned(),
                    encoding: Encoding::Arrow.name(),
                    row: Some(batch.first_row),
                    message: format!(
                        "a record batch decoded to {} rows; its header says {}",
                        decoded.num_rows(),
                        batch.rows
                    ),
                });
            }
            self.last = Some((b, wanted, decoded));
        }
        Ok(&self.last.as_ref().expect("decoded above").2)
    }

    /// Projects rows `rows` of the file into consecutive rows of `chunk` from `out_row`.
    fn project(
        &mut self,
        rows: Range<u64>,
        projection: &Projection,
        chunk: &mut Chunk,
        out_row: usize,
    ) -> std::result::Result<(), ReadFailure> {
        let columns = self.columns(projection)?;
        let path = self.object.uri().to_owned();
        let mut row = rows.start;
        let mut out = out_row;
        while row < rows.end {
            let b = self.index.batch_of(row);
            let batch = self.index.batches[b];
            if row < batch.first_row || row >= batch.first_row + batch.rows {
                return Err(ReadFailure {
                    rows_done: out - out_row,
                    error: malformed(
                        &path,
                        format!("row {row} is past the file's {} rows", self.index.rows()),
                    ),
                });
            }
            let end = rows.end.min(batch.first_row + batch.rows);
            let decoded = self
                .decode(b, Some(&columns))
                .map_err(|error| ReadFailure {
                    rows_done: out - out_row,
                    error,
                })?;
            let local = (row - batch.first_row) as usize..(end - batch.first_row) as usize;
            for (k, column) in projection.columns.iter().enumerate() {
                project_arrow_column(
                    decoded.column(k).as_ref(),
                    column,
                    local.clone(),
                    &mut chunk.columns[k],
                    out,
                    &path,
                    batch.first_row,
                )
                .map_err(|error| ReadFailure {
                    rows_done: out - out_row,
                    error,
                })?;
            }
            out += local.len();
            row = end;
        }
        Ok(())
    }
}

/// Decodes the record batch whose message is `bytes` (its header is `..header_len`, its body
/// from `body_at`), keeping `columns`.
fn decode_batch(
    index: &IpcIndex,
    bytes: &Bytes,
    (header_len, body_at): (usize, usize),
    columns: &[usize],
) -> std::result::Result<RecordBatch, String> {
    let message = arrow_ipc::root_as_message(&bytes[..header_len]).map_err(|e| e.to_string())?;
    let batch = message
        .header_as_record_batch()
        .ok_or_else(|| "not a record batch".to_owned())?;
    let body = Buffer::from(bytes.slice(body_at..));
    let dictionaries = HashMap::new();
    // arrow-rs asserts on some forged buffer layouts; such a panic is the file's fault.
    catch_quietly(|| {
        arrow_ipc::reader::read_record_batch(
            &body,
            batch,
            index.schema.clone(),
            &dictionaries,
            Some(columns),
            &index.version,
        )
    })?
    .map_err(|e| e.to_string())
}

impl ShardReader for BatchReader {
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        _prefetched: Option<super::Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        super::each_range(ranges, |range, out_row| {
            self.project(range, projection, chunk, out_row)
        })
    }
}

/// A file's record batches, whole, for `iter_shard`.
struct WholeBatches {
    reader: BatchReader,
    next: usize,
}

impl RecordSource for WholeBatches {
    fn next_chunk(&mut self, _max_rows: usize) -> Result<Option<RecordChunk>> {
        if self.next >= self.reader.index.batches.len() {
            return Ok(None);
        }
        let b = self.next;
        self.next += 1;
        Ok(Some(RecordChunk::Arrow(
            self.reader.decode(b, None)?.clone(),
        )))
    }
}

/// An Arrow file's token lists: column `column` of each record.
#[derive(Debug)]
struct IpcTokens {
    index: Arc<IpcIndex>,
    column: usize,
}

impl TokenRecords for IpcTokens {
    fn rows(&self) -> u64 {
        self.index.rows()
    }

    fn scratch(&self) -> u64 {
        2 * self.index.largest()
    }

    fn for_each(
        &self,
        object: &Arc<Object>,
        records: &[Range<u64>],
        values: bool,
        each: &mut EachTokens<'_>,
    ) -> Result<()> {
        let mut reader = BatchReader::new(object.clone(), self.index.clone());
        let mut ids: Vec<i64> = Vec::new();
        for range in records {
            let mut row = range.start;
            while row < range.end {
                let b = self.index.batch_of(row);
                let batch = self.index.batches[b];
                let end = range.end.min(batch.first_row + batch.rows);
                if row < batch.first_row || end <= row {
                    return Err(malformed(
                        object.uri(),
                        format!("row {row} is past the file's rows"),
                    ));
                }
                let decoded = reader.decode(b, Some(&[self.column]))?;
                let lists = decoded.column(0);
                for r in row..end {
                    let i = (r - batch.first_row) as usize;
                    let (items, from, to) = list_at(lists.as_ref(), i);
                    ids.clear();
                    if values {
                        integers(items, from..to, &mut ids).map_err(|message| {
                            Error::Projection {
                                path: object.uri().to_owned(),
                                row: r,
                                field: self.index.schema.field(self.column).name().clone(),
                                source_field: self.index.schema.field(self.column).name().clone(),
                                message,
                            }
                        })?;
                    }
                    each(r, (to - from) as u64, &ids)?;
                }
                row = end;
            }
        }
        Ok(())
    }
}

/// List `i` of a list column: its values array and their range (a null list is empty).
fn list_at(lists: &dyn Array, i: usize) -> (&dyn Array, usize, usize) {
    if lists.is_null(i) {
        return (lists, 0, 0);
    }
    match lists.data_type() {
        DataType::LargeList(_) => {
            let l = lists.as_list::<i64>();
            let o = l.value_offsets();
            (l.values().as_ref(), o[i] as usize, o[i + 1] as usize)
        }
        DataType::FixedSizeList(_, n) => {
            let l = lists.as_fixed_size_list();
            let n = *n as usize;
            (l.values().as_ref(), i * n, (i + 1) * n)
        }
        _ => {
            let l = lists.as_list::<i32>();
            let o = l.value_offsets();
            (l.values().as_ref(), o[i] as usize, o[i + 1] as usize)
        }
    }
}

/// Appends the integers `range` of `items` to `out`; a null or a value beyond `i64` is the error.
fn integers(
    items: &dyn Array,
    range: Range<usize>,
    out: &mut Vec<i64>,
) -> std::result::Result<(), String> {
    if items.null_count() > 0 && range.clone().any(|k| items.is_null(k)) {
        return Err("a token list holds a null".to_owned());
    }
    macro_rules! widen {
        ($t:ty) => {{
            let values = items.as_primitive::<$t>().values();
            for &v in &values[range] {
                out.push(i64::try_from(v).map_err(|_| format!("token id {v} does not fit i64"))?);
            }
        }};
    }
    match items.data_type() {
        DataType::Int8 => widen!(Int8Type),
        DataType::Int16 => widen!(Int16Type),
        DataType::Int32 => widen!(Int32Type),
        DataType::Int64 => widen!(Int64Type),
        DataType::UInt8 => widen!(UInt8Type),
        DataType::UInt16 => widen!(UInt16Type),
        DataType::UInt32 => widen!(UInt32Type),
        DataType::UInt64 => widen!(UInt64Type),
        other => return Err(format!("token ids of type {other}")),
    }
    Ok(())
}

/// What `datasets`' `state.json` lists: the dataset's Arrow files, in order.
#[derive(Deserialize)]
struct State {
    #[serde(rename = "_data_files")]
    data_files: Vec<DataFile>,
}

#[derive(Deserialize)]
struct DataFile {
    filename: String,
}

/// What `datasets`' `dataset_dict.json` lists: the splits of a `DatasetDict`.
#[derive(Deserialize)]
struct DatasetDict {
    splits: Vec<String>,
}

/// The Arrow files of a `save_to_disk` directory (its `state.json`'s data files, in order); a
/// `DatasetDict`'s directory is refused naming its splits, each a directory of its own.
pub fn dataset_files(storage: &Storage, dir: &str, option: &str) -> Result<Vec<String>> {
    let dir = dir.trim_end_matches('/');
    let read_json = |name: &str| -> Result<Option<Bytes>> {
        let path = format!("{dir}/{name}");
        match storage.open(&path) {
            Ok(object) if object.size() <= MAX_STATE_BYTES => {
                Ok(Some(object.read_range(0..object.size())?))
            }
            Ok(object) => Err(malformed(
                &path,
                format!("{} bytes is not a datasets {name}", object.size()),
            )),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    };
    if let Some(state) = read_json("state.json")? {
        let state: State = serde_json::from_slice(&state).map_err(|e| {
            malformed(
                &format!("{dir}/state.json"),
                format!("not a datasets state.json: {e}"),
            )
        })?;
        if state.data_files.is_empty() {
            return Err(Error::config(
                option,
                format!("{dir}/state.json lists no data files"),
            ));
        }
        return state
            .data_files
            .iter()
            .map(|f| {
                // A data file is a plain name in the directory, never a path out of it.
                if f.filename.is_empty() || f.filename.contains('/') || f.filename == ".." {
                    return Err(malformed(
                        &format!("{dir}/state.json"),
                        format!(
                            "data file '{}' is not a file name in its directory",
                            f.filename
                        ),
                    ));
                }
                Ok(sibling(&format!("{dir}/state.json"), &f.filename))
            })
            .collect();
    }
    if let Some(dict) = read_json("dataset_dict.json")? {
        let dict: DatasetDict = serde_json::from_slice(&dict).map_err(|e| {
            malformed(
                &format!("{dir}/dataset_dict.json"),
                format!("not a datasets dataset_dict.json: {e}"),
            )
        })?;
        return Err(Error::config(
            option,
            format!(
                "{dir} is a DatasetDict; name one of its splits' directories: {}",
                dict.splits
                    .iter()
                    .map(|s| format!("{dir}/{s}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    Err(Error::config(
        option,
        format!(
            "{dir} is neither an .arrow file nor a datasets save_to_disk directory (no \
             state.json or dataset_dict.json in it)"
        ),
    ))
}

/// The message of a column the shard lacks, listing the ones it has.
fn no_such_column(schema: &arrow_schema::Schema) -> String {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    format!(
        "the shard has no such column (its columns: {})",
        names.join(", ")
    )
}
