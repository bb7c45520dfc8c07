//! `ArrayRecord` files (grain, `MaxText`), read in place (`docs/corpora.md`).
//!
//! An `ArrayRecord` file is a Riegeli/records file: chunks of records, then a footer chunk that
//! lists every data chunk (its offset, record count and decoded size), then a postscript chunk
//! in the last 64 KiB that gives the footer's offset. Inspection reads the postscript and the
//! footer only: the record count comes from them, and a read of any row range fetches just the
//! chunks that hold it. Data chunks are Riegeli simple chunks, raw or compressed with zstd,
//! Brotli or Snappy; any other kind (transposed chunks) is refused naming the file.
//!
//! What a record holds is not in the file: the source's encoding names it
//! ([`RecordPayload`]): a JSON object, a `MessagePack` map, or a token document of
//! little-endian ids, read as a record with the one field `tokens`.

mod riegeli;

use std::io::Write;
use std::ops::Range;
use std::sync::Arc;

use serde::de::IntoDeserializer;

use super::format::{
    read_in_place, EachRecord, EachTokens, RecordInspection, RecordSource, ShardFormat,
    TokenRecords,
};
use super::token_ids::IdType;
use super::value::{read_record, Record, Value};
use super::{PageCache, ReadFailure, ShardData, ShardIndex, ShardMeta, ShardReader};
use crate::columns::Chunk;
use crate::encoding::{Encoding, RecordPayload};
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::record::project_record;
use crate::storage::{Object, Pin, Storage};
use riegeli::{ChunkType, Records, BLOCK};

/// The field a token document's ids are read under.
pub const TOKENS_FIELD: &str = "tokens";
/// `ArrayRecordWriter`'s magic number, in every copy of the postscript.
const MAGIC: u64 = 0x7193_0e70_4fda_e05e;
/// The layout version of the footer this reader knows.
const VERSION: u64 = 1;
/// The largest chunk a reader decodes: `group_size` records decoded at once.
pub const MAX_CHUNK_BYTES: u64 = 1 << 30;

/// `ArrayRecord` files whose records hold `payload`.
pub struct ArrayRecord(RecordPayload);

const fn ids_format(width: u8, signed: bool) -> ArrayRecord {
    ArrayRecord(RecordPayload::Ids { width, signed })
}

static JSON: ArrayRecord = ArrayRecord(RecordPayload::Json);
static MSGPACK: ArrayRecord = ArrayRecord(RecordPayload::Msgpack);
static IDS: [ArrayRecord; 8] = [
    ids_format(1, false),
    ids_format(1, true),
    ids_format(2, false),
    ids_format(2, true),
    ids_format(4, false),
    ids_format(4, true),
    ids_format(8, false),
    ids_format(8, true),
];

/// The format of `ArrayRecord` files holding `payload`.
pub fn format(payload: RecordPayload) -> &'static ArrayRecord {
    match payload {
        RecordPayload::Json => &JSON,
        RecordPayload::Msgpack => &MSGPACK,
        RecordPayload::Ids { width, signed } => IDS
            .iter()
            .find(|f| f.0 == payload)
            .unwrap_or_else(|| panic!("no {width}-byte ids (signed: {signed}) encoding")),
    }
}

fn encoding(payload: RecordPayload) -> Encoding {
    Encoding::ArrayRecord(payload)
}

fn malformed(path: &str, payload: RecordPayload, row: Option<u64>, message: String) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: encoding(payload).name(),
        row,
        message,
    }
}

/// One data chunk as the footer lists it.
#[derive(Debug, Clone, Copy)]
struct ChunkEntry {
    offset: u64,
    /// Where the next chunk (or the footer) begins: the chunk and its padding end there.
    end: u64,
    records: u64,
    decoded_size: u64,
}

/// What inspection learnt of a file: its footer.
#[derive(Debug)]
pub struct ArrayRecordIndex {
    payload: RecordPayload,
    chunks: Vec<ChunkEntry>,
    /// The first row of each chunk, then the file's record count.
    starts: Vec<u64>,
}

impl ArrayRecordIndex {
    fn rows(&self) -> u64 {
        *self.starts.last().unwrap_or(&0)
    }

