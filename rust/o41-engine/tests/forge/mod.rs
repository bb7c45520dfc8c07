//! Parquet files written byte by byte, so a test can make them claim what no writer would: page
//! headers with forged sizes, column metadata that contradicts the schema, a schema nested a
//! thousand levels deep. One INT64 column `v` (required), optionally a dictionary, and optionally
//! a second column `x` under `deep` optional groups.

#![allow(dead_code)]

pub mod riegeli;

/// What to write, and what to forge.
#[derive(Clone)]
pub struct Forge {
    pub values: Vec<i64>,
    pub dictionary: bool,
    pub snappy: bool,
    /// The schema element's physical type of `v` (Thrift numbering: 1 INT32, 2 INT64).
    pub schema_type: i32,
    /// The column metadata's physical type of `v`.
    pub chunk_type: i32,
    /// A forged `num_values` in the dictionary page header.
    pub dictionary_values: Option<i32>,
    /// A forged `uncompressed_page_size` in the data page header.
    pub page_uncompressed: Option<i32>,
    /// A forged `total_uncompressed_size` in the column metadata.
    pub chunk_uncompressed: Option<i64>,
    /// Groups above a second column `x` (all null); 0 for none.
    pub deep: usize,
}

impl Default for Forge {
    fn default() -> Self {
        Forge {
            values: (0..40).map(|i| i % 7).collect(),
            dictionary: false,
            snappy: false,
            schema_type: 2,
            chunk_type: 2,
            dictionary_values: None,
            page_uncompressed: None,
            chunk_uncompressed: None,
            deep: 0,
        }
    }
}

/// Thrift compact protocol, written.
#[derive(Default)]
struct W {
    out: Vec<u8>,
    last: Vec<i16>,
}

const I32: u8 = 5;
const I64: u8 = 6;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const STRUCT: u8 = 12;

impl W {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.out.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.out.push(v as u8);
    }
    fn zigzag(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }
    fn field(&mut self, id: i16, kind: u8) {
        let delta = id - *self.last.last().expect("inside a struct");
        if (1..=15).contains(&delta) {
            self.out.push(((delta as u8) << 4) | kind);
        } else {
            self.out.push(kind);
            self.zigzag(id.into());
        }
        *self.last.last_mut().expect("inside a struct") = id;
    }
    fn begin(&mut self) {
        self.last.push(0);
    }
    fn end(&mut self) {
        self.out.push(0);
        self.last.pop();
    }
    fn i32(&mut self, id: i16, v: i32) {
        self.field(id, I32);
        self.zigzag(v.into());
    }
    fn i64(&mut self, id: i16, v: i64) {
        self.field(id, I64);
        self.zigzag(v);
    }
    fn binary(&mut self, id: i16, v: &[u8]) {
        self.field(id, BINARY);
        self.varint(v.len() as u64);
        self.out.extend_from_slice(v);
    }
    fn list(&mut self, id: i16, kind: u8, len: usize) {
        self.field(id, LIST);
        if len < 15 {
            self.out.push(((len as u8) << 4) | kind);
        } else {
            self.out.push(0xf0 | kind);
            self.varint(len as u64);
        }
    }
    fn begin_field(&mut self, id: i16) {
        self.field(id, STRUCT);
        self.begin();
    }
}

/// A page: its header (forged where asked) and body (Snappy-framed where asked).
fn page(
    kind: i32,
    body: &[u8],
    snappy: bool,
    uncompressed: Option<i32>,
    header: impl FnOnce(&mut W),
) -> Vec<u8> {
    let stored = if snappy {
        snappy_literal(body)
    } else {
        body.to_vec()
    };
    let mut w = W::default();
    w.begin();
    w.i32(1, kind);
    w.i32(2, uncompressed.unwrap_or(body.len() as i32));
    w.i32(3, stored.len() as i32);
    header(&mut w);
    w.end();
    w.out.extend_from_slice(&stored);
    w.out
}

