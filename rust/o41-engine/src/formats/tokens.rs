//! Token shards: a `.bin` file of token ids (its dtype and eos id in a sibling `meta.json`), or
//! a Parquet column of token lists read as one stream. A stage that packs or windows tokens
//! reads such a shard as rows of windows (`order::pack`): inspection reads the shard's document
//! boundaries and plans its windows, and the reader fills each window's tokens, segment ids and
//! positions.
//!
//! `.bin` shards are read with positional reads through the storage layer (ranged requests for
//! `s3://`), not a memory map: the stream's files may be replaced or truncated while it runs,
//! which a mapping would turn into a `SIGBUS`, while a read returns an error that the pinned
//! reader reports. The page cache makes repeated local reads as cheap as a mapping's.

use std::io::Read;
use std::ops::Range;
use std::sync::Arc;

use serde::Deserialize;

use super::{parquet, ReadFailure, ShardIndex, ShardMeta, ShardReader};
use crate::columns::{Chunk, ColumnBuf};
pub use crate::config::WindowColumn;
use crate::config::{FieldSpec, TokenLayout};
use crate::dtype::DType;
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::inspect_cache::InspectCache;
use crate::order::pack::{
    most_stream_pieces, stream_window, stream_window_pieces, stream_windows, PackPlan, Packer,
    Piece,
};
use crate::storage::{sibling, Object, Storage};

/// The file beside a `.bin` shard that describes it.
pub const META_FILE: &str = "meta.json";
/// A `meta.json` larger than this is not one.
const MAX_META_BYTES: u64 = 1 << 20;
/// Bytes read at a time when a `.bin` shard is scanned for document ends.
const SCAN_BYTES: usize = 1 << 20;
/// Most rows one read job decodes (the planner's job size).
const JOB_ROWS: u64 = crate::memory::MAX_JOB_ROWS;

/// What a `.bin` shard's `meta.json` says.
#[derive(Debug, Deserialize)]
struct BinMeta {
    /// `uint16` or `uint32`.
    dtype: String,
    /// The id that ends each document, if the corpus marks them.
    #[serde(default)]
    eos_id: Option<u64>,
}

/// Where a shard's tokens are.
#[derive(Debug)]
enum TokenFile {
    /// Little-endian ids of `width` bytes.
    Bin { width: u64 },
    /// Records of one list column; record `r` holds tokens `record_starts[r]..record_starts[r + 1]`.
    Parquet {
        index: Arc<parquet::ParquetIndex>,
        projection: Projection,
        record_starts: Vec<u64>,
    },
}

/// A token shard as a stage reads it: its stream, and its windows.
#[derive(Debug)]
pub struct TokenIndex {
    layout: TokenLayout,
    file: TokenFile,
    /// Tokens in the shard's stream.
    tokens: u64,
    /// Windows of a packed layout; stream windows are computed.
    plan: Option<PackPlan>,
    /// Where each document of the stream starts, then the stream's end, for stream windows cut
    /// at an eos id (a Parquet shard's records serve otherwise).
    starts: Option<Vec<u64>>,
}

impl TokenIndex {
    /// Rows (windows) of the shard.
    pub fn windows(&self) -> u64 {
        match &self.plan {
            Some(plan) => plan.windows(),
            None => stream_windows(self.tokens, self.layout.row_tokens() - 1),
        }
    }

    /// Tokens of the shard's stream.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Tokens the windows hold, padding excluded: every token of a packing once; a stream
    /// window's overlapping token twice.
    pub fn placed(&self) -> u64 {
        match &self.plan {
            Some(plan) => plan.tokens(),
            None => match self.tokens {
                0 | 1 => self.tokens,
                t => t + self.windows() - 1,
            },
        }
    }

    /// Tokens in one window, padding included.
    pub fn row_tokens(&self) -> u64 {
        self.layout.row_tokens()
    }

    /// Bytes the index holds for as long as the stream runs: the packing plan or the
    /// documents' starts, and a Parquet shard's record offsets.
    pub fn bytes(&self) -> u64 {
        let records = match &self.file {
            TokenFile::Parquet { record_starts, .. } => 8 * record_starts.len() as u64,
            TokenFile::Bin { .. } => 0,
        };
        let starts = self.starts.as_ref().map_or(0, |s| 8 * s.len() as u64);
        records + starts + self.plan.as_ref().map_or(0, PackPlan::bytes)
    }

    /// The largest position within its document of any token the windows hold (0 for none):
    /// what an `@positions` column must be able to hold.
    pub fn largest_position(&self) -> u64 {
        match (&self.plan, self.documents()) {
            (Some(plan), _) => plan.largest_position(),
            // Stream windows count positions from each document's start.
            (None, Some(starts)) => starts
                .windows(2)
                .map(|r| r[1] - r[0])
                .max()
                .unwrap_or(0)
                .saturating_sub(1),
            (None, None) => self.tokens.saturating_sub(1),
        }
    }

