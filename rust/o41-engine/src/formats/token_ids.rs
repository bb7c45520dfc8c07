//! Token ids as flat token files store them: little-endian integers of 1, 2, 4 or 8 bytes,
//! signed or not (`.bin`, Megatron's `.bin`, `NumPy` arrays).

/// The type of a flat file's ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdType {
    /// Bytes per id: 1, 2, 4 or 8.
    pub width: u64,
    /// Whether ids are two's-complement signed.
    pub signed: bool,
}

impl IdType {
    /// `uint16`, our own `.bin` files' narrow ids.
    pub const U16: IdType = IdType::new(2, false);
    /// `uint32`.
    pub const U32: IdType = IdType::new(4, false);

    /// The type of `width`-byte ids.
    pub const fn new(width: u64, signed: bool) -> Self {
        IdType { width, signed }
    }

    /// Parses a `NumPy` name (`uint16`, `int32`), a `NumPy` type code without its byte order
    /// (`u2`, `i4`: widths in bytes), or the bit-width short form (`u16`, `i32`).
    pub fn parse(name: &str) -> Option<Self> {
        let (signed, digits, in_bytes) = if let Some(d) = name.strip_prefix("uint") {
            (false, d, false)
        } else if let Some(d) = name.strip_prefix("int") {
            (true, d, false)
        } else if let Some(d) = name.strip_prefix('u') {
            (false, d, matches!(d, "1" | "2" | "4" | "8"))
        } else if let Some(d) = name.strip_prefix('i') {
            (true, d, matches!(d, "1" | "2" | "4" | "8"))
        } else {
            return None;
        };
        let width = match (in_bytes, digits) {
            (true, d) => d.parse().ok()?,
            (false, "8") => 1,
            (false, "16") => 2,
            (false, "32") => 4,
            (false, "64") => 8,
            _ => return None,
        };
        Some(IdType::new(width, signed))
    }

    /// The `NumPy` name of the type (`uint16`).
    pub fn name(self) -> String {
        format!(
            "{}int{}",
            if self.signed { "" } else { "u" },
            8 * self.width
        )
    }

    /// The largest id the type holds.
    pub fn largest(self) -> u64 {
        match (self.width, self.signed) {
            (8, false) => u64::MAX,
            (w, false) => (1u64 << (8 * w)) - 1,
            (w, true) => (1u64 << (8 * w - 1)) - 1,
        }
    }

    /// The id `bytes` (exactly `width` of them) hold.
    pub fn get(self, bytes: &[u8]) -> i128 {
        let mut le = [0u8; 8];
        le[..bytes.len()].copy_from_slice(bytes);
        let raw = u64::from_le_bytes(le);
        if !self.signed || bytes.is_empty() {
            return i128::from(raw);
        }
        // Sign-extend from the id's own width.
        let shift = 64 - 8 * bytes.len() as u32;
        i128::from(((raw << shift) as i64) >> shift)
    }

    /// Appends the ids `bytes` hold to `out`; an unsigned 64-bit id above `i64::MAX` (no token
    /// column holds it) is the error.
    pub fn decode(self, bytes: &[u8], out: &mut Vec<i64>) -> Result<(), i128> {
        let w = self.width as usize;
        out.reserve(bytes.len() / w);
        match (w, self.signed) {
            (1, false) => out.extend(bytes.iter().map(|&b| i64::from(b))),
            (1, true) => out.extend(bytes.iter().map(|&b| i64::from(b as i8))),
            (2, false) => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| i64::from(u16::from_le_bytes([b[0], b[1]]))),
            ),
            (2, true) => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| i64::from(i16::from_le_bytes([b[0], b[1]]))),
            ),
            (4, false) => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| i64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            ),
            (4, true) => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            ),
            _ => {
                for b in bytes.chunks_exact(8) {
                    let v = self.get(b);
                    out.push(i64::try_from(v).map_err(|_| v)?);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::IdType;

    #[test]
    fn names_parse_to_their_widths_and_back() {
        for (name, width, signed) in [
            ("uint8", 1, false),
            ("int8", 1, true),
            ("uint16", 2, false),
            ("int16", 2, true),
            ("uint32", 4, false),
            ("int32", 4, true),
            ("uint64", 8, false),
            ("int64", 8, true),
        ] {
            let t = IdType::parse(name).unwrap();
            assert_eq!((t.width, t.signed), (width, signed), "{name}");
            assert_eq!(t.name(), name);
        }
        assert_eq!(IdType::parse("u2"), Some(IdType::U16));
        assert_eq!(IdType::parse("u16"), Some(IdType::U16));
        assert_eq!(IdType::parse("i8"), Some(IdType::new(8, true)));
        assert_eq!(IdType::parse("u1"), Some(IdType::new(1, false)));
        assert_eq!(IdType::parse("float32"), None);
        assert_eq!(IdType::parse("u3"), None);
    }

    #[test]
    fn signed_ids_are_sign_extended_and_wide_unsigned_ones_refused() {
        let mut out = Vec::new();
        IdType::new(2, true)
            .decode(&(-3i16).to_le_bytes(), &mut out)
            .unwrap();
        IdType::new(8, true)
            .decode(&(-5i64).to_le_bytes(), &mut out)
            .unwrap();
        assert_eq!(out, [-3, -5]);
        assert_eq!(IdType::new(2, true).get(&(-3i16).to_le_bytes()), -3);
        let big = u64::MAX.to_le_bytes();
        assert_eq!(
            IdType::new(8, false).decode(&big, &mut out),
            Err(i128::from(u64::MAX))
        );
        assert_eq!(IdType::new(4, true).largest(), i32::MAX as u64);
        assert_eq!(IdType::U16.largest(), 65535);
    }
}
