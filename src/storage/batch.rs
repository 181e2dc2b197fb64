//! Cutting a caller's iovec list into submission batches without copying data.
//!
//! A [`Cursor`] walks `&[IoSlice]` by byte position; each batch is a list of
//! sub-slices of the caller's memory, bounded in iovec count (`IOV_MAX`) and in
//! bytes (so one submission does not pin the whole pass). Short writes advance
//! the cursor by what the kernel took.

use std::io::IoSlice;

use crate::sys::iov::io_slice_from;

/// Linux's `IOV_MAX`: the most iovecs one `pwritev`/`writev`/WRITEV takes.
pub const IOV_MAX: usize = 1024;

/// A byte position in a list of slices.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cursor<'s, 'a> {
    bufs: &'s [IoSlice<'a>],
    /// Index of the slice holding the next byte.
    idx: usize,
    /// Offset of the next byte within `bufs[idx]`.
    off: usize,
}

impl<'s, 'a> Cursor<'s, 'a> {
    pub(super) fn new(bufs: &'s [IoSlice<'a>]) -> Self {
        let mut c = Cursor {
            bufs,
            idx: 0,
            off: 0,
        };
        c.skip_empty();
        c
    }

    /// True when every byte has been consumed.
    pub(super) fn is_done(&self) -> bool {
        self.idx >= self.bufs.len()
    }

    fn skip_empty(&mut self) {
        while self.idx < self.bufs.len() && self.off >= self.bufs[self.idx].len() {
            self.idx += 1;
            self.off = 0;
        }
    }

    /// Fills `out` (cleared first) with the next batch of at most `max_iov`
    /// slices and `max_bytes` bytes, without advancing. Returns its length.
    pub(super) fn peek_batch<'o>(
        &self,
        max_iov: usize,
        max_bytes: usize,
        out: &mut Vec<IoSlice<'o>>,
    ) -> usize
    where
        'a: 'o,
    {
        out.clear();
        let mut total = 0usize;
        let (mut idx, mut off) = (self.idx, self.off);
        while idx < self.bufs.len() && out.len() < max_iov && total < max_bytes {
            // Only from the cursor on: what is behind it may be let go of
            // (storage P1).
            let rest: &'a [u8] = io_slice_from(&self.bufs[idx], off);
            let take = rest.len().min(max_bytes - total);
            if take > 0 {
                out.push(IoSlice::new(&rest[..take]));
                total += take;
            }
            idx += 1;
            off = 0;
        }
        total
    }

    /// Consumes `n` bytes.
    pub(super) fn advance(&mut self, mut n: usize) {
        while n > 0 && self.idx < self.bufs.len() {
            let left = self.bufs[self.idx].len() - self.off;
            if n < left {
                self.off += n;
                n = 0;
            } else {
                n -= left;
                self.idx += 1;
                self.off = 0;
            }
        }
        self.skip_empty();
    }
}

/// Total bytes of `bufs`.
pub(super) fn total_len(bufs: &[IoSlice<'_>]) -> u64 {
    bufs.iter().map(|b| b.len() as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flatten(bufs: &[IoSlice<'_>]) -> Vec<u8> {
        bufs.iter().flat_map(|b| b.iter().copied()).collect()
    }

    #[test]
    fn batches_cover_everything_in_order_within_bounds() {
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let parts: Vec<&[u8]> = vec![
            &data[..0],
            &data[..3000],
            &data[3000..3001],
            &data[3001..3001],
            &data[3001..],
        ];
        let bufs: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
        let mut c = Cursor::new(&bufs);
        let mut got = Vec::new();
        let mut batch = Vec::new();
        while !c.is_done() {
            let n = c.peek_batch(2, 1000, &mut batch);
            c.advance(n);
            assert!(batch.len() <= 2 && n <= 1000 && n > 0);
            assert!(batch.iter().all(|b| !b.is_empty()));
            got.extend(flatten(&batch));
        }
        assert_eq!(got, data);
    }

    #[test]
    fn short_write_advance_resumes_mid_slice() {
        let a = [1u8; 10];
        let b = [2u8; 10];
        let bufs = [IoSlice::new(&a), IoSlice::new(&b)];
        let mut c = Cursor::new(&bufs);
        let mut batch = Vec::new();
        assert_eq!(c.peek_batch(8, 100, &mut batch), 20);
        c.advance(13);
        c.peek_batch(8, 100, &mut batch);
        assert_eq!(flatten(&batch), vec![2u8; 7]);
    }
}