    /// Most pieces of any window: the length an `@segment_lengths` row needs.
    pub fn most_pieces(&self) -> u64 {
        match (&self.plan, self.documents()) {
            (Some(plan), _) => plan.most_pieces(),
            (None, Some(starts)) => most_stream_pieces(self.tokens, self.stride(), starts),
            (None, None) => 1,
        }
    }

    /// Where the documents of the stream start, then its end, for stream windows: those cut at
    /// an eos id, or else a Parquet shard's records; `None` for a `.bin` stream not cut.
    fn documents(&self) -> Option<&[u64]> {
        match (&self.starts, &self.file) {
            (Some(starts), _) => Some(starts),
            (None, TokenFile::Parquet { record_starts, .. }) => Some(record_starts),
            (None, TokenFile::Bin { .. }) => None,
        }
    }

    /// Tokens between stream windows' starts.
    fn stride(&self) -> u64 {
        self.layout.row_tokens() - 1
    }

    /// Window `w`'s pieces, appended to `out`. A stream window is cut where a document starts
    /// inside it ([`TokenIndex::documents`]); a `.bin` stream not cut at an eos id has no
    /// documents known, and its window is one piece.
    fn pieces(&self, w: u64, out: &mut Vec<Piece>) {
        match (&self.plan, self.documents()) {
            (Some(plan), _) => out.extend_from_slice(plan.window(w)),
            (None, Some(starts)) => {
                stream_window_pieces(self.tokens, self.stride(), w, starts, out);
            }
            (None, None) => out.push(stream_window(self.tokens, self.stride(), w)),
        }
    }
}

fn malformed(path: &str, encoding: Encoding, row: Option<u64>, message: String) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: encoding.name(),
        row,
        message,
    }
}

/// Reads `path`'s `meta.json`: the width of its ids and its eos id.
fn bin_meta(storage: &Storage, path: &str) -> Result<(u64, Option<u64>)> {
    let meta_path = sibling(path, META_FILE);
    let object = storage.open(&meta_path).map_err(|e| match e {
        e @ Error::Cancelled { .. } => e,
        other => malformed(
            path,
            Encoding::Bin,
            None,
            format!(
                "a .bin shard is described by {meta_path} (its dtype and eos id), which cannot \
                 be read: {other}"
            ),
        ),
    })?;
    let bad = |message: String| malformed(&meta_path, Encoding::Bin, None, message);
    if object.size() > MAX_META_BYTES {
        return Err(bad(format!(
            "{} bytes is not a meta.json (at most {MAX_META_BYTES})",
            object.size()
        )));
    }
    let text = object.read_range(0..object.size())?;
    let meta: BinMeta = serde_json::from_slice(&text)
        .map_err(|e| bad(format!("not a token corpus description: {e}")))?;
    let width = match meta.dtype.as_str() {
        "uint16" | "u16" => 2,
        "uint32" | "u32" => 4,
        other => {
            return Err(bad(format!(
                "dtype '{other}' is not a token id type; expected uint16 or uint32"
            )))
        }
    };
    Ok((width, meta.eos_id))
}

/// The one-column projection a Parquet token shard is inspected with.
fn token_projection(field: &str) -> Result<Projection> {
    Projection::new(&[FieldSpec {
        name: field.to_owned(),
        source: field.to_owned(),
        dtype: DType::I64,
        shape: vec![1],
        pad: serde_json::Value::from(0),
    }])
}

/// Refuses a Parquet shard whose column `field` is not a list of integer ids, naming it.
fn check_token_column(path: &str, index: &parquet::ParquetIndex, field: &str) -> Result<()> {
    let Some(data_type) = parquet::projected_type(index) else {
        // An empty shard has no columns to check, and no tokens.
        return Ok(());
    };
    let ids = match data_type {
        arrow_schema::DataType::List(item)
        | arrow_schema::DataType::LargeList(item)
        | arrow_schema::DataType::FixedSizeList(item, _) => item.data_type().is_integer(),
        _ => false,
    };
    if ids {
        return Ok(());
    }
    Err(Error::Projection {
        path: path.to_owned(),
        row: 0,
        field: field.to_owned(),
        source_field: field.to_owned(),
        message: format!(
            "a token stage reads a list of integer ids from it; the shard's column is {data_type}"
        ),
    })
}

/// Where inspection puts the documents it finds: packing places them in windows, stream
/// windows cut at an eos id keep where each starts.
enum Documents {
    Pack(Packer),
    Starts(Vec<u64>),
}

