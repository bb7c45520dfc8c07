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

//!
//! `bin` holds the `.bin` format, `read` the window reader; this module inspects shards and
//! plans their windows ([`TokenIndex`]).

mod bin;
pub(crate) mod lengths;
mod read;

#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use crate::config::WindowColumn;
use crate::config::{FieldSpec, PackOverflow, TokenLayout};
use crate::dtype::DType;
use crate::encoding::Encoding;
use crate::error::{Error, Result};
use crate::fields::Projection;
use crate::formats::token_ids::IdType;
use crate::formats::TokenRecords;
use crate::formats::{
    megatron, npy, parquet, PageCache, ShardIndex, ShardMeta, ShardReader, TokenInspection,
};
use crate::order::pack::{
    most_stream_pieces, stream_window, stream_window_pieces, stream_windows, PackPlan, Packer,
    Piece,
};
use crate::storage::{Object, Storage};
pub(super) use bin::bin_meta;
use bin::scan_ids;
pub use bin::{Bin, META_FILE};
use read::Need;
pub use read::{fill_window, Reader};

/// Most rows one read job decodes (the planner's job size).
pub(super) const JOB_ROWS: u64 = crate::memory::MAX_JOB_ROWS;

/// Where a shard's tokens are.
#[derive(Debug)]
pub(super) enum TokenFile {
    /// A flat stream of little-endian ids of type `ids` from byte `offset` (a `.bin`, a
    /// Megatron `.bin`, a `NumPy` array). `documents` are the format's own documents (a Megatron
    /// index), kept where stream windows are cut at them: where each starts, then the end.
    Flat {
        ids: IdType,
        offset: u64,
        documents: Option<Vec<u64>>,
    },
    /// Records of another format (Arrow, MDS), each holding a token list: record `r` holds
    /// tokens `record_starts[r]..record_starts[r + 1]`.
    Records {
        source: Arc<dyn TokenRecords>,
        record_starts: Vec<u64>,
    },
    /// Records of one list column; record `r` holds tokens `record_starts[r]..record_starts[r + 1]`.
    /// `aligned` are the other list columns read beside it, element for element (a loss mask).
    Parquet {
        index: Arc<parquet::ParquetIndex>,
        projection: Projection,
        record_starts: Vec<u64>,
        aligned: Vec<Aligned>,
    },
}

/// A list column of a Parquet token shard read beside its tokens: each record's list as long as
/// its token list, cut and padded where the tokens are.
#[derive(Debug)]
pub(super) struct Aligned {
    pub(super) field: String,
    pub(super) index: Arc<parquet::ParquetIndex>,
    pub(super) projection: Projection,
}

/// A run of one document in a window, where it is in the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocatedPiece {
    /// The record the run starts in; `None` in a flat token stream (`.bin`, `NumPy`, Megatron's
    /// `.bin`), where `start` and `end` count from the stream's first token.
    pub record: Option<u64>,
    /// The run's first token, from the record's first token (or the stream's).
    pub start: u64,
    /// One past its last token, likewise (past the record's end where a document cut at an
    /// eos id runs on into the next records).
    pub end: u64,
    /// The position of its first token within its document.
    pub position: u64,
}

/// A token shard as a stage reads it: its stream, and its windows.
#[derive(Debug)]
pub struct TokenIndex {
    /// The shard's encoding.
    pub(super) encoding: Encoding,
    pub(super) layout: TokenLayout,
    pub(super) file: TokenFile,
    /// Tokens in the shard's stream.
    pub(super) tokens: u64,
    /// Windows of a packed layout; stream windows are computed.
    pub(super) plan: Option<PackPlan>,
    /// Where each document of the stream starts, then the stream's end, for stream windows cut
    /// at an eos id (a Parquet shard's records serve otherwise).
    pub(super) starts: Option<Vec<u64>>,
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

