//! Megatron-LM / `NeMo` indexed datasets, read in place: a `.bin` of token sequences and the
//! `.idx` beside it that gives each sequence's length and byte offset and groups sequences into
//! documents (`docs/corpora.md`).
//!
//! The shard's location is the `.bin` (its reads, size and version); the `.idx` is read once at
//! inspection, in bounded pieces, and every count and offset in it is checked against the two
//! files' sizes before anything is sized from it. A document, the sequences between two
//! document indices, is one record (its ids under [`TOKEN_FIELD`]) and one document for packing.

use std::io::Write;
use std::ops::Range;
use std::sync::Arc;

use serde::de::IntoDeserializer;

use super::format::{
    read_in_place, EachRecord, Listed, RecordInspection, RecordSource, ShardFormat,
};
use super::token_ids::IdType;
use super::value::{Record, Value};
use super::{PageCache, ReadFailure, ShardData, ShardIndex, ShardMeta, ShardReader};
use crate::columns::{Chunk, ColumnBuf};
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::record::project_record;
use crate::storage::{Object, Pin, Storage};

/// The field a document's ids are under when it is read as a record.
pub const TOKEN_FIELD: &str = "tokens";
/// The `.idx` file's first bytes.
pub const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
/// Bytes before the `.idx` arrays: magic, version (u64), dtype code (u8), sequence and document
/// counts (u64 each).
pub const HEADER_BYTES: u64 = 34;
/// Entries of an `.idx` array read at a time: the index is never held whole.
const PIECE_ENTRIES: u64 = 1 << 20;

/// The type of a dataset's elements, by Megatron's dtype code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    /// Integer ids (codes 1-5 and 8).
    Ids(IdType),
    /// `float32` (code 7): read as records only.
    F32,
    /// `float64` (code 6): read as records only.
    F64,
}

impl Element {
    /// The element type Megatron's `DType` code names.
    pub fn of_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Element::Ids(IdType::new(1, false)),
            2 => Element::Ids(IdType::new(1, true)),
            3 => Element::Ids(IdType::new(2, true)),
            4 => Element::Ids(IdType::new(4, true)),
            5 => Element::Ids(IdType::new(8, true)),
            6 => Element::F64,
            7 => Element::F32,
            8 => Element::Ids(IdType::new(2, false)),
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn width(self) -> u64 {
        match self {
            Element::Ids(ids) => ids.width,
            Element::F32 => 4,
            Element::F64 => 8,
        }
    }

    fn name(self) -> String {
        match self {
            Element::Ids(ids) => ids.name(),
            Element::F32 => "float32".to_owned(),
            Element::F64 => "float64".to_owned(),
        }
    }
}

/// What a dataset's `.idx` says, checked against its `.bin`.
#[derive(Debug)]
pub struct MegatronIndex {
    /// The type of the `.bin`'s elements.
    pub element: Element,
    /// Where each document starts in the `.bin`, in elements, then the `.bin`'s end.
    pub starts: Vec<u64>,
}

impl MegatronIndex {
    /// Documents in the dataset.
    pub fn documents(&self) -> u64 {
        self.starts.len() as u64 - 1
    }

    /// Elements of the longest document.
    pub fn longest(&self) -> u64 {
        self.starts
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
    }
}

/// A bound on bytes held, and the error for passing it.
pub type Held<'a> = (u64, &'a dyn Fn(u64) -> Error);

/// The `.idx` beside the dataset whose `.bin` is `bin_path`.
pub fn idx_path(bin_path: &str) -> String {
    format!("{}.idx", bin_path.strip_suffix(".bin").unwrap_or(bin_path))
}

fn malformed(path: &str, message: String) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: Encoding::Megatron.name(),
        row: None,
        message,
    }
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut le = [0u8; 8];
    le.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(le)
}

