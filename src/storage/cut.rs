//! Cutting a write at the last whole packet under a byte cap
//! (`max_file_size_bytes`).
//!
//! The buffers handed to a sink hold the file's framing: repeated
//! `0x0A <varint len> <packet>`, where a record may span slices. Perfetto
//! writes nothing that would reach the cap, so a record is kept only when its
//! end stays strictly under `limit`.

use std::io::IoSlice;

use crate::sys::iov::io_slice_bytes;
use crate::wire::framing::SlicedRecords;

use super::batch::total_len;

/// What [`cut_at_packet_boundary`] kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// Bytes of the returned slices.
    pub kept_bytes: u64,
    /// True when something was left out.
    pub cut: bool,
}

/// Cuts `bufs` so their total stays strictly under `limit` bytes and ends on a
/// whole record. When everything already fits, `bufs` come back unchanged.
/// A record whose framing is not `0x0A <varint len>` ends the walk: only the
/// records before it are kept.
pub fn cut_at_packet_boundary<'a>(bufs: &[IoSlice<'a>], limit: u64) -> (Vec<IoSlice<'a>>, Cut) {
    let total = total_len(bufs);
    if total < limit {
        return (
            bufs.to_vec(),
            Cut {
                kept_bytes: total,
                cut: false,
            },
        );
    }
    let mut walk = SlicedRecords::new(bufs);
    let mut kept = 0u64;
    while let Some(end) = walk.next_end() {
        if end >= limit {
            break;
        }
        kept = end;
    }
    (
        prefix(bufs, kept),
        Cut {
            kept_bytes: kept,
            cut: kept < total,
        },
    )
}

/// The first `n` bytes of `bufs`, as sub-slices of the same memory.
fn prefix<'a>(bufs: &[IoSlice<'a>], mut n: u64) -> Vec<IoSlice<'a>> {
    let mut out = Vec::new();
    for b in bufs {
        if n == 0 {
            break;
        }
        let s: &'a [u8] = io_slice_bytes(b);
        let take = (s.len() as u64).min(n) as usize;
        if take > 0 {
            out.push(IoSlice::new(&s[..take]));
        }
        n -= take as u64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::storage::test_records::{flatten, frame, records, split};

    #[test]
    fn keeps_all_when_under_the_limit() {
        let mut data = Vec::new();
        frame(b"abc", &mut data);
        let bufs = [IoSlice::new(&data)];
        let (kept, cut) = cut_at_packet_boundary(&bufs, 6);
        assert_eq!(
            cut,
            Cut {
                kept_bytes: 5,
                cut: false
            }
        );
        assert_eq!(flatten(&kept), data);
    }

    #[test]
    fn a_record_ending_at_the_limit_is_dropped() {
        let mut data = Vec::new();
        frame(b"abc", &mut data);
        frame(b"de", &mut data);
        let bufs = [IoSlice::new(&data)];
        let (kept, cut) = cut_at_packet_boundary(&bufs, 9);
        assert_eq!(
            cut,
            Cut {
                kept_bytes: 5,
                cut: true
            }
        );
        assert_eq!(flatten(&kept), data[..5].to_vec());
    }

    #[test]
    fn bad_framing_stops_the_walk() {
        let mut data = Vec::new();
        frame(b"abc", &mut data);
        data.extend_from_slice(&[0x12, 0x01, 0x00]);
        let bufs = [IoSlice::new(&data)];
        let (_, cut) = cut_at_packet_boundary(&bufs, 1);
        assert_eq!(
            cut,
            Cut {
                kept_bytes: 0,
                cut: true
            }
        );
        let (_, cut) = cut_at_packet_boundary(&bufs, 8);
        assert_eq!(
            cut,
            Cut {
                kept_bytes: 5,
                cut: true
            }
        );
    }

    proptest! {
        // Model: the largest prefix of whole records whose end is < limit.
        #[test]
        fn cut_matches_model(
            sizes in proptest::collection::vec(0usize..300, 0..20),
            splits in proptest::collection::vec(0usize..4000, 0..10),
            limit in 0u64..5000,
        ) {
            let (data, ends) = records(&sizes, |i| i as u8);
            let bufs = split(&data, &splits);
            let total = data.len() as u64;
            let expect = if total < limit {
                total
            } else {
                ends.iter().copied().take_while(|e| *e < limit).last().unwrap_or(0)
            };
            let (kept, cut) = cut_at_packet_boundary(&bufs, limit);
            prop_assert_eq!(cut.kept_bytes, expect);
            prop_assert_eq!(cut.cut, expect < total);
            prop_assert!(cut.kept_bytes < limit || cut.kept_bytes == 0);
            prop_assert_eq!(flatten(&kept), data[..expect as usize].to_vec());
        }
    }
}