impl Documents {
    fn of(layout: &TokenLayout) -> Option<Self> {
        match layout {
            TokenLayout::Packed(p) => {
                Some(Documents::Pack(Packer::new(p.seq_len, p.bins as usize)))
            }
            TokenLayout::Windows(w) => w.eos_id.map(|_| Documents::Starts(Vec::new())),
        }
    }

    /// Document `start..start + len` of the stream.
    fn push(&mut self, start: u64, len: u64) {
        match self {
            Documents::Pack(packer) => packer.push(start, len),
            Documents::Starts(starts) => starts.push(start),
        }
    }

    /// Bytes held so far, against the stream's memory limit.
    fn bytes(&self) -> u64 {
        match self {
            Documents::Pack(packer) => packer.bytes(),
            Documents::Starts(starts) => 8 * starts.len() as u64,
        }
    }

    /// The packing plan, or the starts followed by the stream's end.
    fn finish(self, tokens: u64) -> (Option<PackPlan>, Option<Vec<u64>>) {
        match self {
            Documents::Pack(packer) => (Some(packer.finish()), None),
            Documents::Starts(mut starts) => {
                starts.push(tokens);
                (None, Some(starts))
            }
        }
    }
}

/// Inspects a token shard for `layout`: counts its tokens, reads its document boundaries where
/// the layout packs or cuts windows at an eos id, and plans its windows. A plan needing more
/// than `max_plan` bytes is refused before it grows past them. A Parquet shard whose documents
/// are its records is planned from its list lengths in `cache` when they are there (they are
/// stored there when not), without decoding its token column; the reader holds every record to
/// those lengths.
pub fn inspect(
    storage: &Storage,
    object: &Arc<Object>,
    encoding: Encoding,
    layout: &TokenLayout,
    max_plan: u64,
    cache: Option<&InspectCache>,
) -> Result<ShardMeta> {
    let path = object.uri().to_owned();
    let eos = match layout {
        TokenLayout::Packed(p) => p.eos_id,
        TokenLayout::Windows(w) => w.eos_id,
    };
    let mut documents = Documents::of(layout);
    let too_large = |bytes: u64| {
        Error::config(
            "memory_limit_bytes",
            format!(
                "{path}: its window plan needs more than {bytes} bytes (24 per placed document \
                 piece, 8 per record), more than the stream's memory limit leaves; raise \
                 memory_limit_bytes or split the corpus into more shards"
            ),
        )
    };
    let row_tokens = layout.row_tokens();
    let (file, tokens, scratch) = match encoding {
        Encoding::Bin => {
            let (width, meta_eos) = bin_meta(storage, &path)?;
            if !object.size().is_multiple_of(width) {
                return Err(malformed(
                    &path,
                    encoding,
                    None,
                    format!(
                        "{} bytes is not a whole number of {width}-byte token ids",
                        object.size()
                    ),
                ));
            }
            let tokens = object.size() / width;
            if let Some(documents) = documents.as_mut() {
                let Some(eos) = eos.or(meta_eos) else {
                    return Err(Error::config(
                        "packing.eos_id",
                        format!(
                            "{path}: packing a .bin shard cuts its stream at an eos id, and \
                             neither its meta.json nor the packing names one"
                        ),
                    ));
                };
                scan_bin(object, width, eos, documents, max_plan, &too_large)?;
            }
            // A job fetches its windows' bytes, and at most as many again in the gaps it reads
            // through to save requests.
            let scratch = 2 * JOB_ROWS * row_tokens * width;
            (TokenFile::Bin { width }, tokens, scratch)
        }
        Encoding::Parquet => {
            let projection = token_projection(layout.field())?;
            // Every shard of a token stage is inspected at open: its footer, not a page, says
            // whether the token column is one (its ids are checked against the dtype as read).
            let meta = parquet::inspect_footer(object.clone(), &projection)?;
            let index = parquet::index_of(&meta).ok_or_else(|| Error::Internal {
                message: "a Parquet inspection without its index".to_owned(),
            })?;
            check_token_column(&path, &index, layout.field())?;
            // Record offsets are held for the stream's life: a shard of many (empty) records
            // must not reserve more than the limit leaves.
            if (meta.rows + 1).saturating_mul(8) > max_plan {
                return Err(too_large(max_plan));
            }
            let mut record_starts = Vec::with_capacity(meta.rows as usize + 1);
            let mut tokens = 0u64;
            let mut longest = 0u64;
            let mut doc_start = 0u64;
            // Only an eos cut needs the ids; counts and record documents need the lengths.
            let values = eos.is_some() && documents.is_some();
            // Record lengths plan a shard whose documents are its records.
            let pin = object.pin();
            let cache = cache.filter(|_| !values);
            let cached = cache
                .and_then(|c| c.lookup_lengths(&path, encoding, &pin, layout.field(), max_plan))
                .filter(|lengths| lengths.len() as u64 == meta.rows);
            let from_cache = cached.is_some();
            // Without the ids to look at, the lengths come from the column's levels alone.
            let known = match cached {
                None if !values => parquet::list_lengths(object, &index, meta.rows, &projection)?,
                cached => cached,
            };
            let mut each = |_, len, values: parquet::Ids<'_>| -> Result<()> {
                record_starts.push(tokens);
                longest = longest.max(len);
                if let Some(documents) = documents.as_mut() {
                    match eos {
                        // Documents are cut at eos ids in the stream of all records.
                        Some(eos) => {
                            for (k, v) in values.iter().enumerate() {
                                if u64::try_from(v) == Ok(eos) {
                                    let end = tokens + k as u64 + 1;
                                    documents.push(doc_start, end - doc_start);
                                    doc_start = end;
                                }
                            }
                        }
                        None => documents.push(tokens, len),
                    }
                    let bytes = documents.bytes() + 8 * record_starts.len() as u64;
                    if bytes > max_plan {
                        return Err(too_large(max_plan));
                    }
                }
                tokens += len;
                Ok(())
            };
            if let Some(lengths) = &known {
                for (record, &len) in lengths.iter().enumerate() {
                    each(record as u64, len, parquet::Ids::I64(&[]))?;
                }
            } else {
                for_each_record(object, &index, (meta.rows, values), &projection, &mut each)?;
            }
            record_starts.push(tokens);
            if let (Some(cache), false) = (cache, from_cache) {
                let lengths: Vec<u64> = record_starts.windows(2).map(|w| w[1] - w[0]).collect();
                cache.store_lengths(&path, encoding, &pin, layout.field(), &lengths);
            }
            if let (Some(documents), Some(_)) = (documents.as_mut(), eos) {
                if doc_start < tokens {
                    documents.push(doc_start, tokens - doc_start);
                }
            }
            // The Parquet decoder's own, one record of the longest list and a decode batch of
            // lists widened to i64, and the job's tokens.
            let scratch =
                meta.scratch_bytes + 8 * longest + 8 * (1 << 20) + 8 * JOB_ROWS * row_tokens;
            (
                TokenFile::Parquet {
                    index,
                    projection,
                    record_starts,
                },
                tokens,
                scratch,
            )
        }
        other => {
            return Err(Error::config(
                "encoding",
                format!(
                "{path}: stages that pack or window tokens read .bin and Parquet shards, not {}",
                other.name()
            ),
            ))
        }
    };
    let (plan, starts) = documents.map_or((None, None), |d| d.finish(tokens));
    let index = TokenIndex {
        layout: layout.clone(),
        file,
        tokens,
        plan,
        starts,
    };
    // A job also lists where each of its windows' pieces goes, and widens a piece's ids.
    let pieces = index.most_pieces().max(1);
    let listing = JOB_ROWS * pieces * std::mem::size_of::<Need>() as u64 + 8 * row_tokens;
    Ok(ShardMeta {
        rows: index.windows(),
        scratch_bytes: scratch + listing,
        pin: crate::storage::Pin::default(),
        longest_record: 0,
        index: ShardIndex::Tokens(Arc::new(index)),
    })
}