    /// The chunk holding `row` (a row below the count).
    fn chunk_of(&self, row: u64) -> usize {
        self.starts.partition_point(|&s| s <= row) - 1
    }

    /// Most bytes decoding one chunk holds: the chunk as read, its sizes and its records.
    fn scratch(&self) -> u64 {
        self.chunks
            .iter()
            .map(|c| c.decoded_size + 11 * (c.end - c.offset) + 8 * c.records)
            .max()
            .unwrap_or(0)
    }
}

/// The fields 1 to 4 of a protocol buffer message: varints, or the bytes of a length-delimited
/// field; other fields and wire types are skipped.
#[derive(Default)]
struct Fields<'a> {
    varints: [Option<u64>; 4],
    bytes: [Option<&'a [u8]>; 4],
}

fn proto_fields(mut message: &[u8]) -> std::result::Result<Fields<'_>, String> {
    let mut fields = Fields::default();
    while !message.is_empty() {
        let key = riegeli::varint(&mut message)?;
        let slot = usize::try_from(key >> 3)
            .ok()
            .filter(|f| (1..=4).contains(f));
        match key & 7 {
            0 => {
                let v = riegeli::varint(&mut message)?;
                if let Some(f) = slot {
                    fields.varints[f - 1] = Some(v);
                }
            }
            2 => {
                let len = riegeli::varint(&mut message)?;
                if len > message.len() as u64 {
                    return Err("a field runs past its message".into());
                }
                let (data, rest) = message.split_at(len as usize);
                message = rest;
                if let Some(f) = slot {
                    fields.bytes[f - 1] = Some(data);
                }
            }
            1 | 5 => {
                let skip = if key & 7 == 1 { 8 } else { 4 };
                message = message
                    .get(skip..)
                    .ok_or_else(|| "a field runs past its message".to_owned())?;
            }
            other => return Err(format!("a field of wire type {other}")),
        }
    }
    Ok(fields)
}

/// Reads the chunk at `offset` that ends by `end` (its bytes with the block headers among them),
/// as a simple chunk.
fn read_simple(
    object: &Object,
    offset: u64,
    end: u64,
) -> std::result::Result<(riegeli::ChunkHeader, Vec<u8>), ReadError> {
    let raw = object.read_range(offset..end).map_err(ReadError::Storage)?;
    let bytes = riegeli::strip_block_headers(offset, &raw);
    let (header, data) = riegeli::split_chunk(&bytes).map_err(ReadError::Bad)?;
    match header.chunk_type {
        ChunkType::Simple => Ok((header, data.to_vec())),
        ChunkType::Other(b't') => Err(ReadError::Unsupported(
            "it holds transposed chunks (written with transpose:true); simple chunks are read"
                .into(),
        )),
        ChunkType::Other(kind) => Err(ReadError::Bad(format!(
            "the chunk at byte {offset} is of type {kind:#04x}, not a chunk of records"
        ))),
        ChunkType::Signature => Err(ReadError::Bad(format!(
            "the chunk at byte {offset} is a file signature, not a chunk of records"
        ))),
    }
}

/// Why a chunk could not be read.
enum ReadError {
    Storage(Error),
    Bad(String),
    Unsupported(String),
}

impl ReadError {
    fn into_error(self, object: &Object, payload: RecordPayload, row: Option<u64>) -> Error {
        match self {
            ReadError::Storage(e) => e,
            ReadError::Bad(message) => malformed(object.uri(), payload, row, message),
            ReadError::Unsupported(message) => Error::Unsupported {
                path: object.uri().to_owned(),
                encoding: encoding(payload).name(),
                message,
            },
        }
    }
}