/// Reads and checks the `.idx` of the dataset whose `.bin` is `bin`. Every array must lie
/// within the `.idx` (its size must be exactly what its counts say), the sequences must be laid
/// end to end in the `.bin` from its start and fill it, and the document indices must run from
/// 0 to the sequence count without going back; the first entry that does not is named.
/// The document starts a caller holds for as long as it runs are bounded by `held`: at most
/// that many bytes (8 per document), or its error.
pub fn read_index(
    storage: &Storage,
    bin: &Object,
    held: Option<Held<'_>>,
) -> Result<MegatronIndex> {
    let path = idx_path(bin.uri());
    let idx = storage.open(&path).map_err(|e| match e {
        e @ Error::Cancelled { .. } => e,
        other => malformed(
            bin.uri(),
            format!(
                "a Megatron dataset's sequences and documents are listed in {path}, which \
                 cannot be read: {other}"
            ),
        ),
    })?;
    let bad = |message: String| malformed(&path, message);
    if idx.size() < HEADER_BYTES {
        return Err(bad(format!(
            "{} bytes is shorter than an index header ({HEADER_BYTES})",
            idx.size()
        )));
    }
    let header = idx.read_range(0..HEADER_BYTES)?;
    if &header[..9] != MAGIC {
        return Err(bad(
            "not a Megatron index: it does not start with MMIDIDX".to_owned()
        ));
    }
    let version = u64_at(&header, 9);
    if version != 1 {
        return Err(bad(format!(
            "index version {version}; Megatron's indexed datasets are version 1"
        )));
    }
    let code = header[17];
    let element = Element::of_code(code).ok_or_else(|| {
        bad(format!(
            "dtype code {code} is not one Megatron defines (1-8)"
        ))
    })?;
    let sequences = u64_at(&header, 18);
    let entries = u64_at(&header, 26);
    // 4 + 8 bytes per sequence, 8 per document index, and 1 per sequence when modes follow.
    let arrays = sequences
        .checked_mul(12)
        .and_then(|s| entries.checked_mul(8).and_then(|d| s.checked_add(d)))
        .and_then(|a| a.checked_add(HEADER_BYTES));
    let Some(plain) = arrays else {
        return Err(bad(format!(
            "its header counts {sequences} sequences and {entries} document indices, more \
             than any file holds"
        )));
    };
    if idx.size() != plain && Some(idx.size()) != plain.checked_add(sequences) {
        return Err(bad(format!(
            "the index is {} bytes; {sequences} sequences and {entries} document indices \
             take {plain} (or {} with sequence modes)",
            idx.size(),
            plain.saturating_add(sequences)
        )));
    }
    if entries == 0 {
        return Err(bad(
            "it lists no document indices; the first is always 0".to_owned()
        ));
    }
    if let Some((max, too_large)) = held {
        if entries.saturating_mul(8) > max {
            return Err(too_large(max));
        }
    }
    // The document indices, held as the documents' starts; their size was checked against the
    // file's above, so a forged count allocates nothing.
    let docs_at = HEADER_BYTES + 12 * sequences;
    let mut starts = Vec::with_capacity(entries as usize);
    for piece in pieces(entries) {
        let bytes = idx.read_range(docs_at + piece.start * 8..docs_at + piece.end * 8)?;
        starts.extend(bytes.chunks_exact(8).map(|b| u64_at(b, 0)));
    }
    if starts[0] != 0 {
        return Err(bad(format!(
            "document index 0 is {}; documents start at sequence 0",
            starts[0]
        )));
    }
    for (k, w) in starts.windows(2).enumerate() {
        if w[1] < w[0] || w[1] > sequences {
            return Err(bad(format!(
                "document index {} is {}, after {} (of {sequences} sequences): indices must \
                 not go back or past the sequences",
                k + 1,
                w[1] as i64,
                w[0]
            )));
        }
    }
    if starts[starts.len() - 1] != sequences {
        return Err(bad(format!(
            "the last document index is {}, not the sequence count {sequences}",
            starts[starts.len() - 1]
        )));
    }
    // Walk the sequences in pieces: each must start where the one before it ended.
    let width = element.width();
    let lengths_at = HEADER_BYTES;
    let pointers_at = HEADER_BYTES + 4 * sequences;
    let mut next_doc = 0usize;
    let mut element_at = 0u64;
    for piece in pieces(sequences) {
        let lengths = idx.read_range(lengths_at + piece.start * 4..lengths_at + piece.end * 4)?;
        let pointers =
            idx.read_range(pointers_at + piece.start * 8..pointers_at + piece.end * 8)?;
        for (k, (len, ptr)) in lengths
            .chunks_exact(4)
            .zip(pointers.chunks_exact(8))
            .enumerate()
        {
            let s = piece.start + k as u64;
            while next_doc < starts.len() && starts[next_doc] == s {
                starts[next_doc] = element_at;
                next_doc += 1;
            }
            let len = i32::from_le_bytes([len[0], len[1], len[2], len[3]]);
            let ptr = u64_at(ptr, 0);
            if len < 0 {
                return Err(bad(format!("sequence {s} has length {len}")));
            }
            if ptr != element_at * width {
                return Err(bad(format!(
                    "sequence {s} starts at byte {ptr} of the .bin, not {}: sequences are read \
                     laid end to end, as Megatron's builder writes them",
                    element_at * width
                )));
            }
            element_at += len as u64;
            if element_at * width > bin.size() {
                return Err(bad(format!(
                    "sequence {s} ends at byte {} of {}, which holds {} bytes",
                    element_at * width,
                    bin.uri(),
                    bin.size()
                )));
            }
        }
    }
    // The trailing indices equal to the sequence count: documents ending at the `.bin`'s end.
    for start in &mut starts[next_doc..] {
        *start = element_at;
    }
    if element_at * width != bin.size() {
        return Err(bad(format!(
            "its sequences cover {} bytes of {}, which holds {}",
            element_at * width,
            bin.uri(),
            bin.size()
        )));
    }
    Ok(MegatronIndex { element, starts })
}

