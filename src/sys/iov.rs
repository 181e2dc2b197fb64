//! `IoSlice` helpers std does not offer on stable yet.
//!
//! Invariant:
//! - V1 An `IoSlice<'a>` can only be built from a `&'a [u8]` (std's
//!   constructor), so its pointer and length describe memory that is valid
//!   for `'a` and not mutated while anything may still read it: a write
//!   pass lets ring regions go mid-write only below the floor its sink
//!   never reads again (storage P1, ringbuf M4), so the helpers here take
//!   only the part of a slice that is asked for.

use std::io::IoSlice;

/// The bytes of `s` with their original lifetime `'a` (what the unstable
/// `IoSlice::as_slice` returns), so sub-slices can be re-wrapped without
/// copying.
#[inline]
pub(crate) fn io_slice_bytes<'a>(s: &IoSlice<'a>) -> &'a [u8] {
    // SAFETY: V1 — the pointer and length come from a `&'a [u8]`.
    unsafe { std::slice::from_raw_parts(s.as_ptr(), s.len()) }
}

/// The bytes of `s` from `off` on (`off <= s.len()`), with their original
/// lifetime, without making a slice of the bytes before `off` (those may
/// have been let go of, V1).
#[inline]
pub(crate) fn io_slice_from<'a>(s: &IoSlice<'a>, off: usize) -> &'a [u8] {
    assert!(off <= s.len(), "offset {off} past a {}-byte slice", s.len());
    // SAFETY: V1 — the pointer and length come from a `&'a [u8]`, and
    // `off <= len` keeps the range inside it.
    unsafe { std::slice::from_raw_parts(s.as_ptr().add(off), s.len() - off) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_outlive_the_io_slice_value() {
        let data = [1u8, 2, 3];
        let bytes = {
            let s = IoSlice::new(&data[1..]);
            io_slice_bytes(&s)
        };
        assert_eq!(bytes, &[2, 3]);
        let s = IoSlice::new(&data);
        assert_eq!(io_slice_from(&s, 1), &[2, 3]);
        assert!(io_slice_from(&s, 3).is_empty());
    }
}
