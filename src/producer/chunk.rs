//! One chunk of a producer's shared memory, as copied out of it: the 8-byte
//! header and the fragments of packets (ARCHITECTURE.md §9.5, ARCHITECTURE.md §9.5).
//!
//! ```text
//!  ┌──────────────┬───────────┬──────────────────┬──────────────────────┐
//!  │ chunk_id u32 │ writer u16│ packets u16      │ fragments …          │
//!  │ (LE)         │ (LE)      │ count:10 flags:6 │ varint len │ bytes … │
//!  └──────────────┴───────────┴──────────────────┴──────────────────────┘
//!   flags: 1 first fragment continues the previous chunk's last packet,
//!          2 last fragment continues in the next chunk, 4 needs patching
//! ```
//!
//! Every value here came from another process: the parser bounds-checks
//! each length against the chunk and reports what does not fit.

/// Bytes of the chunk header.
pub(crate) const HEADER_BYTES: usize = 8;
/// The first fragment continues the previous chunk's last packet.
pub(crate) const FIRST_CONTINUES: u8 = 1;
/// The last fragment continues in the next chunk.
pub(crate) const LAST_CONTINUES: u8 = 2;
/// Patches are due before the chunk may be read.
pub(crate) const NEEDS_PATCHING: u8 = 4;
/// A fragment length that means "the writer dropped this packet".
pub(crate) const DROPPED_PACKET_LEN: u32 = 0x0FFF_FFFF;
/// The longest length prefix of a fragment.
const MAX_LEN_BYTES: usize = 4;

/// The header of a chunk, untrusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChunkHeader {
    pub(crate) chunk_id: u32,
    pub(crate) writer_id: u16,
    pub count: u16,
    pub flags: u8,
}

impl ChunkHeader {
    /// Reads the header at the start of `chunk` (None: shorter than one).
    pub(crate) fn parse(chunk: &[u8]) -> Option<ChunkHeader> {
        let h = chunk.first_chunk::<HEADER_BYTES>()?;
        let packets = u16::from_le_bytes([h[6], h[7]]);
        Some(ChunkHeader {
            chunk_id: u32::from_le_bytes([h[0], h[1], h[2], h[3]]),
            writer_id: u16::from_le_bytes([h[4], h[5]]),
            count: packets & 0x3FF,
            flags: (packets >> 10) as u8,
        })
    }
}

/// One item of a chunk's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Bytes(&'a [u8]),
    /// The writer marked a packet as dropped (its SMB was full).
    Dropped,
}

/// Why the rest of a chunk was abandoned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChunkError {
    #[error("fragment length prefix runs past the chunk or over 4 bytes")]
    BadLength,
    #[error("fragment of {len_untrusted} bytes runs past the chunk")]
    PastEnd { len_untrusted: u32 },
}

/// The fragments of a payload holding `count` of them. Iteration ends at the
/// first error (the rest of the chunk cannot be trusted).
pub(crate) fn fragments(payload: &[u8], count: u16) -> Fragments<'_> {
    Fragments {
        rest: payload,
        left: count,
        failed: false,
    }
}

/// Iterator of [`fragments`].
#[derive(Debug)]
pub(crate) struct Fragments<'a> {
    rest: &'a [u8],
    left: u16,
    failed: bool,
}

impl<'a> Iterator for Fragments<'a> {
    type Item = Result<Fragment<'a>, ChunkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 || self.failed {
            return None;
        }
        self.left -= 1;
        // At most MAX_LEN_BYTES bytes (the SDK's redundant 4-byte form).
        let (len, used) = match crate::wire::varint::decode(self.rest) {
            Ok((v, n)) if n <= MAX_LEN_BYTES => (v as u32, n),
            _ => {
                self.failed = true;
                return Some(Err(ChunkError::BadLength));
            }
        };
        self.rest = &self.rest[used..];
        if len == DROPPED_PACKET_LEN {
            return Some(Ok(Fragment::Dropped));
        }
        let Some(bytes) = self.rest.get(..len as usize) else {
            self.failed = true;
            return Some(Err(ChunkError::PastEnd { len_untrusted: len }));
        };
        self.rest = &self.rest[len as usize..];
        Some(Ok(Fragment::Bytes(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(out: &mut Vec<u8>, data: &[u8]) {
        let n = data.len() as u32;
        // The SDK's redundant 4-byte varint.
        out.extend([
            (n & 0x7F) as u8 | 0x80,
            ((n >> 7) & 0x7F) as u8 | 0x80,
            ((n >> 14) & 0x7F) as u8 | 0x80,
            ((n >> 21) & 0x7F) as u8,
        ]);
        out.extend(data);
    }

    #[test]
    fn header_fields_sit_where_the_abi_puts_them() {
        let mut c = vec![0u8; 16];
        c[..4].copy_from_slice(&7u32.to_le_bytes());
        c[4..6].copy_from_slice(&3u16.to_le_bytes());
        c[6..8].copy_from_slice(&((5u16) | (u16::from(LAST_CONTINUES) << 10)).to_le_bytes());
        let h = ChunkHeader::parse(&c).expect("long enough");
        assert_eq!(
            h,
            ChunkHeader {
                chunk_id: 7,
                writer_id: 3,
                count: 5,
                flags: LAST_CONTINUES
            }
        );
        assert_eq!(ChunkHeader::parse(&c[..7]), None);
    }

    #[test]
    fn fragments_come_out_in_order_and_a_bad_length_ends_the_chunk() {
        let mut p = Vec::new();
        frag(&mut p, b"abc");
        p.push(0); // the SDK's empty placeholder
        frag(&mut p, b"");
        p.extend([0xFF, 0xFF, 0xFF, 0x7F]); // dropped
        frag(&mut p, b"de");
        let got: Vec<_> = fragments(&p, 5).collect();
        assert_eq!(
            got,
            vec![
                Ok(Fragment::Bytes(b"abc")),
                Ok(Fragment::Bytes(b"")),
                Ok(Fragment::Bytes(b"")),
                Ok(Fragment::Dropped),
                Ok(Fragment::Bytes(b"de")),
            ]
        );
        let mut bad = Vec::new();
        frag(&mut bad, b"xy");
        bad.extend([0x80 | 100, 0]);
        bad.extend(b"short");
        let got: Vec<_> = fragments(&bad, 9).collect();
        assert_eq!(
            got,
            vec![
                Ok(Fragment::Bytes(b"xy")),
                Err(ChunkError::PastEnd { len_untrusted: 100 })
            ]
        );
        let five = [0x80u8, 0x80, 0x80, 0x80, 0x01];
        assert_eq!(
            fragments(&five, 1).collect::<Vec<_>>(),
            vec![Err(ChunkError::BadLength)]
        );
    }
}