/// Entry ranges of an array of `count` entries, at most [`PIECE_ENTRIES`] at a time.
fn pieces(count: u64) -> impl Iterator<Item = Range<u64>> {
    (0..count.div_ceil(PIECE_ENTRIES))
        .map(move |p| p * PIECE_ENTRIES..((p + 1) * PIECE_ENTRIES).min(count))
}

/// Megatron indexed datasets.
pub struct Megatron;

impl ShardFormat for Megatron {
    fn encoding(&self) -> Encoding {
        Encoding::Megatron
    }

    fn shard_location(&self, configured: &str) -> String {
        // Megatron's own names are lower case (`get_bin_path`, `get_idx_path`).
        if configured.strip_suffix(".bin").is_some() {
            return configured.to_owned();
        }
        let prefix = configured.strip_suffix(".idx").unwrap_or(configured);
        format!("{prefix}.bin")
    }

    fn expand(&self, storage: &Storage, configured: &str, _option: &str) -> Result<Vec<Listed>> {
        if configured.strip_suffix(".idx").is_some() {
            // Looked for by the name given first: a missing `.idx` is reported as the file the
            // config names, not as the `.bin` it stands for.
            storage.open(configured)?;
        }
        Ok(vec![(self.shard_location(configured), None)])
    }

    fn reads_tokens(&self) -> bool {
        true
    }

    fn inspect(&self, object: Arc<Object>, how: RecordInspection<'_>) -> Result<ShardMeta> {
        let index = Arc::new(read_index(how.storage, &object, None)?);
        let longest = index.longest() * index.element.width();
        if how.first_record && index.documents() > 0 {
            let mut reader = DocumentReader::new(object.clone(), index.clone());
            let mut chunk = Chunk::padded(how.projection, 1);
            reader
                .project(0..1, how.projection, &mut chunk)
                .map_err(|f| f.error)?;
        }
        Ok(ShardMeta {
            dropped: crate::formats::Dropped::default(),
            rows: index.documents(),
            // A job reads its documents' bytes in one piece and widens them to one record.
            scratch_bytes: crate::memory::MAX_JOB_ROWS * longest + 8 * longest,
            pin: Pin::default(),
            longest_record: longest,
            index,
        })
    }

    fn records(
        &self,
        storage: &Storage,
        object: Arc<Object>,
        _chunk_rows: usize,
    ) -> Result<Box<dyn RecordSource>> {
        let index = Arc::new(read_index(storage, &object, None)?);
        let reader = DocumentReader::new(object, index);
        Ok(Box::new(EachRecord::new(
            reader,
            DocumentReader::next_record,
        )))
    }

    fn write(&self, _out: &mut (dyn Write + Send), _data: ShardData<'_>, name: &str) -> Result<()> {
        Err(read_in_place(
            name,
            "Megatron datasets",
            "records with a token list field as parquet",
        ))
    }
}