    /// Documents packing left out (longer than a window, `overflow="drop"`).
    pub fn dropped_documents(&self) -> u64 {
        self.plan.as_ref().map_or(0, PackPlan::dropped)
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
            TokenFile::Parquet { record_starts, .. } | TokenFile::Records { record_starts, .. } => {
                8 * record_starts.len() as u64
            }
            TokenFile::Flat { documents, .. } => {
                documents.as_ref().map_or(0, |d| 8 * d.len() as u64)
            }
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
    /// an eos id, or else a Parquet shard's records or a Megatron dataset's documents; `None`
    /// for a flat stream not cut.
    pub(super) fn documents(&self) -> Option<&[u64]> {
        match (&self.starts, &self.file) {
            (Some(starts), _) => Some(starts),
            (
                None,
                TokenFile::Parquet { record_starts, .. } | TokenFile::Records { record_starts, .. },
            ) => Some(record_starts),
            (None, TokenFile::Flat { documents, .. }) => documents.as_deref(),
        }
    }

    /// Tokens between stream windows' starts.
    pub(super) fn stride(&self) -> u64 {
        self.layout.row_tokens() - 1
    }

    /// Window `w`'s pieces located in the shard: the record each starts in (`None` for a flat
    /// token stream, whose documents are spans of it), its tokens counted from that record's
    /// first (or the stream's first), and its position within its document.
    pub fn located_pieces(&self, w: u64) -> Vec<LocatedPiece> {
        let mut pieces = Vec::new();
        self.pieces(w, &mut pieces);
        let records = match &self.file {
            TokenFile::Parquet { record_starts, .. } | TokenFile::Records { record_starts, .. } => {
                Some(record_starts)
            }
            TokenFile::Flat { .. } => None,
        };
        pieces
            .iter()
            .map(|piece| {
                let (record, first) = records.map_or((None, 0), |starts| {
                    // The last record starting at or before the piece (empty ones share starts).
                    let r = starts
                        .partition_point(|&s| s <= piece.start)
                        .saturating_sub(1);
                    (Some(r as u64), starts[r])
                });
                LocatedPiece {
                    record,
                    start: piece.start - first,
                    end: piece.start - first + u64::from(piece.len),
                    position: piece.position,
                }
            })
            .collect()
    }

    /// The tokens window `w` holds (its padding excluded); `scratch` holds its pieces after.
    pub fn window_tokens(&self, w: u64, scratch: &mut Vec<Piece>) -> u64 {
        scratch.clear();
        self.pieces(w, scratch);
        scratch.iter().map(|p| u64::from(p.len)).sum()
    }

    /// Window `w`'s pieces, appended to `out`. A stream window is cut where a document starts
    /// inside it ([`TokenIndex::documents`]); a `.bin` stream not cut at an eos id has no
    /// documents known, and its window is one piece.
    pub(super) fn pieces(&self, w: u64, out: &mut Vec<Piece>) {
        match (&self.plan, self.documents()) {
            (Some(plan), _) => out.extend_from_slice(plan.window(w)),
            (None, Some(starts)) => {
                stream_window_pieces(self.tokens, self.stride(), w, starts, out);
            }
            (None, None) => out.push(stream_window(self.tokens, self.stride(), w)),
        }
    }
}

pub(super) fn malformed(
    path: &str,
    encoding: Encoding,
    row: Option<u64>,
    message: String,
) -> Error {
    Error::Format {
        path: path.to_owned(),
        encoding: encoding.name(),
        row,
        message,
    }
}

/// The one-column projection a Parquet token shard is inspected with.
pub(super) fn token_projection(field: &str) -> Result<Projection> {
    Projection::new(&[FieldSpec {
        overflow: crate::config::Overflow::Truncate,
        pad_side: crate::config::PadSide::Right,
        name: field.to_owned(),
        source: field.into(),
        dtype: DType::I64,
        shape: vec![1],
        pad: serde_json::Value::from(0),
    }])
}

/// Refuses a Parquet shard whose column `field` is not a list of integer ids, naming it.
pub(super) fn check_token_column(
    path: &str,
    index: &parquet::ParquetIndex,
    field: &str,
) -> Result<()> {
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
pub(super) enum Documents {
    Pack(Packing),
    Starts(Vec<u64>),
}

/// A shard's documents being packed, and what a document longer than a window does.
pub(super) struct Packing {
    packer: Packer,
    overflow: PackOverflow,
    /// Documents seen so far (placed or left out): the next one's number, for errors.
    seen: u64,
    /// The shard and the field its tokens are read from, for errors.
    path: String,
    field: String,
}

impl Documents {
    pub(super) fn of(layout: &TokenLayout, path: &str) -> Option<Self> {
        match layout {
            TokenLayout::Packed(p) => Some(Documents::Pack(Packing {
                packer: Packer::new(p.seq_len, p.bins as usize),
                overflow: p.overflow,
                seen: 0,
                path: path.to_owned(),
                field: p.field.clone(),
            })),
            TokenLayout::Windows(w) => w.eos_id.map(|_| Documents::Starts(Vec::new())),
        }
    }

    /// Document `start..start + len` of the stream. A document longer than a window is split,
    /// left out or refused, as the packing's overflow says.
    pub(super) fn push(&mut self, start: u64, len: u64) -> Result<()> {
        match self {
            Documents::Pack(packing) => {
                let document = packing.seen;
                packing.seen += 1;
                let seq_len = packing.packer.seq_len();
                match packing.overflow {
                    _ if len <= seq_len => packing.packer.push(start, len),
                    PackOverflow::Split => packing.packer.push(start, len),
                    PackOverflow::Drop => packing.packer.leave_out(),
                    PackOverflow::Error => {
                        return Err(Error::Projection {
                            path: packing.path.clone(),
                            row: document,
                            field: packing.field.clone(),
                            source_field: packing.field.clone(),
                            message: format!(
                                "document {document} holds {len} tokens, more than a window's \
                                 {seq_len}, and packing.overflow is 'error' ('drop' leaves such \
                                 documents out, 'split' cuts them into windows)"
                            ),
                        })
                    }
                }
            }
            Documents::Starts(starts) => starts.push(start),
        }
        Ok(())
    }

    /// Bytes the document of `len` tokens may add (see [`Packer::growth`]).
    pub(super) fn growth(&self, len: u64) -> u64 {
        match self {
            Documents::Pack(packing) => packing.packer.growth(len),
            Documents::Starts(_) => 8,
        }
    }

    /// Bytes held so far, against the stream's memory limit.
    pub(super) fn bytes(&self) -> u64 {
        match self {
            Documents::Pack(packing) => packing.packer.bytes(),
            Documents::Starts(starts) => 8 * starts.len() as u64,
        }
    }

    /// The packing plan, or the starts followed by the stream's end.
    pub(super) fn finish(self, tokens: u64) -> (Option<PackPlan>, Option<Vec<u64>>) {
        match self {
            Documents::Pack(packing) => (Some(packing.packer.finish()), None),
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
    (encoding, records): (Encoding, Option<Arc<dyn TokenRecords>>),
    TokenInspection { layout, cache }: TokenInspection<'_>,
    (aligned, max_plan): (&[String], u64),
) -> Result<ShardMeta> {
    let path = object.uri().to_owned();
    if let (Some(field), false) = (aligned.first(), encoding == Encoding::Parquet) {
        return Err(Error::config(
            "fields",
            format!(
                "{path}: '{field}' would be read beside the tokens, element for element, and a \
                 {} shard holds no field but its tokens; aligned fields are read from Parquet \
                 shards",
                encoding.name()
            ),
        ));
    }
    let eos = match layout {
        TokenLayout::Packed(p) => p.eos_id,
        TokenLayout::Windows(w) => w.eos_id,
    };
    let mut documents = Documents::of(layout, &path);
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
        _ if records.is_some() => {
            let source = records.expect("matched");
            let how = RecordDocuments {
                layout,
                cache,
                max_plan,
                too_large: &too_large,
            };
            let (record_starts, tokens) =
                record_documents(object, encoding, &*source, how, documents.as_mut())?;
            // The format's decode of a part of the shard, and the job's tokens.
            let scratch = source.scratch() + 8 * JOB_ROWS * row_tokens;
            (
                TokenFile::Records {
                    source,
                    record_starts,
                },
                tokens,
                scratch,
            )
        }
        Encoding::Bin | Encoding::Npy | Encoding::Megatron => {
            if encoding == Encoding::Megatron && layout.field() != megatron::TOKEN_FIELD {
                // A `.bin` or NumPy stream has no field names; a Megatron dataset's records
                // hold their ids under `tokens`, in token stages as in record stages.
                return Err(Error::Projection {
                    path: path.clone(),
                    row: 0,
                    field: layout.field().to_owned(),
                    source_field: layout.field().to_owned(),
                    message: format!(
                        "a Megatron dataset holds its ids under '{tokens}' (its only column); \
                         name it in the stage's field, or map the name for this source: \
                         columns={{'{field}': '{tokens}'}}",
                        tokens = megatron::TOKEN_FIELD,
                        field = layout.field()
                    ),
                });
            }
            let flat = flat_file(storage, object, encoding, max_plan, &too_large)?;
            let FlatFile {
                ids,
                offset,
                meta_eos,
                documents: known,
            } = flat;
            let width = ids.width;
            let tokens = (object.size() - offset) / width;
            let mut kept = None;
            match (documents.as_mut(), eos.or(meta_eos), known) {
                (Some(documents), Some(eos_id), _) => {
                    let option = match (eos.is_some(), layout) {
                        (false, _) => "meta.json eos_id",
                        (true, TokenLayout::Packed(_)) => "packing.eos_id",
                        (true, TokenLayout::Windows(_)) => "windows.eos_id",
                    };
                    // An id the shard's type cannot hold never occurs: no document would end.
                    if eos_id > ids.largest() {
                        return Err(Error::config(
                            option,
                            format!(
                                "{path}: eos id {eos_id} cannot occur in a shard of {} ids \
                                 (largest {}), so no document would end",
                                ids.name(),
                                ids.largest()
                            ),
                        ));
                    }
                    let file = (ids, offset, encoding);
                    scan_ids(object, file, eos_id, documents, max_plan, &too_large)?;
                }
                (Some(documents), None, Some(starts)) => {
                    for w in starts.windows(2) {
                        let after = documents
                            .bytes()
                            .saturating_add(documents.growth(w[1] - w[0]));
                        if after > max_plan {
                            return Err(too_large(max_plan));
                        }
                        documents.push(w[0], w[1] - w[0])?;
                    }
                }
                (Some(_), None, None) => {
                    return Err(Error::config(
                        "packing.eos_id",
                        format!(
                            "{path}: packing a {} shard cuts its stream at an eos id, and \
                             neither its meta.json nor the packing names one",
                            encoding.name()
                        ),
                    ));
                }
                // Stream windows not cut at an eos id are cut at the format's own documents.
                (None, _, known) => kept = known,
            }
            // A job fetches its windows' bytes, and at most as many again in the gaps it reads
            // through to save requests.
            let scratch = 2 * JOB_ROWS * row_tokens * width;
            (
                TokenFile::Flat {
                    ids,
                    offset,
                    documents: kept,
                },
                tokens,
                scratch,
            )
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
                .and_then(|c| lengths::lookup(c, (&path, encoding, &pin), layout.field(), max_plan))
                // An entry that disagrees with the footer's counts is not this shard's: a miss.
                .filter(|lengths| parquet::lengths_agree(&index, lengths));
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
                    // Documents are cut at eos ids in the stream of all records.
                    if let Some(eos) = eos {
                        for (k, v) in values.iter().enumerate() {
                            if u64::try_from(v) == Ok(eos) {
                                let end = tokens + k as u64 + 1;
                                documents.push(doc_start, end - doc_start)?;
                                doc_start = end;
                            }
                        }
                    } else {
                        // Before the push allocates it: a forged list length (the footer's
                        // index, a cache entry) must fail here, not in the allocator.
                        let after = documents.bytes().saturating_add(documents.growth(len));
                        if after > max_plan {
                            return Err(too_large(max_plan));
                        }
                        documents.push(tokens, len)?;
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
                lengths::store(cache, (&path, encoding, &pin), layout.field(), &lengths);
            }
            if let (Some(documents), Some(_)) = (documents.as_mut(), eos) {
                if doc_start < tokens {
                    documents.push(doc_start, tokens - doc_start)?;
                }
            }
            // The Parquet decoder's own, one record of the longest list and a decode batch of
            // lists widened to i64, and the job's tokens; as much again per aligned column.
            let one = meta.scratch_bytes + 8 * longest + 8 * (1 << 20) + 8 * JOB_ROWS * row_tokens;
            let mut columns = Vec::with_capacity(aligned.len());
            for field in aligned {
                let projection = token_projection(field)?;
                let meta = parquet::inspect_footer(object.clone(), &projection)?;
                let index = parquet::index_of(&meta).ok_or_else(|| Error::Internal {
                    message: "a Parquet inspection without its index".to_owned(),
                })?;
                check_token_column(&path, &index, field)?;
                columns.push(Aligned {
                    field: field.clone(),
                    index,
                    projection,
                });
            }
            let scratch = one * (1 + aligned.len() as u64);
            (
                TokenFile::Parquet {
                    index,
                    projection,
                    record_starts,
                    aligned: columns,
                },
                tokens,
                scratch,
            )
        }
        other => {
            return Err(Error::config(
                "encoding",
                format!(
                    "{path}: stages that pack or window tokens read {} shards, not {}",
                    crate::formats::token_encodings(),
                    other.name()
                ),
            ))
        }
    };
    let (plan, starts) = documents.map_or((None, None), |d| d.finish(tokens));
    let index = TokenIndex {
        encoding,
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
        dropped: crate::formats::Dropped::default(),
        rows: index.windows(),
        scratch_bytes: scratch + listing,
        pin: crate::storage::Pin::default(),
        longest_record: 0,
        index: Arc::new(index),
    })
}

/// What planning a shard of records' token documents needs.
#[derive(Clone, Copy)]
struct RecordDocuments<'a> {
    layout: &'a TokenLayout,
    cache: Option<&'a crate::inspect_cache::InspectCache>,
    max_plan: u64,
    too_large: &'a dyn Fn(u64) -> Error,
}

/// Reads the token lists of a shard of records: where each record starts in the shard's
/// stream (returned with the stream's length) and, for a layout that needs them, its documents:
/// the records themselves, or the stream cut at an eos id. Lengths alone come from `cache`
/// when it holds this shard's (they are stored there when not).
fn record_documents(
    object: &Arc<Object>,
    encoding: Encoding,
    source: &dyn TokenRecords,
    how: RecordDocuments<'_>,
    mut documents: Option<&mut Documents>,
) -> Result<(Vec<u64>, u64)> {
    let RecordDocuments {
        layout,
        cache,
        max_plan,
        too_large,
    } = how;
    let path = object.uri();
    let eos = match layout {
        TokenLayout::Packed(p) => p.eos_id,
        TokenLayout::Windows(w) => w.eos_id,
    };
    let rows = source.rows();
    if rows.saturating_add(1).saturating_mul(8) > max_plan {
        return Err(too_large(max_plan));
    }
    let values = eos.is_some() && documents.is_some();
    let pin = object.pin();
    let cache = cache.filter(|_| !values);
    let cached = cache
        .and_then(|c| lengths::lookup(c, (path, encoding, &pin), layout.field(), max_plan))
        .filter(|lengths| lengths.len() as u64 == rows);
    let from_cache = cached.is_some();
    let mut record_starts = Vec::with_capacity(rows as usize + 1);
    let mut tokens = 0u64;
    let mut doc_start = 0u64;
    let mut each = |_, len: u64, ids: &[i64]| -> Result<()> {
        record_starts.push(tokens);
        if let Some(documents) = documents.as_deref_mut() {
            if let Some(eos) = eos {
                for (k, &v) in ids.iter().enumerate() {
                    if u64::try_from(v) == Ok(eos) {
                        let end = tokens + k as u64 + 1;
                        documents.push(doc_start, end - doc_start)?;
                        doc_start = end;
                    }
                }
            } else {
                if documents.bytes().saturating_add(documents.growth(len)) > max_plan {
                    return Err(too_large(max_plan));
                }
                documents.push(tokens, len)?;
            }
            if documents.bytes() + 8 * record_starts.len() as u64 > max_plan {
                return Err(too_large(max_plan));
            }
        }
        tokens += len;
        Ok(())
    };
    if let Some(lengths) = &cached {
        for (record, &len) in lengths.iter().enumerate() {
            each(record as u64, len, &[])?;
        }
    } else if rows > 0 {
        source.for_each(object, std::slice::from_ref(&(0..rows)), values, &mut each)?;
    }
    record_starts.push(tokens);
    if let (Some(cache), false) = (cache, from_cache) {
        let lengths: Vec<u64> = record_starts.windows(2).map(|w| w[1] - w[0]).collect();
        lengths::store(cache, (path, encoding, &pin), layout.field(), &lengths);
    }
    if let (Some(documents), Some(_)) = (documents, eos) {
        if doc_start < tokens {
            documents.push(doc_start, tokens - doc_start)?;
        }
    }
    Ok((record_starts, tokens))
}

/// The ids of a flat token file (a `.bin`, a `NumPy` array, a Megatron `.bin`).
pub fn count_ids(storage: &Storage, object: &Object, encoding: Encoding) -> Result<u64> {
    let refuse = |_| Error::Internal {
        message: "counting ids holds no plan".to_owned(),
    };
    let flat = flat_file(storage, object, encoding, u64::MAX, &refuse)?;
    Ok((object.size() - flat.offset) / flat.ids.width)
}

/// A flat token file as its format describes it.
struct FlatFile {
    ids: IdType,
    /// Byte where the ids start.
    offset: u64,
    /// The eos id its `meta.json` names.
    meta_eos: Option<u64>,
    /// Its own documents (a Megatron index): where each starts, then the end.
    documents: Option<Vec<u64>>,
}

/// Reads what describes a flat token file: a `.bin`'s `meta.json`, a `NumPy` array's header
/// (or a headerless one's `meta.json`), a Megatron dataset's `.idx`.
fn flat_file(
    storage: &Storage,
    object: &Object,
    encoding: Encoding,
    max_plan: u64,
    too_large: &dyn Fn(u64) -> Error,
) -> Result<FlatFile> {
    let path = object.uri();
    let (ids, offset, meta_eos, documents) = match encoding {
        Encoding::Megatron => {
            // The document starts are held for the stream's life where windows are cut at
            // them: the index's counts bound them before they are read.
            let (ids, starts) = megatron::token_file(storage, object, (max_plan, too_large))?;
            (ids, 0, None, Some(starts))
        }
        Encoding::Npy if npy::has_header(object)? => {
            let array = npy::read_header(object)?;
            (array.ids, array.offset, None, None)
        }
        _ => {
            let (ids, eos) = bin_meta(storage, path, encoding)?;
            (ids, 0, eos, None)
        }
    };
    if !(object.size() - offset).is_multiple_of(ids.width) {
        return Err(malformed(
            path,
            encoding,
            None,
            format!(
                "{} bytes is not a whole number of {}-byte token ids",
                object.size() - offset,
                ids.width
            ),
        ));
    }
    Ok(FlatFile {
        ids,
        offset,
        meta_eos,
        documents,
    })
}

impl ShardIndex for TokenIndex {
    fn open(
        self: Arc<Self>,
        object: Arc<Object>,
        _meta: &ShardMeta,
        _pages: Option<&Arc<PageCache>>,
    ) -> Result<Box<dyn ShardReader>> {
        let encoding = match self.file {
            TokenFile::Flat { .. } | TokenFile::Records { .. } => self.encoding,
            TokenFile::Parquet { .. } => Encoding::Parquet,
        };
        Ok(Box::new(Reader::open(object, self, encoding)))
    }
}

/// Every record of a Parquet token shard, in order.
pub(super) fn for_each_record(
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