/// Reads the postscript and the footer of `object`.
fn read_index(object: &Object, payload: RecordPayload) -> Result<ArrayRecordIndex> {
    let size = object.size();
    let fail = |e: ReadError| e.into_error(object, payload, None);
    let bad = |message: String| fail(ReadError::Bad(message));
    if size < BLOCK {
        return Err(bad(format!(
            "{size} bytes is not an ArrayRecord file (its postscript alone takes 64 KiB)"
        )));
    }
    let tail = size - BLOCK;
    let (header, data) = read_simple(object, tail, size).map_err(fail)?;
    let postscript = riegeli::simple_records(&header, &data, true)
        .map_err(|m| bad(format!("its postscript: {m}")))?;
    let copies: Vec<Fields<'_>> = (0..postscript.ends.len())
        .map(|k| proto_fields(postscript.get(k)))
        .collect::<std::result::Result<_, _>>()
        .map_err(|m| bad(format!("its postscript: {m}")))?;
    let first = copies
        .first()
        .ok_or_else(|| bad("its postscript holds no record".into()))?;
    if first.varints[1] != Some(MAGIC) {
        return Err(bad(
            "its postscript lacks ArrayRecord's magic number: not an ArrayRecord file".into(),
        ));
    }
    let footer_offset = first.varints[0]
        .filter(|&o| o >= 64 && o < tail)
        .ok_or_else(|| {
            bad(format!(
                "its postscript's footer offset is not between byte 64 and {tail}"
            ))
        })?;
    let (header, data) = read_simple(object, footer_offset, tail)
        .map_err(|e| fail(e).with_context_of("its footer"))?;
    // A footer entry is a few varints; its decoded size is bounded by its count.
    if header.decoded_size > 32 * (tail - footer_offset) + 4096 {
        return Err(bad(format!(
            "its footer says it decodes to {} bytes, more than its {} bytes can hold",
            header.decoded_size,
            tail - footer_offset
        )));
    }
    let footer = riegeli::simple_records(&header, &data, true)
        .map_err(|m| bad(format!("its footer: {m}")))?;
    if footer.ends.is_empty() {
        return Err(bad("its footer holds no metadata".into()));
    }
    let metadata = proto_fields(footer.get(0))
        .and_then(|m| m.bytes[0].map(proto_fields).transpose())
        .map_err(|m| bad(format!("its footer metadata: {m}")))?
        .ok_or_else(|| bad("its footer metadata is not ArrayRecord metadata".into()))?;
    let version = metadata.varints[0].unwrap_or(0);
    if version != VERSION {
        return Err(fail(ReadError::Unsupported(format!(
            "ArrayRecord layout version {version}; version {VERSION} is read"
        ))));
    }
    let listed = footer.ends.len() as u64 - 1;
    let (num_chunks, num_records) = (
        metadata.varints[1].unwrap_or(0),
        metadata.varints[2].unwrap_or(0),
    );
    if num_chunks != listed {
        return Err(bad(format!(
            "its footer metadata gives {num_chunks} chunks; the footer lists {listed}"
        )));
    }
    let mut chunks = Vec::with_capacity(listed as usize);
    let mut starts = Vec::with_capacity(listed as usize + 1);
    starts.push(0u64);
    for k in 1..footer.ends.len() {
        let entry =
            proto_fields(footer.get(k)).map_err(|m| bad(format!("footer entry {}: {m}", k - 1)))?;
        let offset = entry.varints[0].unwrap_or(0);
        let records = entry.varints[2].unwrap_or(0);
        let decoded_size = entry.varints[1].unwrap_or(0);
        let previous = chunks.last().map_or(63, |c: &ChunkEntry| c.offset);
        if offset <= previous || offset >= footer_offset {
            return Err(bad(format!(
                "footer entry {}: chunk offset {offset} is not after the previous chunk and \
                 before the footer at {footer_offset}",
                k - 1
            )));
        }
        if let Some(last) = chunks.last_mut() {
            last.end = offset;
        }
        if decoded_size > MAX_CHUNK_BYTES {
            return Err(fail(ReadError::Unsupported(format!(
                "chunk {} decodes to {decoded_size} bytes, more than the {MAX_CHUNK_BYTES} a \
                 reader holds; rewrite it with a smaller group_size",
                k - 1
            ))));
        }
        let start = *starts.last().expect("starts with 0");
        starts.push(start.checked_add(records).ok_or_else(|| {
            bad(format!(
                "footer entry {}: the record counts overflow",
                k - 1
            ))
        })?);
        chunks.push(ChunkEntry {
            offset,
            end: footer_offset,
            records,
            decoded_size,
        });
    }
    let index = ArrayRecordIndex {
        payload,
        chunks,
        starts,
    };
    // A chunk holds at least as many bytes as records (Riegeli pads it so).
    if let Some((k, c)) = index
        .chunks
        .iter()
        .enumerate()
        .find(|(_, c)| c.records > c.end - c.offset)
    {
        return Err(bad(format!(
            "footer entry {k}: {} records in a chunk of {} bytes",
            c.records,
            c.end - c.offset
        )));
    }
    if index.rows() != num_records {
        return Err(bad(format!(
            "its footer metadata gives {num_records} records; its chunks hold {}",
            index.rows()
        )));
    }
    Ok(index)
}

