//! `IoSlice` helpers std does not offer on stable yet.
//!
//! Invariant:
//! - V1 An `IoSlice<'a>` can only be built from a `&'a [u8]` (std's
//!   constructor), so its pointer and length describe memory that is valid
//!   and not mutated for `'a`.

use std::io::IoSlice;

/// The bytes of `s` with their original lifetime `'a` (what the unstable
/// `IoSlice::as_slice` returns), so sub-slices can be re-wrapped without
/// copying.
#[inline]
pub fn io_slice_bytes<'a>(s: &IoSlice<'a>) -> &'a [u8] {
    // SAFETY: V1 — the pointer and length come from a `&'a [u8]`.
    unsafe { std::slice::from_raw_parts(s.as_ptr(), s.len()) }
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
    }
}
