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

use std::collections::HashMap;
use std::io::{Read, Write};
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::IntoDeserializer;
use serde::Deserialize;

use super::format::{
    read_in_place, EachRecord, EachTokens, Listed, RecordInspection, RecordSource, ShardFormat,
    TokenRecords,
};
use super::value::{Record, Value};
use super::{
    PageCache, Promise, PromiseOrigin, ReadFailure, ShardData, ShardIndex, ShardMeta, ShardReader,
};
use crate::columns::Chunk;
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::record::project_record;
use crate::storage::{sibling, Object, Pin, Storage};
use columns::Column;

mod columns;

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

/// A parsed `index.json`, with its shards by file name.
struct ParsedIndex {
    path: String,
    pin: crate::storage::Pin,
    index: IndexFile,
    by_name: HashMap<String, usize>,
}

/// Parsed indexes a thread keeps: each shard of a dataset is inspected alone, and parsing its
/// `index.json` for each one made opening a dataset of n shards cost n parses of an index of n
/// entries. Per thread, so nothing is shared across a fork; keyed by the index's location and
/// pin, so a rewritten index is read again.
const PARSED_KEPT: usize = 4;

thread_local! {
    static PARSED: std::cell::RefCell<Vec<Arc<ParsedIndex>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The `index.json` of the dataset directory `dir`, parsed once per thread while it is
/// unchanged.
fn parsed_index(storage: &Storage, dir: &str) -> Result<Arc<ParsedIndex>> {
    let path = format!("{}/{INDEX_FILE}", dir.trim_end_matches('/'));
    let object = storage.open(&path)?;
    let pin = object.pin();
    let known = PARSED.with(|kept| {
        kept.borrow()
            .iter()
            .find(|p| p.path == path && p.pin == pin)
            .cloned()
    });
    if let Some(parsed) = known {
        return Ok(parsed);
    }
    let index = parse_index(&path, &object)?;
    let by_name = index
        .shards
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let name = s.file().basename.rsplit('/').next().unwrap_or_default();
            (name.to_owned(), k)
        })
        .rev() // the first of a name repeated wins, as a search from the start would find it
        .collect();
    let parsed = Arc::new(ParsedIndex {
        path,
        pin,
        index,
        by_name,
    });
    PARSED.with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.len() == PARSED_KEPT {
            kept.remove(0);
        }
        kept.push(parsed.clone());
    });
    Ok(parsed)
}

/// Reads the `index.json` of the dataset directory `dir`.
fn read_index(storage: &Storage, dir: &str) -> Result<(String, IndexFile)> {
    let path = format!("{}/{INDEX_FILE}", dir.trim_end_matches('/'));
    let object = storage.open(&path)?;
    let index = parse_index(&path, &object)?;
    Ok((path, index))
}

/// Parses the `index.json` `object` (at `path`), refusing one too large to be an index.
fn parse_index(path: &str, object: &Object) -> Result<IndexFile> {
    if object.size() > MAX_INDEX_BYTES {
        return Err(malformed(
            path,
            None,
            format!("{} bytes is not an MDS index.json", object.size()),
        ));
    }
    let bytes = object.read_range(0..object.size())?;
    let index: IndexFile = serde_json::from_slice(&bytes)
        .map_err(|e| malformed(path, None, format!("not an MDS index.json: {e}")))?;
    if index.version != 2 {
        return Err(unsupported(
            path,
            format!(
                "index version {}; MDS index version 2 is read",
                index.version
            ),
        ));
    }
    Ok(index)
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

/// A shard file of an MDS dataset, as its `index.json` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedShard {
    /// Its location.
    pub path: String,
    /// Its samples.
    pub samples: u64,
    /// The size of the file a stream reads (the compressed one where there is one).
    pub bytes: u64,
}

/// The shard files of the MDS dataset in directory `dir`, in its `index.json`'s order, with
/// their sample counts and sizes: the index is the dataset's manifest, so that opening a
/// dataset of many shards reads one file, not each shard.
pub fn dataset_files(storage: &Storage, dir: &str, option: &str) -> Result<Vec<ListedShard>> {
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
            Ok(ListedShard {
                path: sibling(&index_path, name),
                samples: shard.samples,
                bytes: shard.file().bytes,
            })
        })
        .collect()
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
    let parsed = parsed_index(storage, dir).map_err(|e| match e {
        Error::NotFound { path: missing } => malformed(
            path,
            None,
            format!("an MDS shard is described by {missing}, which does not exist"),
        ),
        other => other,
    })?;
    let index_path = &parsed.path;
    let info = parsed
        .by_name
        .get(name)
        .map(|&k| parsed.index.shards[k].clone())
        .ok_or_else(|| {
            malformed(
                index_path,
                None,
                format!("it does not list {name}, so its columns and count are unknown"),
            )
        })?;
    let bad = |message: String| malformed(index_path, None, format!("{name}: {message}"));
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

    fn names_directory(&self, configured: &str) -> bool {
        !configured.contains(".mds")
    }

    fn directory_shards(&self, storage: &Storage, dir: &str, option: &str) -> Result<Vec<Listed>> {
        // An MDS dataset's index.json lists each shard's samples and size, as a manifest does:
        // its shards are promised by it, not each looked at.
        let listed = dataset_files(storage, dir, option)?;
        Ok(listed
            .into_iter()
            .map(|shard| {
                let promise = Promise {
                    origin: PromiseOrigin::Index,
                    rows: shard.samples,
                    bytes: Some(shard.bytes),
                    version: None,
                    sha256: None,
                };
                (shard.path, Some(promise))
            })
            .collect())
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
            dropped: crate::formats::Dropped::default(),
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
        Err(read_in_place(name, "MDS shards", "as parquet"))
    }
}

impl ShardIndex for MdsIndex {
    fn open(
        self: Arc<Self>,
        object: Arc<Object>,
        _meta: &ShardMeta,
        pages: Option<&Arc<PageCache>>,
    ) -> Result<Box<dyn ShardReader>> {
        let mut reader = SampleReader::new(object, self);
        // A compressed shard is fetched once for every job of the stream (and its readers on
        // other decode threads): its compressed bytes are kept, about half its inflated size,
        // so that the shards a shuffle window spans fit the cache; each reader inflates them.
        reader.shared = pages.map(|cache| (cache.clone(), PageCache::key_of(&reader.object)));
        Ok(Box::new(reader))
    }
}

/// Reads a shard's samples.
struct SampleReader {
    object: Arc<Object>,
    index: Arc<MdsIndex>,
    /// A compressed shard, inflated once.
    inflated: Option<Bytes>,
    /// Where the stream keeps compressed shards for its other readers, and this shard's key.
    shared: Option<(Arc<PageCache>, String)>,
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
            shared: None,
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
                let whole = 0..self.object.size();
                let data = match &self.shared {
                    Some((cache, key)) => cache.read_through(key, &self.object, whole)?,
                    None => self.object.read_range(whole)?,
                };
                let inflated = Bytes::from(inflate(self.path(), codec, &data, raw_len)?);
                self.inflated = Some(inflated);
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
            .map_err(|e| {
                e.into_error(projection, self.path(), (Encoding::Mds.name(), None), row)
            })?;
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
                match record.into_iter().next() {
                    Some((_, value)) => value.push_ids(&mut ids).map_err(|what| not_ids(&what))?,
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
        super::each_range(ranges, |range, out_row| {
            Ok(self.project(range, projection, chunk, out_row)?)
        })
    }
}