trait WithContext {
    fn with_context_of(self, what: &str) -> Self;
}

impl WithContext for Error {
    fn with_context_of(self, what: &str) -> Self {
        match self {
            Error::Format {
                path,
                encoding,
                row,
                message,
            } => Error::Format {
                path,
                encoding,
                row,
                message: format!("{what}: {message}"),
            },
            other => other,
        }
    }
}

impl ShardFormat for ArrayRecord {
    fn encoding(&self) -> Encoding {
        encoding(self.0)
    }

    fn reads_tokens(&self) -> bool {
        true
    }

    fn inspect(&self, object: Arc<Object>, how: RecordInspection<'_>) -> Result<ShardMeta> {
        let index = Arc::new(read_index(&object, self.0)?);
        let rows = index.rows();
        if how.first_record && rows > 0 {
            let mut reader = ChunkReader::new(object.clone(), index.clone());
            let mut chunk = Chunk::padded(how.projection, 1);
            reader.project(0..1, how.projection, &mut chunk, 0)?;
        }
        Ok(ShardMeta {
            dropped: crate::formats::Dropped::default(),
            rows,
            scratch_bytes: index.scratch(),
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
        let index = Arc::new(read_index(&object, self.0)?);
        let reader = ChunkReader::new(object, index);
        Ok(Box::new(EachRecord::new(reader, ChunkReader::next_record)))
    }

    fn write(&self, _out: &mut (dyn Write + Send), _data: ShardData<'_>, name: &str) -> Result<()> {
        Err(read_in_place(name, "ArrayRecord files", "as parquet"))
    }

    fn token_records(
        &self,
        _storage: &Storage,
        object: &Arc<Object>,
        field: &str,
    ) -> Result<Option<Arc<dyn TokenRecords>>> {
        if matches!(self.0, RecordPayload::Ids { .. }) && field != TOKENS_FIELD {
            return Err(Error::Projection {
                path: object.uri().to_owned(),
                row: 0,
                field: field.to_owned(),
                source_field: field.to_owned(),
                message: format!("an ArrayRecord file of ids holds one field, '{TOKENS_FIELD}'"),
            });
        }
        let index = Arc::new(read_index(object, self.0)?);
        Ok(Some(Arc::new(ArrayRecordTokens {
            index,
            field: field.to_owned(),
        })))
    }
}

impl ShardIndex for ArrayRecordIndex {
    fn block_of(&self, row: u64) -> u64 {
        if row >= self.rows() {
            return self.chunks.len() as u64;
        }
        self.chunk_of(row) as u64
    }

    fn open(
        self: Arc<Self>,
        object: Arc<Object>,
        _meta: &ShardMeta,
        _pages: Option<&Arc<PageCache>>,
    ) -> Result<Box<dyn ShardReader>> {
        Ok(Box::new(ChunkReader::new(object, self)))
    }
}

/// Reads a file's records a chunk at a time, keeping the chunk it read last.
struct ChunkReader {
    object: Arc<Object>,
    index: Arc<ArrayRecordIndex>,
    /// The chunk decoded last, and whether its values were decoded.
    held: Option<(usize, bool, Records)>,
    next: u64,
}

impl ChunkReader {
    fn new(object: Arc<Object>, index: Arc<ArrayRecordIndex>) -> Self {
        ChunkReader {
            object,
            index,
            held: None,
            next: 0,
        }
    }

    fn payload(&self) -> RecordPayload {
        self.index.payload
    }

    /// Chunk `k`, decoded (its records' values too when `values` is set).
    fn chunk(&mut self, k: usize, values: bool) -> Result<&Records> {
        let reuse = matches!(&self.held, Some((held, had, _)) if *held == k && (*had || !values));
        if !reuse {
            let entry = self.index.chunks[k];
            let first = self.index.starts[k];
            let fail = |e: ReadError| e.into_error(&self.object, self.index.payload, Some(first));
            let (header, data) =
                read_simple(&self.object, entry.offset, entry.end).map_err(fail)?;
            if header.records != entry.records || header.decoded_size != entry.decoded_size {
                return Err(fail(ReadError::Bad(format!(
                    "chunk {k} holds {} records of {} bytes; the footer says {} of {}",
                    header.records, header.decoded_size, entry.records, entry.decoded_size
                ))));
            }
            let records = riegeli::simple_records(&header, &data, values)
                .map_err(|m| fail(ReadError::Bad(format!("chunk {k}: {m}"))))?;
            self.held = Some((k, values, records));
        }
        Ok(&self.held.as_ref().expect("held above").2)
    }

    /// Record `row`'s bytes.
    fn record_bytes(&mut self, row: u64) -> Result<&[u8]> {
        let k = self.index.chunk_of(row);
        let at = (row - self.index.starts[k]) as usize;
        Ok(self.chunk(k, true)?.get(at))
    }

    /// Projects rows `rows` into consecutive rows of `chunk` from `out_row`.
    fn project(
        &mut self,
        rows: Range<u64>,
        projection: &Projection,
        chunk: &mut Chunk,
        out_row: usize,
    ) -> Result<()> {
        let payload = self.payload();
        let name = encoding(payload).name();
        // The reader's own handle, so the path is borrowed once rather than copied per row.
        let object = self.object.clone();
        let path = object.uri();
        for (k, row) in rows.enumerate() {
            let bytes = self.record_bytes(row)?;
            let projected = match payload {
                RecordPayload::Json => project_record(
                    &mut serde_json::Deserializer::from_slice(bytes),
                    projection,
                    &mut chunk.columns,
                    out_row + k,
                ),
                RecordPayload::Msgpack => project_record(
                    &mut rmp_serde::Deserializer::from_read_ref(bytes),
                    projection,
                    &mut chunk.columns,
                    out_row + k,
                ),
                RecordPayload::Ids { .. } => {
                    let record = ids_record(path, payload, row, bytes)?;
                    project_record(
                        Value::Map(record).into_deserializer(),
                        projection,
                        &mut chunk.columns,
                        out_row + k,
                    )
                }
            };
            let fields = match payload {
                RecordPayload::Json => crate::record::RecordFields::Json(bytes),
                RecordPayload::Msgpack => crate::record::RecordFields::Msgpack(bytes),
                RecordPayload::Ids { .. } => crate::record::RecordFields::Known(&["tokens"]),
            };
            projected.map_err(|e| e.into_error(projection, path, (name, Some(fields)), row))?;
        }
        Ok(())
    }

    /// The next whole record and its number; `None` after the last.
    fn next_record(&mut self) -> Result<Option<(u64, Record)>> {
        let row = self.next;
        if row >= self.index.rows() {
            return Ok(None);
        }
        let payload = self.payload();
        let path = self.object.uri().to_owned();
        let bytes = self.record_bytes(row)?;
        let record = match payload {
            RecordPayload::Json => read_record(&mut serde_json::Deserializer::from_slice(bytes)),
            RecordPayload::Msgpack => {
                read_record(&mut rmp_serde::Deserializer::from_read_ref(bytes))
            }
            RecordPayload::Ids { .. } => Ok(ids_record(&path, payload, row, bytes)?),
        }
        .map_err(|message| malformed(&path, payload, Some(row), message))?;
        self.next += 1;
        Ok(Some((row, record)))
    }
}

fn id_type(payload: RecordPayload) -> Option<IdType> {
    match payload {
        RecordPayload::Ids { width, signed } => Some(IdType::new(u64::from(width), signed)),
        _ => None,
    }
}

/// Decodes a record of ids into `ids`.
fn decode_ids(
    path: &str,
    payload: RecordPayload,
    row: u64,
    bytes: &[u8],
    ids: &mut Vec<i64>,
) -> Result<()> {
    let ty = id_type(payload).expect("a payload of ids");
    if !(bytes.len() as u64).is_multiple_of(ty.width) {
        return Err(malformed(
            path,
            payload,
            Some(row),
            format!(
                "a record of {} bytes is not a whole number of {} ids",
                bytes.len(),
                ty.name()
            ),
        ));
    }
    ty.decode(bytes, ids).map_err(|v| {
        malformed(
            path,
            payload,
            Some(row),
            format!("id {v} does not fit a signed 64-bit integer"),
        )
    })
}

/// A record of ids as a record with the one field `tokens`.
fn ids_record(path: &str, payload: RecordPayload, row: u64, bytes: &[u8]) -> Result<Record> {
    let mut ids = Vec::new();
    decode_ids(path, payload, row, bytes, &mut ids)?;
    Ok(vec![(
        TOKENS_FIELD.to_owned(),
        Value::List(ids.into_iter().map(Value::Int).collect()),
    )])
}

impl ShardReader for ChunkReader {
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        _prefetched: Option<super::Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        super::each_range(ranges, |range, out_row| {
            Ok(self.project(range, projection, chunk, out_row)?)
        })
    }
}

/// A file's records read as token documents: the ids of each record, or the integer list in
/// field `field` of each JSON or `MessagePack` record.
#[derive(Debug)]
struct ArrayRecordTokens {
    index: Arc<ArrayRecordIndex>,
    field: String,
}

impl TokenRecords for ArrayRecordTokens {
    fn rows(&self) -> u64 {
        self.index.rows()
    }

