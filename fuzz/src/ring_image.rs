//! Oracle for reading a ring file back (`recorder recover`, and the save
//! when a recorder dies): any bytes, read as a ring file.
//!
//! - Reading never panics; a file with no readable header is refused, not
//!   guessed at.
//! - The regions kept lie in the table and in order per writer; the
//!   packets written are at most the unread bytes the table claims.
//! - The salvaged trace is whole `0x0A <len> <packet>` records (no torn
//!   tail, no corruption), every packet a well-formed protobuf message,
//!   and the report counts exactly the bytes written.
//! - Read in place (a sealed memfd) or through reads in windows (a file),
//!   the same bytes make the same trace.
//!
//! The seeds are ring files of a few chunks (`-max_len=65536` reaches
//! them): `cargo +nightly fuzz run ring_image -- -max_len=65536`.

use recorder::ringbuf::image::{Check, InMemory, ReadAt, RingImage};
use recorder::trace::salvage::{Head, Ring, SalvageOptions, SavedBy, salvage};
use recorder::wire::fields::fields;
use recorder::wire::framing::frames;

/// The same bytes, read as a file is: copied out in windows, never in
/// place.
struct Windowed<'a>(InMemory<'a>);

impl ReadAt for Windowed<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn size(&self) -> std::io::Result<u64> {
        self.0.size()
    }
}

pub fn check(data: &[u8]) {
    let src = InMemory(data);
    let Ok(image) = RingImage::read(&src) else {
        return;
    };
    let h = &image.header;
    for r in &image.regions {
        assert!(
            u64::from(r.head) + u64::from(r.chunks) <= u64::from(h.chunk_count),
            "{r:?}"
        );
        assert!(r.from <= r.to);
        assert!(u64::from(r.to) <= u64::from(r.chunks) * u64::from(h.chunk_size));
    }
    for w in image.regions.windows(2) {
        assert!((w[0].writer, w[0].order) <= (w[1].writer, w[1].order));
    }
    let unread = image.unread_bytes();
    for check in [Check::Packets, Check::Framing] {
        let mut rings = vec![Ring {
            image: image.clone(),
            src: &src,
        }];
        let mut out = Vec::new();
        let opts = SalvageOptions {
            head: Head::Full,
            check,
            by: SavedBy::Recover,
            pid: None,
            signal: None,
            segment: None,
        };
        let report = salvage(&mut rings, 0, &mut out, &opts).expect("in-memory writes succeed");
        let windowed = Windowed(src);
        let mut rings = vec![Ring {
            image: image.clone(),
            src: &windowed,
        }];
        let mut read_out = Vec::new();
        let read_report =
            salvage(&mut rings, 0, &mut read_out, &opts).expect("in-memory writes succeed");
        assert_eq!(report.packets, read_report.packets);
        assert_eq!(report.damage, read_report.damage);
        // On another boot nothing is read from the clocks now: byte for byte.
        if !report.same_boot {
            assert_eq!(out, read_out);
        }
        assert_eq!(report.written, out.len() as u64);
        assert!(report.bytes <= unread, "{} > {unread}", report.bytes);
        let mut records = frames(&out);
        let mut n = 0u64;
        for f in records.by_ref() {
            if check == Check::Packets {
                for field in fields(f.packet) {
                    field.expect("every packet written is protobuf");
                }
            }
            n += 1;
        }
        let end = records.end().expect("walked to the end");
        assert!(end.corruption.is_none() && end.torn_tail.is_none(), "{end:?}");
        assert!(n >= report.packets);
    }
}