/// Every record of a Parquet token shard, in order.
fn for_each_record(
    object: &Arc<Object>,
    index: &parquet::ParquetIndex,
    (rows, values): (u64, bool),
    projection: &Projection,
    each: &mut parquet::EachList<'_>,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let all = 0..rows;
    let all = std::slice::from_ref(&all);
    parquet::for_each_list(object, index, (all, values), projection, each)
}

/// Scans a `.bin` stream for `eos`, handing each document it closes (and the tail after the
/// last) to `documents`.
fn scan_bin(
    object: &Object,
    width: u64,
    eos: u64,
    documents: &mut Documents,
    max_plan: u64,
    too_large: &dyn Fn(u64) -> Error,
) -> Result<()> {
    let path = object.uri();
    let mut reader = object.reader(0)?;
    let mut buf = vec![0u8; SCAN_BYTES];
    let mut filled = 0usize;
    let mut token = 0u64;
    let mut doc_start = 0u64;
    loop {
        let n = reader
            .read(&mut buf[filled..])
            .map_err(|e| crate::storage::from_io(e, |e| Error::io(path, e)))?;
        filled += n;
        let whole = filled - filled % width as usize;
        for id in buf[..whole].chunks_exact(width as usize) {
            if read_id(id) == eos {
                documents.push(doc_start, token + 1 - doc_start);
                doc_start = token + 1;
            }
            token += 1;
        }
        if documents.bytes() > max_plan {
            return Err(too_large(max_plan));
        }
        buf.copy_within(whole..filled, 0);
        filled -= whole;
        if n == 0 {
            break;
        }
    }
    if token * width != object.size() {
        return Err(malformed(
            path,
            Encoding::Bin,
            None,
            format!(
                "read {} bytes of a {}-byte shard",
                token * width + filled as u64,
                object.size()
            ),
        ));
    }
    if doc_start < token {
        documents.push(doc_start, token - doc_start);
    }
    Ok(())
}

