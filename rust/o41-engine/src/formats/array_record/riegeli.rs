//! The parts of the Riegeli/records file format an `ArrayRecord` file uses: block headers every
//! 64 KiB, chunk headers with their `HighwayHash` checks, and simple chunks of records, raw or
//! compressed with Brotli, zstd or Snappy (Riegeli's `doc/riegeli_records_file_format.md`).
//!
//! Every size read from a file is checked against the bytes actually there, or against a bound
//! the caller gives, before anything is allocated for it.

use std::io::Read;

use highway::{HighwayHash, HighwayHasher, Key};

/// Riegeli's block size: a block header sits at every multiple of it.
pub const BLOCK: u64 = 1 << 16;
/// A block header: its hash, the distance back to the chunk it interrupts, and forward to its end.
pub const BLOCK_HEADER: u64 = 24;
/// A chunk header: its hash, data size, data hash, type, record count and decoded size.
pub const CHUNK_HEADER: usize = 40;

/// The `HighwayHash` key every Riegeli hash uses ("Riegeli/records\n" twice).
const KEY: Key = Key([
    0x2f69_6c65_6765_6952,
    0x0a73_6472_6f63_6572,
    0x2f69_6c65_6765_6952,
    0x0a73_6472_6f63_6572,
]);

fn hash(bytes: &[u8]) -> u64 {
    HighwayHasher::new(KEY).hash64(bytes)
}

/// What a chunk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkType {
    /// The file signature that opens every Riegeli file (`s`).
    Signature,
    /// Records sizes and values in two buffers (`r`): what `ArrayRecordWriter` writes.
    Simple,
    /// Anything else: transposed records (`t`), metadata (`m`), padding (`p`).
    Other(u8),
}

/// A chunk's header.
#[derive(Debug, Clone, Copy)]
pub struct ChunkHeader {
    /// Bytes of data after the header, block headers not counted.
    pub data_size: u64,
    data_hash: u64,
    /// The chunk's type.
    pub chunk_type: ChunkType,
    /// Records in the chunk.
    pub records: u64,
    /// The records' total size, decoded.
    pub decoded_size: u64,
}

impl ChunkHeader {
    /// Parses and checks the 40 bytes of a chunk header.
    pub fn parse(bytes: &[u8; CHUNK_HEADER]) -> Result<Self, String> {
        let word = |at: usize| {
            u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes of a header"))
        };
        if hash(&bytes[8..]) != word(0) {
            return Err("its chunk header does not match its hash (the file is damaged)".into());
        }
        let kind = word(24);
        Ok(ChunkHeader {
            data_size: word(8),
            data_hash: word(16),
            chunk_type: match kind as u8 {
                b's' => ChunkType::Signature,
                b'r' => ChunkType::Simple,
                other => ChunkType::Other(other),
            },
            records: kind >> 8,
            decoded_size: word(32),
        })
    }

    /// Checks `data` (the chunk's data, block headers removed) against the header's hash.
    pub fn check_data(&self, data: &[u8]) -> Result<(), String> {
        if data.len() as u64 != self.data_size {
            return Err(format!(
                "its chunk data is {} bytes; its header says {}",
                data.len(),
                self.data_size
            ));
        }
        if hash(data) != self.data_hash {
            return Err("its chunk data does not match its hash (the file is damaged)".into());
        }
        Ok(())
    }
}

/// The file bytes read from file offset `start` without the block headers among them; a read
/// that starts inside a block header keeps only what follows it.
pub fn strip_block_headers(start: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = start;
    let end = start + bytes.len() as u64;
    while at < end {
        let in_block = at % BLOCK;
        if in_block < BLOCK_HEADER {
            at = (at - in_block + BLOCK_HEADER).min(end);
            continue;
        }
        let next = (at - in_block + BLOCK).min(end);
        out.extend_from_slice(&bytes[(at - start) as usize..(next - start) as usize]);
        at = next;
    }
    out
}