    fn scratch(&self) -> u64 {
        self.index.scratch()
    }

    fn for_each(
        &self,
        object: &Arc<Object>,
        records: &[Range<u64>],
        values: bool,
        each: &mut EachTokens<'_>,
    ) -> Result<()> {
        let payload = self.index.payload;
        let mut reader = ChunkReader::new(object.clone(), self.index.clone());
        let path = object.uri();
        let mut ids: Vec<i64> = Vec::new();
        for range in records {
            for row in range.clone() {
                let k = self.index.chunk_of(row);
                let at = (row - self.index.starts[k]) as usize;
                ids.clear();
                if let Some(ty) = id_type(payload) {
                    // Lengths come from the chunk's sizes alone; values only when asked for.
                    let chunk = reader.chunk(k, values)?;
                    if !values {
                        let size = chunk.size(at);
                        if !size.is_multiple_of(ty.width) {
                            return Err(malformed(
                                path,
                                payload,
                                Some(row),
                                format!(
                                    "a record of {size} bytes is not a whole number of {} ids",
                                    ty.name()
                                ),
                            ));
                        }
                        each(row, size / ty.width, &[])?;
                        continue;
                    }
                    decode_ids(path, payload, row, chunk.get(at), &mut ids)?;
                } else {
                    let bytes = reader.record_bytes(row)?;
                    let record = match payload {
                        RecordPayload::Json => {
                            read_record(&mut serde_json::Deserializer::from_slice(bytes))
                        }
                        _ => read_record(&mut rmp_serde::Deserializer::from_read_ref(bytes)),
                    }
                    .map_err(|message| malformed(path, payload, Some(row), message))?;
                    let not_ids = |what: &str| Error::Projection {
                        path: path.to_owned(),
                        row,
                        field: self.field.clone(),
                        source_field: self.field.clone(),
                        message: format!(
                            "a token stage reads a list of integer ids; this is {what}"
                        ),
                    };
                    let value = record
                        .into_iter()
                        .find(|(name, _)| *name == self.field)
                        .map(|(_, v)| v)
                        .ok_or_else(|| not_ids("missing"))?;
                    value.push_ids(&mut ids).map_err(|what| not_ids(&what))?;
                }
                each(row, ids.len() as u64, &ids)?;
            }
        }
        Ok(())
    }
}