/// A little-endian id of 2 or 4 bytes.
fn read_id(bytes: &[u8]) -> u64 {
    match *bytes {
        [a, b] => u64::from(u16::from_le_bytes([a, b])),
        [a, b, c, d] => u64::from(u32::from_le_bytes([a, b, c, d])),
        _ => 0,
    }
}

/// Writes window `w`'s `kind` column into elements `row` of `out` (one window): the pieces'
/// values (per token, or one length per piece), then `pad` to the row's end, so every element
/// of the row is written. The value that does not fit the column's dtype, or the number of
/// pieces that does not fit the row, is the error (checked for every shard at open, see
/// [`TokenIndex::largest_position`] and [`TokenIndex::most_pieces`]).
pub fn fill_window(
    index: &TokenIndex,
    w: u64,
    kind: WindowColumn,
    (out, row): (&mut ColumnBuf, Range<usize>),
    pad: i64,
    pieces: &mut Vec<Piece>,
) -> std::result::Result<(), u64> {
    pieces.clear();
    index.pieces(w, pieces);
    if kind == WindowColumn::Lengths && pieces.len() > row.len() {
        return Err(pieces.len() as u64);
    }
    let mut first = row.start;
    for (i, piece) in pieces.iter().enumerate() {
        let (len, value, step) = match kind {
            WindowColumn::Segments => (piece.len as usize, i as u64 + 1, 0),
            WindowColumn::Positions => (piece.len as usize, piece.position, 1),
            WindowColumn::Lengths => (1, piece.len.into(), 0),
        };
        let len = len.min(row.end - first);
        fill(out, first..first + len, value, step)?;
        first += len;
    }
    out.fill_int(first..row.end, pad);
    Ok(())
}

/// Where a piece of a window goes: tokens `start..start + len` of the stream into element
/// `out` of the token column, for row `row` (the shard's window, for errors).
struct Need {
    start: u64,
    len: u64,
    out: usize,
    row: u64,
}

/// Reads windows of a token shard.
pub struct Reader {
    object: Arc<Object>,
    index: Arc<TokenIndex>,
    encoding: Encoding,
}

impl Reader {
    /// A reader of the shard `object` that `index` describes.
    pub fn open(object: Arc<Object>, index: Arc<TokenIndex>, encoding: Encoding) -> Self {
        Reader {
            object,
            index,
            encoding,
        }
    }

    fn read(
        &self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
    ) -> Result<()> {
        let path = self.object.uri();
        let field = self.index.layout.field();
        // `@segment_ids` and `@positions` are not record columns: the planner writes them.
        let tokens_column = projection.columns.iter().position(|c| c.source == field);
        let mut needs: Vec<Need> = Vec::new();
        let mut pieces: Vec<Piece> = Vec::new();
        let mut out_row = 0usize;
        for range in ranges {
            for w in range.clone() {
                if w >= self.index.windows() {
                    return Err(malformed(
                        path,
                        self.encoding,
                        Some(w),
                        format!("the shard has {} windows", self.index.windows()),
                    ));
                }
                if let Some(k) = tokens_column {
                    pieces.clear();
                    self.index.pieces(w, &mut pieces);
                    let column = &projection.columns[k];
                    let mut at = 0usize;
                    for piece in &pieces {
                        needs.push(Need {
                            start: piece.start,
                            len: piece.len.into(),
                            out: out_row * column.width + at,
                            row: w,
                        });
                        at += piece.len as usize;
                    }
                    // The pieces fill the window from its start; the rest is padding, written
                    // here so the chunk need not be filled with pads first.
                    let row = out_row * column.width;
                    chunk.columns[k]
                        .fill_pad(row + at.min(column.width)..row + column.width, column.pad);
                }
                out_row += 1;
            }
        }
        let Some(k) = tokens_column else {
            return Ok(());
        };
        needs.sort_by_key(|n| n.start);
        let column = &projection.columns[k];
        let out = &mut chunk.columns[k];
        let fits = |row: u64, v: i64| Error::Projection {
            path: path.to_owned(),
            row,
            field: column.name.clone(),
            source_field: column.source.clone(),
            message: format!("token id {v} does not fit dtype {}", column.dtype.name()),
        };
        match &self.index.file {
            TokenFile::Bin { width } => self.read_bin(*width, &needs, out, &fits),
            TokenFile::Parquet {
                index,
                projection,
                record_starts,
            } => self.read_parquet(index, projection, record_starts, &needs, out, &fits),
        }
    }

