//! Test support shared by the cut and compression tests: framed records and
//! a pass's bytes split into iovecs at arbitrary points.

use std::io::IoSlice;

/// Appends `payload` as one Trace record.
pub(super) fn frame(payload: &[u8], out: &mut Vec<u8>) {
    crate::wire::framing::push_record(out, payload);
}

/// The bytes of `bufs`, joined.
pub(super) fn flatten(bufs: &[IoSlice<'_>]) -> Vec<u8> {
    bufs.iter().flat_map(|b| b.iter().copied()).collect()
}

/// One record per size (filled with `fill(i)`), and where each record ends.
pub(super) fn records(sizes: &[usize], fill: impl Fn(usize) -> u8) -> (Vec<u8>, Vec<u64>) {
    let mut data = Vec::new();
    let mut ends = Vec::new();
    for (i, s) in sizes.iter().enumerate() {
        frame(&vec![fill(i); *s], &mut data);
        ends.push(data.len() as u64);
    }
    (data, ends)
}

/// `data` as iovecs cut at `splits` (taken modulo its length, in order).
pub(super) fn split<'a>(data: &'a [u8], splits: &[usize]) -> Vec<IoSlice<'a>> {
    let mut cuts: Vec<usize> = splits.iter().map(|s| s % (data.len() + 1)).collect();
    cuts.sort_unstable();
    let mut bufs = Vec::new();
    let mut at = 0;
    for c in cuts.into_iter().chain(std::iter::once(data.len())) {
        bufs.push(IoSlice::new(&data[at..c]));
        at = c;
    }
    bufs
}