/// `body` as a raw Snappy block of literals.
fn snappy_literal(body: &[u8]) -> Vec<u8> {
    let mut w = W::default();
    w.varint(body.len() as u64);
    for piece in body.chunks(60) {
        w.out.push(((piece.len() as u8) - 1) << 2);
        w.out.extend_from_slice(piece);
    }
    w.out
}

/// RLE runs of `values` (one run each) at `width` bits.
fn rle(values: &[u64], width: u32) -> Vec<u8> {
    let mut w = W::default();
    let bytes = width.div_ceil(8) as usize;
    for &v in values {
        w.varint(1 << 1);
        w.out.extend_from_slice(&v.to_le_bytes()[..bytes]);
    }
    w.out
}

/// The whole file.
pub fn forge(f: &Forge) -> Vec<u8> {
    let rows = f.values.len();
    let mut file = b"PAR1".to_vec();
    // Column v.
    let v_start = file.len() as u64;
    let mut dictionary_offset = None;
    let mut v_pages = Vec::new();
    let mut data_at = 0;
    if f.dictionary {
        let mut distinct: Vec<i64> = f.values.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let plain: Vec<u8> = distinct.iter().flat_map(|v| v.to_le_bytes()).collect();
        let count = f.dictionary_values.unwrap_or(distinct.len() as i32);
        v_pages.extend(page(2, &plain, f.snappy, None, |w| {
            w.begin_field(7);
            w.i32(1, count);
            w.i32(2, 0);
            w.end();
        }));
        dictionary_offset = Some(v_start);
        let width = (usize::BITS - (distinct.len() - 1).max(1).leading_zeros()).max(1);
        let indices: Vec<u64> = f
            .values
            .iter()
            .map(|v| distinct.binary_search(v).unwrap() as u64)
            .collect();
        let mut body = vec![width as u8];
        body.extend(rle(&indices, width));
        data_at = v_pages.len();
        v_pages.extend(page(0, &body, f.snappy, f.page_uncompressed, |w| {
            w.begin_field(5);
            w.i32(1, rows as i32);
            w.i32(2, 8);
            w.i32(3, 3);
            w.i32(4, 3);
            w.end();
        }));
    } else {
        let plain: Vec<u8> = f.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        v_pages.extend(page(0, &plain, f.snappy, f.page_uncompressed, |w| {
            w.begin_field(5);
            w.i32(1, rows as i32);
            w.i32(2, 0);
            w.i32(3, 3);
            w.i32(4, 3);
            w.end();
        }));
    }
    file.extend_from_slice(&v_pages);
    let v_meta = (v_start, dictionary_offset, v_pages.clone());
    // Column x, all null.
    let x_meta = (f.deep > 0).then(|| {
        let start = file.len() as u64;
        let max_def = f.deep as u64 + 1;
        let width = u64::BITS - max_def.leading_zeros();
        let mut levels = W::default();
        levels.varint((rows as u64) << 1);
        levels
            .out
            .extend_from_slice(&0u64.to_le_bytes()[..width.div_ceil(8) as usize]);
        let mut body = (levels.out.len() as u32).to_le_bytes().to_vec();
        body.extend_from_slice(&levels.out);
        let pages = page(0, &body, false, None, |w| {
            w.begin_field(5);
            w.i32(1, rows as i32);
            w.i32(2, 0);
            w.i32(3, 3);
            w.i32(4, 3);
            w.end();
        });
        file.extend_from_slice(&pages);
        (start, pages)
    });
    // The footer.
    let mut w = W::default();
    w.begin();
    w.i32(1, 1);
    let elements = 2 + if f.deep > 0 { f.deep + 1 } else { 0 };
    w.list(2, STRUCT, elements);
    w.begin();
    w.binary(4, b"schema");
    w.i32(5, if f.deep > 0 { 2 } else { 1 });
    w.end();
    w.begin();
    w.i32(1, f.schema_type);
    w.i32(3, 0);
    w.binary(4, b"v");
    w.end();
    for d in 0..f.deep {
        w.begin();
        w.i32(3, 1);
        w.binary(4, format!("g{d}").as_bytes());
        w.i32(5, 1);
        w.end();
    }
    if f.deep > 0 {
        w.begin();
        w.i32(1, 2);
        w.i32(3, 1);
        w.binary(4, b"x");
        w.end();
    }
    w.i64(3, rows as i64);
    w.list(4, STRUCT, 1);
    w.begin();
    w.list(1, STRUCT, if f.deep > 0 { 2 } else { 1 });
    let (start, dictionary, pages) = v_meta;
    let data = start + data_at as u64;
    chunk(
        &mut w,
        f.chunk_type,
        &[b"v".to_vec()],
        i32::from(f.snappy),
        (rows, start, dictionary, data, pages.len()),
        f.chunk_uncompressed
            .unwrap_or(uncompressed_total(f, &pages)),
    );
    if let Some((start, pages)) = x_meta {
        let mut path: Vec<Vec<u8>> = (0..f.deep).map(|d| format!("g{d}").into_bytes()).collect();
        path.push(b"x".to_vec());
        chunk(
            &mut w,
            2,
            &path,
            0,
            (rows, start, None, start, pages.len()),
            pages.len() as i64,
        );
    }
    w.i64(2, 0);
    w.i64(3, rows as i64);
    w.end();
    w.end();
    let footer = w.out;
    file.extend_from_slice(&footer);
    file.extend_from_slice(&(footer.len() as u32).to_le_bytes());
    file.extend_from_slice(b"PAR1");
    file
}