    fn read_bin(
        &self,
        width: u64,
        needs: &[Need],
        out: &mut ColumnBuf,
        fits: &dyn Fn(u64, i64) -> Error,
    ) -> Result<()> {
        // Byte ranges, merged through a gap no longer than the piece after it: fewer requests,
        // and never more than twice the bytes the windows need.
        let mut ranges: Vec<Range<u64>> = Vec::new();
        for need in needs {
            let r = need.start * width..(need.start + need.len) * width;
            match ranges.last_mut() {
                Some(last) if r.start <= last.end + (r.end - r.start) => {
                    last.end = last.end.max(r.end);
                }
                _ => ranges.push(r),
            }
        }
        let pieces = self.object.read_pieces(&ranges)?;
        let mut bytes: Vec<u8> = Vec::new();
        let mut ids: Vec<i64> = Vec::new();
        for need in needs {
            let (from, to) = (need.start * width, (need.start + need.len) * width);
            bytes.clear();
            gather(&pieces, from..to, &mut bytes);
            if bytes.len() as u64 != to - from {
                return Err(malformed(
                    self.object.uri(),
                    self.encoding,
                    Some(need.row),
                    format!("bytes {from}..{to} were not read"),
                ));
            }
            if let (2, ColumnBuf::I32(buf)) = (width, &mut *out) {
                // Every 16-bit id fits: straight into the column.
                let span = &mut buf[need.out..need.out + bytes.len() / 2];
                for (o, b) in span.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = i32::from(u16::from_le_bytes([b[0], b[1]]));
                }
                continue;
            }
            ids.clear();
            if width == 2 {
                ids.extend(
                    bytes
                        .chunks_exact(2)
                        .map(|b| i64::from(u16::from_le_bytes([b[0], b[1]]))),
                );
            } else {
                ids.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|b| i64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
                );
            }
            put_wide(out, need.out, &ids).map_err(|v| fits(need.row, v))?;
        }
        Ok(())
    }

    fn read_parquet(
        &self,
        index: &parquet::ParquetIndex,
        projection: &Projection,
        record_starts: &[u64],
        needs: &[Need],
        out: &mut ColumnBuf,
        fits: &dyn Fn(u64, i64) -> Error,
    ) -> Result<()> {
        let record_of = |token: u64| record_starts.partition_point(|&s| s <= token) - 1;
        let mut records: Vec<Range<u64>> = Vec::new();
        for need in needs.iter().filter(|n| n.len > 0) {
            let r = record_of(need.start) as u64..record_of(need.start + need.len - 1) as u64 + 1;
            match records.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => records.push(r),
            }
        }
        let path = self.object.uri();
        let mut lo = 0usize;
        parquet::for_each_list(
            &self.object,
            index,
            (&records, true),
            projection,
            &mut |record, _, values| {
                let (rs, re) = (
                    record_starts[record as usize],
                    record_starts[record as usize + 1],
                );
                if values.len() as u64 != re - rs {
                    return Err(malformed(
                        path,
                        Encoding::Parquet,
                        Some(record),
                        format!(
                            "the record holds {} tokens, {} when the shard was inspected",
                            values.len(),
                            re - rs
                        ),
                    ));
                }
                while lo < needs.len() && needs[lo].start + needs[lo].len <= rs {
                    lo += 1;
                }
                for need in needs[lo..].iter().take_while(|n| n.start < re) {
                    let (from, to) = (need.start.max(rs), (need.start + need.len).min(re));
                    if from >= to {
                        continue;
                    }
                    let ids = values.slice((from - rs) as usize..(to - rs) as usize);
                    put(out, need.out + (from - need.start) as usize, ids)
                        .map_err(|v| fits(need.row, v))?;
                }
                Ok(())
            },
        )
    }
}

/// Appends the bytes `range` of the object, found in `pieces` (sorted, as read), to `out`.
fn gather(pieces: &[(u64, bytes::Bytes)], range: Range<u64>, out: &mut Vec<u8>) {
    let k = pieces.partition_point(|(at, _)| *at <= range.start);
    let mut next = range.start;
    for (at, piece) in &pieces[k.saturating_sub(1)..] {
        let end = at + piece.len() as u64;
        if *at > next || next >= range.end {
            break;
        }
        if end <= next {
            continue;
        }
        let take = end.min(range.end);
        out.extend_from_slice(&piece[(next - at) as usize..(take - at) as usize]);
        next = take;
    }
}