impl ShardIndex for MegatronIndex {
    fn open(
        self: Arc<Self>,
        object: Arc<Object>,
        _meta: &ShardMeta,
        _pages: Option<&Arc<PageCache>>,
    ) -> Result<Box<dyn ShardReader>> {
        Ok(Box::new(DocumentReader::new(object, self)))
    }
}

/// Reads a dataset's documents as records.
struct DocumentReader {
    object: Arc<Object>,
    index: Arc<MegatronIndex>,
    /// The next document [`DocumentReader::next_record`] reads.
    next: u64,
    /// The bytes of the documents a read projects, kept for the next read.
    buf: Vec<u8>,
}

impl DocumentReader {
    fn new(object: Arc<Object>, index: Arc<MegatronIndex>) -> Self {
        DocumentReader {
            object,
            index,
            next: 0,
            buf: Vec::new(),
        }
    }

    /// Reads the bytes of documents `docs` into `self.buf`, in one request; returns the
    /// element the bytes start at.
    fn load(&mut self, docs: Range<u64>) -> Result<u64> {
        let n = self.index.documents();
        if docs.end > n {
            return Err(Error::Format {
                path: self.object.uri().to_owned(),
                encoding: Encoding::Megatron.name(),
                row: Some(docs.end - 1),
                message: format!("the dataset has {n} documents"),
            });
        }
        let width = self.index.element.width();
        let first = self.index.starts[docs.start as usize];
        let last = self.index.starts[docs.end as usize];
        self.object
            .read_range_into(first * width..last * width, &mut self.buf)?;
        Ok(first)
    }

