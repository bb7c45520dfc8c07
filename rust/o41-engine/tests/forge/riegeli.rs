//! `ArrayRecord` files written byte by byte as `ArrayRecordWriter` lays them out (Riegeli block
//! headers every 64 KiB, simple chunks, a footer chunk, a postscript in the last block), with
//! any count, size or offset forged while every hash still matches: what a reader meets when a
//! writer lies rather than when a disk flips a bit.

use highway::{HighwayHash, HighwayHasher, Key};

const BLOCK: usize = 1 << 16;
const KEY: Key = Key([
    0x2f69_6c65_6765_6952,
    0x0a73_6472_6f63_6572,
    0x2f69_6c65_6765_6952,
    0x0a73_6472_6f63_6572,
]);
const MAGIC: u64 = 0x7193_0e70_4fda_e05e;

/// A value to forge, by where it is written.
#[derive(Debug, Clone, Copy)]
pub enum Lie {
    /// Footer entry `k`'s chunk offset.
    EntryOffset(usize),
    /// Footer entry `k`'s record count.
    EntryRecords(usize),
    /// Footer entry `k`'s decoded size.
    EntryDecoded(usize),
    /// The footer metadata's version.
    Version,
    /// The footer metadata's chunk count.
    Chunks,
    /// The footer metadata's record count.
    Records,
    /// The postscript's footer offset.
    FooterOffset,
    /// Data chunk `k`'s header: its record count.
    HeaderRecords(usize),
    /// Data chunk `k`'s header: its decoded size.
    HeaderDecoded(usize),
    /// The size of record `k` in its chunk's sizes.
    RecordSize(usize),
}

fn hash(bytes: &[u8]) -> u64 {
    HighwayHasher::new(KEY).hash64(bytes)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A protocol buffer message of varint fields `(number, value)`.
fn message(fields: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(number, value) in fields {
        varint(&mut out, number << 3);
        varint(&mut out, value);
    }
    out
}

/// A file being written: block headers go in at every 64 KiB.
struct Out(Vec<u8>);

impl Out {
    fn put(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.0.len().is_multiple_of(BLOCK) {
                // The reader skips block headers; their contents are not checked.
                self.0.extend_from_slice(&[0u8; 24]);
            }
            self.0.push(b);
        }
    }

    /// A chunk starting here; returns its offset.
    fn chunk(&mut self, kind: u8, records: u64, decoded: u64, data: &[u8]) -> u64 {
        let offset = self.0.len() as u64;
        let mut head = Vec::with_capacity(32);
        head.extend_from_slice(&(data.len() as u64).to_le_bytes());
        head.extend_from_slice(&hash(data).to_le_bytes());
        head.extend_from_slice(&(u64::from(kind) | (records << 8)).to_le_bytes());
        head.extend_from_slice(&decoded.to_le_bytes());
        self.put(&hash(&head).to_le_bytes());
        self.put(&head);
        self.put(data);
        // A chunk takes at least as many bytes as it has records.
        while (self.0.len() as u64) < offset + records.min(1 << 20) {
            self.put(&[0]);
        }
        offset
    }

    fn pad_to_block(&mut self) {
        while !self.0.len().is_multiple_of(BLOCK) {
            self.0.push(0);
        }
    }
}

/// A simple chunk's data, uncompressed: the records' sizes (`sizes`), then the records.
fn simple(sizes: &[u64], values: &[u8]) -> Vec<u8> {
    let mut encoded = Vec::new();
    for &s in sizes {
        varint(&mut encoded, s);
    }
    let mut data = vec![0u8];
    varint(&mut data, encoded.len() as u64);
    data.extend_from_slice(&encoded);
    data.extend_from_slice(values);
    data
}

/// An `ArrayRecord` file of `records`, `group` a chunk, with `lies` told.
pub fn array_record(records: &[Vec<u8>], group: usize, lies: &[(Lie, u64)]) -> Vec<u8> {
    let lie = |what: &dyn Fn(Lie) -> bool, truth: u64| {
        lies.iter()
            .rev()
            .find(|(l, _)| what(*l))
            .map_or(truth, |(_, v)| *v)
    };
    let mut out = Out(Vec::new());
    out.chunk(b's', 0, 0, &[]);
    let mut entries = Vec::new();
    for (k, group_records) in records.chunks(group.max(1)).enumerate() {
        let first = k * group.max(1);
        let sizes: Vec<u64> = group_records
            .iter()
            .enumerate()
            .map(|(j, r)| {
                lie(
                    &|l| matches!(l, Lie::RecordSize(i) if i == first + j),
                    r.len() as u64,
                )
            })
            .collect();
        let values: Vec<u8> = group_records.concat();
        let n = group_records.len() as u64;
        let decoded = values.len() as u64;
        let offset = out.chunk(
            b'r',
            lie(&|l| matches!(l, Lie::HeaderRecords(i) if i == k), n),
            lie(&|l| matches!(l, Lie::HeaderDecoded(i) if i == k), decoded),
            &simple(&sizes, &values),
        );
        entries.push(message(&[
            (
                1,
                lie(&|l| matches!(l, Lie::EntryOffset(i) if i == k), offset),
            ),
            (
                2,
                lie(&|l| matches!(l, Lie::EntryDecoded(i) if i == k), decoded),
            ),
            (3, lie(&|l| matches!(l, Lie::EntryRecords(i) if i == k), n)),
        ]));
    }
    let metadata = message(&[
        (1, lie(&|l| matches!(l, Lie::Version), 1)),
        (2, lie(&|l| matches!(l, Lie::Chunks), entries.len() as u64)),
        (3, lie(&|l| matches!(l, Lie::Records), records.len() as u64)),
    ]);
    let mut footer_metadata = vec![0x0a];
    varint(&mut footer_metadata, metadata.len() as u64);
    footer_metadata.extend_from_slice(&metadata);
    let mut footer_records = vec![footer_metadata];
    footer_records.extend(entries);
    let sizes: Vec<u64> = footer_records.iter().map(|r| r.len() as u64).collect();
    let values = footer_records.concat();
    let footer = out.chunk(
        b'r',
        footer_records.len() as u64,
        values.len() as u64,
        &simple(&sizes, &values),
    );
    out.pad_to_block();
    let postscript = message(&[
        (1, lie(&|l| matches!(l, Lie::FooterOffset), footer)),
        (2, MAGIC),
    ]);
    let copies = [postscript.clone(), postscript.clone(), postscript];
    let sizes: Vec<u64> = copies.iter().map(|r| r.len() as u64).collect();
    let values = copies.concat();
    out.chunk(b'r', 3, values.len() as u64, &simple(&sizes, &values));
    out.pad_to_block();
    out.0
}