/// Copies `ids` into an integer column from element `at`; the first value that does not fit
/// the column's dtype is the error. Ids of the column's own width are copied as they are.
fn put(column: &mut ColumnBuf, at: usize, ids: parquet::Ids<'_>) -> std::result::Result<(), i64> {
    match (column, ids) {
        (ColumnBuf::I32(buf), parquet::Ids::I32(ids)) => {
            buf[at..at + ids.len()].copy_from_slice(ids);
        }
        (ColumnBuf::I64(buf), parquet::Ids::I32(ids)) => {
            for (o, &v) in buf[at..at + ids.len()].iter_mut().zip(ids) {
                *o = i64::from(v);
            }
        }
        (column, parquet::Ids::I64(values)) => return put_wide(column, at, values),
        // Token columns are declared i32 or i64 (checked with the config).
        (ColumnBuf::F32(_) | ColumnBuf::F64(_) | ColumnBuf::Bool(_), parquet::Ids::I32(_)) => {}
    }
    Ok(())
}

/// Copies `values` into an integer column from element `at`; the first value that does not fit
/// the column's dtype is the error. The range is checked once, so the copy vectorises.
fn put_wide(column: &mut ColumnBuf, at: usize, values: &[i64]) -> std::result::Result<(), i64> {
    match column {
        ColumnBuf::I32(buf) => {
            let (lo, hi) = values
                .iter()
                .fold((0i64, 0i64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            if lo < i64::from(i32::MIN) || hi > i64::from(i32::MAX) {
                let bad = values.iter().find(|&&v| i32::try_from(v).is_err());
                return Err(bad.copied().unwrap_or(hi));
            }
            for (o, &v) in buf[at..at + values.len()].iter_mut().zip(values) {
                *o = v as i32;
            }
        }
        ColumnBuf::I64(buf) => buf[at..at + values.len()].copy_from_slice(values),
        // Token columns are declared i32 or i64 (checked with the config).
        ColumnBuf::F32(_) | ColumnBuf::F64(_) | ColumnBuf::Bool(_) => {}
    }
    Ok(())
}

/// Writes `first, first + step, ...` into elements `range` of an integer column; the largest
/// value, when it does not fit the dtype, is the error.
fn fill(
    column: &mut ColumnBuf,
    range: Range<usize>,
    first: u64,
    step: u64,
) -> std::result::Result<(), u64> {
    let last = first.saturating_add(step.saturating_mul(range.len().saturating_sub(1) as u64));
    match column {
        ColumnBuf::I32(buf) => {
            let start = i32::try_from(last)
                .map(|_| first as i32)
                .map_err(|_| last)?;
            for (j, o) in buf[range].iter_mut().enumerate() {
                *o = start + (step as i32) * j as i32;
            }
        }
        ColumnBuf::I64(buf) => {
            let start = i64::try_from(last)
                .map(|_| first as i64)
                .map_err(|_| last)?;
            for (j, o) in buf[range].iter_mut().enumerate() {
                *o = start + (step as i64) * j as i64;
            }
        }
        ColumnBuf::F32(_) | ColumnBuf::F64(_) | ColumnBuf::Bool(_) => {}
    }
    Ok(())
}

impl ShardReader for Reader {
    fn read_ranges(
        &mut self,
        ranges: &[Range<u64>],
        projection: &Projection,
        chunk: &mut Chunk,
        _prefetched: Option<super::Prefetch>,
    ) -> std::result::Result<(), ReadFailure> {
        Ok(self.read(ranges, projection, chunk)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PackingSpec, WindowsSpec, POSITIONS, SEGMENT_IDS};

    /// A `.bin` of `ids` (uint16) with its `meta.json`, in a directory of its own.
    fn bin(name: &str, ids: &[u16], meta: &str) -> String {
        let dir = std::env::temp_dir().join(format!("o41-tokens-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(META_FILE), meta).unwrap();
        let path = dir.join("t.bin");
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        std::fs::write(&path, bytes).unwrap();
        path.to_string_lossy().into_owned()
    }

    fn projection(row: usize) -> Projection {
        let field = |source: &str| FieldSpec {
            name: source.trim_start_matches('@').to_owned(),
            source: source.to_owned(),
            dtype: DType::I32,
            shape: vec![row],
            pad: serde_json::Value::from(0),
        };
        Projection::new(&[field("t"), field(SEGMENT_IDS), field(POSITIONS)]).unwrap()
    }

    /// Every window of the shard at `uri`, as (tokens, segments, positions) rows: the tokens as
    /// the reader reads them, the others as the planner writes them ([`fill_window`]).
    fn windows(uri: &str, layout: &TokenLayout) -> Result<Vec<[Vec<i32>; 3]>> {
        let storage = Storage::local();
        let object = Arc::new(storage.open(uri)?);
        let meta = inspect(&storage, &object, Encoding::Bin, layout, 1 << 20, None)?;
        let p = projection(layout.row_tokens() as usize);
        let (records, _) = p.record_columns();
        let rows = meta.rows as usize;
        let mut chunk = Chunk::padded(&p, rows);
        let mut tokens = Chunk::padded(&records, rows);
        // Junk where the reader must write: it pads each window's tail itself.
        let len = tokens.columns[0].len();
        tokens.columns[0].fill_pad(0..len, crate::dtype::Scalar::Int(99));
        let ShardIndex::Tokens(index) = &meta.index else {
            unreachable!("a token index")
        };
        let mut reader = Reader::open(object, index.clone(), Encoding::Bin);
        reader
            .read_ranges(
                std::slice::from_ref(&(0..meta.rows)),
                &records,
                &mut tokens,
                None,
            )
            .map_err(|f| f.error)?;
        let width = layout.row_tokens() as usize;
        chunk.columns[0] = tokens.columns.remove(0);
        let mut pieces = Vec::new();
        for w in 0..rows {
            for (k, kind) in [(1, WindowColumn::Segments), (2, WindowColumn::Positions)] {
                let out = (&mut chunk.columns[k], w * width..(w + 1) * width);
                fill_window(index, w as u64, kind, out, 0, &mut pieces).unwrap();
            }
        }
        let column = |k: usize, w: usize| match &chunk.columns[k] {
            ColumnBuf::I32(v) => v[w * width..(w + 1) * width].to_vec(),
            _ => unreachable!("i32 columns"),
        };
        Ok((0..rows)
            .map(|w| [column(0, w), column(1, w), column(2, w)])
            .collect())
    }

    #[test]
    fn a_bin_shard_packs_its_eos_cut_documents() {
        // Documents [5 6 0] [7 0] [8 9 10 11 12 0]; windows of 4, two open.
        let uri = bin(
            "pack",
            &[5, 6, 0, 7, 0, 8, 9, 10, 11, 12, 0],
            r#"{"dtype": "uint16", "eos_id": 0, "vocab": 13}"#,
        );
        let layout = TokenLayout::Packed(PackingSpec {
            field: "t".to_owned(),
            seq_len: 4,
            bins: 2,
            eos_id: None,
        });
        let rows = windows(&uri, &layout).unwrap();
        assert_eq!(
            rows[0],
            [vec![8, 9, 10, 11], vec![1, 1, 1, 1], vec![0, 1, 2, 3]]
        );
        // The tail [12 0] fills the window of [7 0], which closes full before [5 6 0]'s.
        assert_eq!(
            rows[1],
            [vec![7, 0, 12, 0], vec![1, 1, 2, 2], vec![0, 1, 4, 5]]
        );
        assert_eq!(
            rows[2],
            [vec![5, 6, 0, 0], vec![1, 1, 1, 0], vec![0, 1, 2, 0]]
        );
        assert_eq!(rows.len(), 3);
    }

    #[test]
    fn stream_windows_overlap_by_one_token() {
        let uri = bin("windows", &[1, 2, 3, 4, 5, 6], r#"{"dtype": "uint16"}"#);
        let layout = TokenLayout::Windows(WindowsSpec {
            field: "t".to_owned(),
            seq_len: 2,
            eos_id: None,
        });
        let tokens: Vec<Vec<i32>> = windows(&uri, &layout)
            .unwrap()
            .into_iter()
            .map(|[t, _, _]| t)
            .collect();
        assert_eq!(tokens, vec![vec![1, 2, 3], vec![3, 4, 5], vec![5, 6, 0]]);
    }

    #[test]
    fn a_bad_meta_json_is_a_malformed_shard_naming_it() {
        let layout = TokenLayout::Windows(WindowsSpec {
            field: "t".to_owned(),
            seq_len: 2,
            eos_id: None,
        });
        for (name, meta) in [
            ("dtype", r#"{"dtype": "int8"}"#),
            ("json", "{not json"),
            ("missing", r#"{"eos_id": 3}"#),
        ] {
            let uri = bin(name, &[1, 2, 3], meta);
            let err = windows(&uri, &layout).unwrap_err();
            assert!(
                matches!(&err, Error::Format { path, .. } if path.ends_with(META_FILE)),
                "{name}: {err}"
            );
        }
    }
}