    /// Document `doc`'s elements as values, from `bytes` (which start at element `first`).
    fn values(&self, bytes: &[u8], first: u64, doc: u64) -> Vec<Value> {
        let width = self.index.element.width();
        let (s, e) = (
            self.index.starts[doc as usize] - first,
            self.index.starts[doc as usize + 1] - first,
        );
        let raw = &bytes[(s * width) as usize..(e * width) as usize];
        match self.index.element {
            Element::Ids(ids) => {
                let mut out = Vec::new();
                match ids.decode(raw, &mut out) {
                    Ok(()) => out.into_iter().map(Value::Int).collect(),
                    // A `uint64` id above `i64::MAX`: every id as it is.
                    Err(_) => raw
                        .chunks_exact(8)
                        .map(|b| {
                            let u = u64_at(b, 0);
                            i64::try_from(u).map_or(Value::UInt(u), Value::Int)
                        })
                        .collect(),
                }
            }
            Element::F32 => raw
                .chunks_exact(4)
                .map(|b| Value::Float(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))))
                .collect(),
            Element::F64 => raw
                .chunks_exact(8)
                .map(|b| Value::Float(f64::from_bits(u64_at(b, 0))))
                .collect(),
        }
    }

    /// Document `doc` as a record: its elements under [`TOKEN_FIELD`].
    fn record(&self, bytes: &[u8], first: u64, doc: u64) -> Record {
        vec![(
            TOKEN_FIELD.to_owned(),
            Value::List(self.values(bytes, first, doc)),
        )]
    }

    /// Projects documents `docs` into consecutive rows of `chunk` from row `out_row`.
    fn project_at(
        &mut self,
        docs: Range<u64>,
        projection: &Projection,
        chunk: &mut Chunk,
        out_row: usize,
    ) -> Result<()> {
        let first = self.load(docs.clone())?;
        let bytes = std::mem::take(&mut self.buf);
        let projected = self.project_bytes(&bytes, first, docs, projection, (chunk, out_row));
        self.buf = bytes;
        projected
    }

    /// Projects documents `docs`, whose bytes are `bytes` (from element `first`).
    fn project_bytes(
        &self,
        bytes: &[u8],
        first: u64,
        docs: Range<u64>,
        projection: &Projection,
        (chunk, out_row): (&mut Chunk, usize),
    ) -> Result<()> {
        let mut ids = Vec::new();
        for (k, doc) in docs.enumerate() {
            if self.project_ids(
                bytes,
                first,
                doc,
                projection,
                (chunk, out_row + k),
                &mut ids,
            ) {
                continue;
            }
            let record = Value::Map(self.record(bytes, first, doc)).into_deserializer();
            let result = project_record(record, projection, &mut chunk.columns, out_row + k);
            result.map_err(|e| {
                let fields = crate::record::RecordFields::Known(&[TOKEN_FIELD]);
                e.into_error(
                    projection,
                    self.object.uri(),
                    (Encoding::Megatron.name(), Some(fields)),
                    doc,
                )
            })?;
        }
        Ok(())
    }

    /// Projects document `doc` straight into its row when the stage reads its ids alone into one
    /// integer list column, as a token corpus's records are read; false where it does not (or an
    /// id does not fit), and the general projection runs, which names what does not fit.
    fn project_ids(
        &self,
        bytes: &[u8],
        first: u64,
        doc: u64,
        projection: &Projection,
        (chunk, row): (&mut Chunk, usize),
        ids: &mut Vec<i64>,
    ) -> bool {
        let ([column], Element::Ids(kind)) = (&projection.columns[..], self.index.element) else {
            return false;
        };
        if column.source != TOKEN_FIELD || column.shape.len() != 1 || !column.plain() {
            return false;
        }
        let w = column.width;
        let start = self.index.starts[doc as usize] - first;
        let len = (self.index.starts[doc as usize + 1] - first - start) as usize;
        // Elements past the field's length are not read, as the general projection skips them.
        let n = len.min(w);
        let width = kind.width as usize;
        let raw = &bytes[start as usize * width..(start as usize + n) * width];
        let out = &mut chunk.columns[0];
        let at = row * w;
        // The widths a token corpus uses, straight from the file's bytes into the column.
        match (&mut *out, kind.width, kind.signed) {
            (ColumnBuf::I32(buf), 4, true) => {
                for (o, b) in buf[at..at + n].iter_mut().zip(raw.chunks_exact(4)) {
                    *o = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            (ColumnBuf::I32(buf), 2, false) => {
                for (o, b) in buf[at..at + n].iter_mut().zip(raw.chunks_exact(2)) {
                    *o = i32::from(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            (ColumnBuf::I64(buf), 4, true) => {
                for (o, b) in buf[at..at + n].iter_mut().zip(raw.chunks_exact(4)) {
                    *o = i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                }
            }
            (ColumnBuf::I64(buf), 2, false) => {
                for (o, b) in buf[at..at + n].iter_mut().zip(raw.chunks_exact(2)) {
                    *o = i64::from(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            (buf, _, _) => {
                ids.clear();
                if kind.decode(raw, ids).is_err() {
                    return false;
                }
                match buf {
                    ColumnBuf::I64(buf) => buf[at..at + n].copy_from_slice(ids),
                    ColumnBuf::I32(buf) => {
                        for (o, &v) in buf[at..at + n].iter_mut().zip(ids.iter()) {
                            let Ok(v) = i32::try_from(v) else {
                                return false;
                            };
                            *o = v;
                        }
                    }
                    _ => return false,
                }
            }
        }
        out.fill_pad(at + n..at + w, column.pad);
        true
    }

    fn project(
        &mut self,
        docs: Range<u64>,
        projection: &Projection,
        chunk: &mut Chunk,
    ) -> std::result::Result<(), ReadFailure> {
        Ok(self.project_at(docs, projection, chunk, 0)?)
    }

    /// The next whole document as a record, and its number; `None` after the last.
    fn next_record(&mut self) -> Result<Option<(u64, Record)>> {
        let doc = self.next;
        if doc >= self.index.documents() {
            return Ok(None);
        }
        let first = self.load(doc..doc + 1)?;
        let record = self.record(&self.buf, first, doc);
        self.next += 1;
        Ok(Some((doc, record)))
    }
}

impl ShardReader for DocumentReader {
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        _prefetched: Option<super::Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        super::each_range(ranges, |range, out_row| {
            Ok(self.project_at(range, projection, chunk, out_row)?)
        })
    }
}

/// What token inspection needs of a dataset: its ids' type and its documents' starts.
pub(super) fn token_file(
    storage: &Storage,
    object: &Object,
    held: Held<'_>,
) -> Result<(IdType, Vec<u64>)> {
    let index = read_index(storage, object, Some(held))?;
    match index.element {
        Element::Ids(ids) => Ok((ids, index.starts)),
        other => Err(Error::Unsupported {
            path: object.uri().to_owned(),
            encoding: Encoding::Megatron.name(),
            message: format!(
                "its elements are {}, not token ids: read it as records (without packing or \
                 windows)",
                other.name()
            ),
        }),
    }
}