/// Reads a varint64 from the front of `bytes`, advancing past it.
pub fn varint(bytes: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for k in 0..10 {
        let (&b, rest) = bytes
            .split_first()
            .ok_or_else(|| "a varint is cut short".to_owned())?;
        *bytes = rest;
        if k == 9 && b > 1 {
            return Err("a varint overflows 64 bits".into());
        }
        value |= u64::from(b & 0x7f) << (7 * k);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a varint runs past 10 bytes".into())
}

/// How a simple chunk's buffers are compressed.
#[derive(Debug, Clone, Copy)]
enum Compression {
    None,
    Brotli,
    Zstd,
    Snappy,
}

fn compression(byte: u8) -> Result<Compression, String> {
    match byte {
        0 => Ok(Compression::None),
        b'b' => Ok(Compression::Brotli),
        b'z' => Ok(Compression::Zstd),
        b's' => Ok(Compression::Snappy),
        other => Err(format!(
            "its chunk is compressed with type {other:#04x}, not one Riegeli defines \
             (none, brotli, zstd, snappy)"
        )),
    }
}

/// Decompresses one buffer of a chunk, which must decode to `expected` bytes when that is
/// known, and to at most `most` bytes in any case.
fn decompress(
    how: Compression,
    mut data: &[u8],
    expected: Option<u64>,
    most: u64,
) -> Result<Vec<u8>, String> {
    if let Compression::None = how {
        return Ok(data.to_vec());
    }
    let size = varint(&mut data)?;
    if let Some(expected) = expected {
        if size != expected {
            return Err(format!(
                "a compressed buffer says it holds {size} bytes; the chunk header says {expected}"
            ));
        }
    }
    if size > most {
        return Err(format!(
            "a compressed buffer says it holds {size} bytes, more than the {most} its chunk allows"
        ));
    }
    let bad = |e: &dyn std::fmt::Display| format!("a compressed buffer does not decode: {e}");
    let mut out = Vec::new();
    let mut take = |reader: &mut dyn Read| {
        reader
            .take(size + 1)
            .read_to_end(&mut out)
            .map(|_| ())
            .map_err(|e| bad(&e))
    };
    match how {
        Compression::None => unreachable!("returned above"),
        Compression::Zstd => {
            take(&mut zstd::stream::read::Decoder::new(data).map_err(|e| bad(&e))?)?;
        }
        Compression::Brotli => take(&mut brotli::Decompressor::new(data, 4096))?,
        Compression::Snappy => {
            let len = snap::raw::decompress_len(data).map_err(|e| bad(&e))?;
            if len as u64 != size {
                return Err(format!(
                    "a Snappy buffer holds {len} bytes; its prefix says {size}"
                ));
            }
            out = snap::raw::Decoder::new()
                .decompress_vec(data)
                .map_err(|e| bad(&e))?;
        }
    }
    if out.len() as u64 != size {
        return Err(format!(
            "a compressed buffer decodes to {}{} bytes; its prefix says {size}",
            if out.len() as u64 > size {
                "more than "
            } else {
                ""
            },
            out.len().min(size as usize)
        ));
    }
    Ok(out)
}

/// A simple chunk's records: where each ends in `values`.
#[derive(Debug, Default)]
pub struct Records {
    /// Each record's end in `values`; record `k` starts where `k - 1` ends.
    pub ends: Vec<u64>,
    /// The records, concatenated; empty when only their sizes were asked for.
    pub values: Vec<u8>,
}

impl Records {
    /// Record `k`'s bytes.
    pub fn get(&self, k: usize) -> &[u8] {
        let start = if k == 0 { 0 } else { self.ends[k - 1] };
        &self.values[start as usize..self.ends[k] as usize]
    }

    /// Record `k`'s size.
    pub fn size(&self, k: usize) -> u64 {
        self.ends[k] - if k == 0 { 0 } else { self.ends[k - 1] }
    }
}

/// Decodes the data of a simple chunk that `header` describes (`data` checked against it):
/// its records' sizes, and their values when `values` is set.
pub fn simple_records(header: &ChunkHeader, data: &[u8], values: bool) -> Result<Records, String> {
    let mut rest = data;
    let (&kind, after) = rest
        .split_first()
        .ok_or_else(|| "its simple chunk is empty".to_owned())?;
    rest = after;
    let how = compression(kind)?;
    let sizes_len = varint(&mut rest)?;
    if sizes_len > rest.len() as u64 {
        return Err(format!(
            "its record sizes are {sizes_len} bytes, past the chunk's {}",
            data.len()
        ));
    }
    let (sizes, packed) = rest.split_at(sizes_len as usize);
    // A varint is at least one byte and at most ten.
    let sizes = decompress(how, sizes, None, 10 * header.records)?;
    let mut ends = Vec::with_capacity(sizes.len().min(header.records as usize));
    let mut cursor: &[u8] = &sizes;
    let mut total = 0u64;
    while !cursor.is_empty() {
        let size = varint(&mut cursor)?;
        total = total
            .checked_add(size)
            .filter(|&t| t <= header.decoded_size)
            .ok_or_else(|| {
                format!(
                    "its record sizes add up to more than the {} bytes its header gives",
                    header.decoded_size
                )
            })?;
        ends.push(total);
    }
    if ends.len() as u64 != header.records || total != header.decoded_size {
        return Err(format!(
            "its record sizes give {} records of {total} bytes; its header says {} of {}",
            ends.len(),
            header.records,
            header.decoded_size
        ));
    }
    let values = if values {
        decompress(how, packed, Some(header.decoded_size), header.decoded_size)?
    } else {
        Vec::new()
    };
    if !values.is_empty() && values.len() as u64 != header.decoded_size {
        return Err(format!(
            "its records are {} bytes; its header says {}",
            values.len(),
            header.decoded_size
        ));
    }
    Ok(Records { ends, values })
}

/// Splits a chunk read whole (`bytes`, block headers removed) into its header and data.
pub fn split_chunk(bytes: &[u8]) -> Result<(ChunkHeader, &[u8]), String> {
    let head: &[u8; CHUNK_HEADER] = bytes
        .get(..CHUNK_HEADER)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| {
            format!(
                "a chunk of {} bytes has no room for its header",
                bytes.len()
            )
        })?;
    let header = ChunkHeader::parse(head)?;
    let data = bytes[CHUNK_HEADER..]
        .get(..usize::try_from(header.data_size).unwrap_or(usize::MAX))
        .ok_or_else(|| {
            format!(
                "its chunk header gives {} bytes of data; {} follow it before the next chunk",
                header.data_size,
                bytes.len() - CHUNK_HEADER
            )
        })?;
    header.check_data(data)?;
    Ok((header, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_headers_are_cut_wherever_a_read_starts() {
        let file: Vec<u8> = (0..3 * BLOCK).map(|i| (i % 251) as u8).collect();
        let kept = |start: u64, end: u64| {
            (start..end)
                .filter(|i| i % BLOCK >= BLOCK_HEADER)
                .map(|i| (i % 251) as u8)
                .collect::<Vec<u8>>()
        };
        for (start, end) in [
            (0, 3 * BLOCK),
            (10, 100),
            (30, BLOCK + 30),
            (BLOCK - 5, 2 * BLOCK + 3),
        ] {
            let got = strip_block_headers(start, &file[start as usize..end as usize]);
            assert_eq!(got, kept(start, end), "{start}..{end}");
        }
    }

    #[test]
    fn varints_decode_and_overflow_is_refused() {
        let mut b: &[u8] = &[0xac, 0x02, 7];
        assert_eq!(varint(&mut b).unwrap(), 300);
        assert_eq!(b, [7]);
        let mut long: &[u8] = &[0xff; 11];
        assert!(varint(&mut long).is_err());
        let mut cut: &[u8] = &[0x80];
        assert!(varint(&mut cut).is_err());
    }

    #[test]
    fn the_file_signature_header_matches_its_hash() {
        // The first 64 bytes of every Riegeli file, from the format's specification.
        let signature: [u8; 40] = [
            0x91, 0xba, 0xc2, 0x3c, 0x92, 0x87, 0xe1, 0xa9, 0, 0, 0, 0, 0, 0, 0, 0, 0xe1, 0x9f,
            0x13, 0xc0, 0xe9, 0xb1, 0xc3, 0x72, 0x73, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let header = ChunkHeader::parse(&signature).unwrap();
        assert_eq!(header.chunk_type, ChunkType::Signature);
        assert_eq!((header.data_size, header.records), (0, 0));
        header.check_data(&[]).unwrap();
        let mut damaged = signature;
        damaged[9] = 1;
        assert!(ChunkHeader::parse(&damaged).is_err());
    }
}