/// The uncompressed size of a chunk's pages: headers plus bodies as declared.
fn uncompressed_total(f: &Forge, pages: &[u8]) -> i64 {
    if !f.snappy {
        return pages.len() as i64;
    }
    // Each Snappy body holds its uncompressed length up front; headers are the same either way.
    let mut total = 0i64;
    let mut at = 0usize;
    while at < pages.len() {
        let (header_len, uncompressed, compressed) = read_header(&pages[at..]);
        total += (header_len + uncompressed) as i64;
        at += header_len + compressed;
    }
    total
}

/// A page header's length, and its sizes (uncompressed as the body holds it, for Snappy).
fn read_header(bytes: &[u8]) -> (usize, usize, usize) {
    let mut at = 0;
    let varint = |at: &mut usize| {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let b = bytes[*at];
            *at += 1;
            v |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                return v;
            }
        }
    };
    let unzig = |v: u64| ((v >> 1) as i64 ^ -((v & 1) as i64)) as usize;
    // Fields 1-3 are i32s, in order; then one struct of i32s (ending in a stop byte), then stop.
    let mut sizes = [0usize; 3];
    for size in &mut sizes {
        at += 1;
        *size = unzig(varint(&mut at));
    }
    at += 1;
    while bytes[at] != 0 {
        at += 1;
        varint(&mut at);
    }
    at += 2;
    let body_len = {
        let mut k = at;
        varint(&mut k) as usize
    };
    (at, body_len, sizes[2])
}

fn chunk(
    w: &mut W,
    physical: i32,
    path: &[Vec<u8>],
    codec: i32,
    (rows, start, dictionary, data, compressed): (usize, u64, Option<u64>, u64, usize),
    uncompressed: i64,
) {
    w.begin();
    w.i64(2, start as i64);
    w.begin_field(3);
    w.i32(1, physical);
    w.list(2, I32, 1);
    w.zigzag(0);
    w.list(3, BINARY, path.len());
    for part in path {
        w.varint(part.len() as u64);
        w.out.extend_from_slice(part);
    }
    w.i32(4, codec);
    w.i64(5, rows as i64);
    w.i64(6, uncompressed);
    w.i64(7, compressed as i64);
    w.i64(9, data as i64);
    if let Some(d) = dictionary {
        w.i64(11, d as i64);
    }
    w.end();
    w.end();
}
