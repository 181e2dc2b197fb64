//! `O_DIRECT` streaming: the ring's bytes go to the disk without passing
//! through the page cache, in writes the block layer takes as they are.
//!
//! `O_DIRECT` wants every iovec's address and length, and the file offset,
//! to be multiples of the block size ([`DIRECT_ALIGN`]). The ring is
//! page-aligned and cut into 4 KiB chunks, so a range that starts a region
//! starts aligned; packets, though, end anywhere. A pass is laid out as:
//!
//! ```text
//!  iovecs of the pass:   [svc pkts][ring range A ............][marker][ring range B ...]
//!  written:              [bounce: svc pkts|pad][A aligned part][bounce: A's tail|marker|pad][B …]
//!                         copied, padded        straight from     copied, padded
//!                         to a block            the ring          to a block
//! ```
//!
//! * A slice that starts block-aligned and holds at least a block is written
//!   straight from its memory, up to its last whole block.
//! * Everything else (service packets, loss markers, a slice's last partial
//!   block, slices that start mid-block) is copied into a page-aligned
//!   bounce buffer, in file order, and each run of copies is closed with a
//!   padding packet ([`crate::storage::packets`]) that brings it to a whole
//!   number of blocks. A run always closes at the end of a slice, and every
//!   slice ends at a packet boundary, so a padding packet never lands inside
//!   a packet.
//!
//! * A pass whose copies would take more than
//!   [`crate::storage::write_pass::MAX_BOUNCE_BYTES`] is laid out a group of
//!   slices at a time ([`AlignedPass::bounded`]), each group written before
//!   the next is copied, every group but the last padded to a block: the
//!   bounce mapping stays bounded whatever the pass's size.
//!
//! * A pass shorter than [`MIN_DIRECT_PASS`] is not laid out at all: the
//!   sink turns `O_DIRECT` off and the pass goes through the page cache,
//!   unpadded. The next pass at least that long first writes one padding
//!   packet (through the page cache) that ends on a block boundary, then
//!   turns `O_DIRECT` back on ([`padding_to_block`]).
//!
//! * The session's last pass leaves its last run unpadded: the sink turns
//!   `O_DIRECT` off ([`crate::storage::FileSink::end_direct`]) and writes it
//!   through the page cache, so the file ends with the session's last packet
//!   (`trace_stats`), not with padding.
//!
//! The file is then a valid trace at every pass boundary: whole packets,
//! some of them padding packets that carry nothing (in a reserved
//! TracePacket field that Perfetto and the independent decoders skip). Each
//! pass costs at most one block of padding per run of copies. A sink that
//! fails mid-pass is cut at the last whole packet it wrote, padding
//! included, as on the page-cache path.
//!
//! [`enable`] probes the file: it sets `O_DIRECT` and writes one block of
//! padding (some filesystems accept the flag and refuse the write), then
//! truncates it away. Where either fails the page-cache path stays, and the
//! reason is logged.

use std::io::IoSlice;
use std::os::fd::OwnedFd;

use rustix::fs::OFlags;

use super::packets::{MIN_PADDING, write_padding};

/// Block size `O_DIRECT` writes are aligned to: the page size, a multiple
/// of every common logical block size.
pub const DIRECT_ALIGN: usize = 4096;

/// Passes shorter than this go through the page cache even where the file
/// takes `O_DIRECT`: laid out in blocks, a pass of a few KiB is mostly
/// padding (65% of the file at 100 ms passes of a slow stream, BENCHMARKS),
/// while at this size the padding is a few percent at most.
pub const MIN_DIRECT_PASS: u64 = 256 * 1024;

/// A padding packet that brings a file of `len` bytes to a multiple of
/// `align` (a block more when the gap is too short for a packet); empty
/// when it is already there. Written through the page cache before
/// `O_DIRECT` is turned back on.
pub(crate) fn padding_to_block(len: u64, align: usize) -> Vec<u8> {
    let align = align as u64;
    let mut gap = (align - len % align) % align;
    if gap == 0 {
        return Vec::new();
    }
    if gap < MIN_PADDING as u64 {
        gap += align;
    }
    let mut pad = vec![0u8; gap as usize];
    // `gap` is between MIN_PADDING and two blocks: a valid padding length.
    let written = write_padding(&mut pad);
    debug_assert!(written);
    pad
}

/// Why `O_DIRECT` was not used, or a pass could not be laid out for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DirectError {
    /// `O_DIRECT` could not be set on the descriptor.
    #[error("cannot set O_DIRECT: {0}")]
    Flag(rustix::io::Errno),
    /// The probe block written through `O_DIRECT` failed: the file system
    /// does not take direct writes there.
    #[error("an O_DIRECT write of {DIRECT_ALIGN} bytes failed: {0}")]
    Write(rustix::io::Errno),
    /// The probe block was written only in part (the bytes written).
    #[error("an O_DIRECT write of {DIRECT_ALIGN} bytes wrote {0}")]
    Short(usize),
    /// The probe block could not be cut off again.
    #[error("cannot truncate the probe block: {0}")]
    Truncate(rustix::io::Errno),
    /// No page-aligned bounce buffer could be mapped for the probe or for a
    /// pass's blocks.
    #[error("cannot map a bounce buffer: {0}")]
    Bounce(rustix::io::Errno),
    /// The file or its file system could not be inspected.
    #[error("cannot stat the file: {0}")]
    Stat(rustix::io::Errno),
    /// A passed descriptor is not a regular file.
    #[error("not a regular file")]
    NotRegular,
    /// A passed file already holds data, which the probe would cut off.
    #[error("the file is not empty")]
    NotEmpty,
    /// Its file system keeps files in memory (tmpfs, ramfs, hugetlbfs):
    /// `O_DIRECT` would bypass nothing and only cost padding.
    #[error("its file system keeps files in memory")]
    InMemory,
}

/// An anonymous, page-aligned mapping of `len` bytes.
fn map_aligned(len: usize) -> Result<memmap2::MmapMut, DirectError> {
    memmap2::MmapMut::map_anon(len).map_err(|e| {
        DirectError::Bounce(
            rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::NOMEM),
        )
    })
}

/// Turns `O_DIRECT` on for `fd`, an empty regular file, when a block
/// written through it lands; otherwise leaves the flags as they were.
/// Returns the alignment writes need.
pub fn enable(fd: &OwnedFd) -> Result<usize, DirectError> {
    // tmpfs and hugetlbfs take O_DIRECT too, but their pages are the file:
    // nothing is bypassed there, and the padding would only cost.
    let fs = rustix::fs::fstatfs(fd).map_err(DirectError::Stat)?;
    if in_memory(fs.f_type as i64) {
        return Err(DirectError::InMemory);
    }
    let flags = rustix::fs::fcntl_getfl(fd).map_err(DirectError::Flag)?;
    rustix::fs::fcntl_setfl(fd, flags | OFlags::DIRECT).map_err(DirectError::Flag)?;
    let probe = (|| {
        let mut block = map_aligned(DIRECT_ALIGN)?;
        write_padding(&mut block);
        match rustix::io::pwrite(fd, &block, 0) {
            Ok(n) if n == DIRECT_ALIGN => {}
            Ok(n) => return Err(DirectError::Short(n)),
            Err(e) => return Err(DirectError::Write(e)),
        }
        rustix::fs::ftruncate(fd, 0).map_err(DirectError::Truncate)
    })();
    if let Err(e) = probe {
        let _ = rustix::fs::fcntl_setfl(fd, flags);
        let _ = rustix::fs::ftruncate(fd, 0);
        return Err(e);
    }
    Ok(DIRECT_ALIGN)
}

/// [`enable`] for a file opened elsewhere (the descriptor a `recorder
/// serve` client passed): only an empty regular file (on a file system
/// that keeps it on a disk, as for every file).
pub(crate) fn enable_passed(fd: &OwnedFd) -> Result<usize, DirectError> {
    let st = rustix::fs::fstat(fd).map_err(DirectError::Stat)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(DirectError::NotRegular);
    }
    // `enable`'s probe truncates the file: never anything the client had.
    if st.st_size != 0 {
        return Err(DirectError::NotEmpty);
    }
    enable(fd)
}

/// File systems whose files live in the page cache only (statfs(2) magic
/// numbers): tmpfs (and memfd), ramfs, hugetlbfs.
fn in_memory(f_type: i64) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    [TMPFS_MAGIC, RAMFS_MAGIC, HUGETLBFS_MAGIC].contains(&(f_type & 0xffff_ffff))
}

/// One piece of an aligned pass.
#[derive(Debug)]
enum Seg<'a> {
    /// Whole blocks straight from the caller's memory (an `IoSlice`, not a
    /// reference: once written, the caller may let go of them, P1).
    Direct(IoSlice<'a>),
    /// A range of the bounce buffer (whole blocks).
    Bounce(std::ops::Range<usize>),
}

/// A piece and where it lies in the pass before (`input`, positions in the
/// caller's slices) and after (`out_start`, in the iovecs written) the
/// layout. A bounce range holds its input bytes in order, then padding.
#[derive(Debug)]
struct Placed<'a> {
    seg: Seg<'a>,
    in_start: u64,
    in_len: u64,
    out_start: u64,
    out_len: u64,
}

/// A pass's iovecs rearranged for `O_DIRECT` (see the module docs).
pub struct AlignedPass<'a> {
    segs: Vec<Placed<'a>>,
    bounce: Option<memmap2::MmapMut>,
    /// Bytes of padding added.
    padding: u64,
    align: usize,
}

/// Bytes of padding that close a run of `len` copied bytes.
fn padding_for(len: usize, align: usize) -> usize {
    let pad = len.next_multiple_of(align) - len;
    if pad == 0 || pad >= MIN_PADDING {
        pad
    } else {
        pad + align
    }
}

impl<'a> AlignedPass<'a> {
    /// Lays out `slices` (each ending at a packet boundary) in blocks of
    /// `align` bytes, copying what cannot be written in place. `pad_last`:
    /// pad the last run too (false for a session's last pass, whose last
    /// run [`Self::unaligned_tail`] is written without `O_DIRECT`).
    pub fn new(slices: &[IoSlice<'a>], align: usize, pad_last: bool) -> Result<Self, DirectError> {
        Self::bounded(slices, align, pad_last, usize::MAX).map(|(pass, _)| pass)
    }

    /// [`Self::new`] for the first of `slices` whose copies (with their
    /// padding) take at most `max_bounce` bytes, and at least one slice;
    /// returns how many slices it took. A layout that leaves slices out
    /// pads its last run whatever `pad_last` says: more follows it.
    pub fn bounded(
        slices: &[IoSlice<'a>],
        align: usize,
        pad_last: bool,
        max_bounce: usize,
    ) -> Result<(Self, usize), DirectError> {
        // Plan: runs of copied slices (with the tail of a direct slice
        // first), between direct parts, each with its input position.
        let mut runs: Vec<(u64, Vec<&'a [u8]>)> = Vec::new();
        // (Some(direct part) | None: the next run, input start)
        let mut order: Vec<(Option<&'a [u8]>, u64)> = Vec::new();
        let mut run: Vec<&'a [u8]> = Vec::new();
        let (mut at, mut run_at) = (0u64, 0u64);
        // Bounce bytes of the closed runs, and of the open one so far.
        let (mut closed, mut open) = (0usize, 0usize);
        let padded = |len: usize| {
            if len == 0 {
                0
            } else {
                len + padding_for(len, align)
            }
        };
        let (mut taken, mut any) = (slices.len(), false);
        for (i, s) in slices.iter().enumerate() {
            let s: &'a [u8] = crate::sys::iov::io_slice_bytes(s);
            if s.is_empty() {
                continue;
            }
            let whole = s.len() / align * align;
            let direct = (s.as_ptr() as usize).is_multiple_of(align) && whole > 0;
            let (next_closed, next_open) = if direct {
                (closed + padded(open), s.len() - whole)
            } else {
                (closed, open + s.len())
            };
            if any && next_closed + padded(next_open) > max_bounce {
                taken = i;
                break;
            }
            (closed, open, any) = (next_closed, next_open, true);
            if direct {
                if !run.is_empty() {
                    runs.push((run_at, std::mem::take(&mut run)));
                    order.push((None, run_at));
                }
                order.push((Some(&s[..whole]), at));
                if whole < s.len() {
                    run_at = at + whole as u64;
                    run.push(&s[whole..]);
                }
            } else {
                if run.is_empty() {
                    run_at = at;
                }
                run.push(s);
            }
            at += s.len() as u64;
        }
        if !run.is_empty() {
            runs.push((run_at, run));
            order.push((None, run_at));
        }
        let pad_last = pad_last || taken < slices.len();
        let last_run_ends = matches!(order.last(), Some((None, _)));
        let n_runs = runs.len();
        let sizes: Vec<(usize, usize)> = runs
            .iter()
            .enumerate()
            .map(|(i, (_, r))| {
                let len: usize = r.iter().map(|s| s.len()).sum();
                let unpadded = !pad_last && last_run_ends && i + 1 == n_runs;
                (len, if unpadded { 0 } else { padding_for(len, align) })
            })
            .collect();
        let total: usize = sizes.iter().map(|(l, p)| l + p).sum();
        let mut bounce = if total > 0 {
            Some(map_aligned(total)?)
        } else {
            None
        };
        let mut ranges = Vec::with_capacity(runs.len());
        let mut padding = 0u64;
        if let Some(b) = bounce.as_mut() {
            let mut at = 0;
            for ((_, r), &(len, pad)) in runs.iter().zip(&sizes) {
                let start = at;
                for s in r {
                    b[at..at + s.len()].copy_from_slice(s);
                    at += s.len();
                }
                debug_assert_eq!(at - start, len);
                if pad > 0 {
                    write_padding(&mut b[at..at + pad]);
                    at += pad;
                    padding += pad as u64;
                }
                ranges.push((start..at, len as u64));
            }
        }
        let mut ranges = ranges.into_iter();
        let mut out = 0u64;
        let segs = order
            .into_iter()
            .filter_map(|(o, in_start)| {
                let (seg, in_len, out_len) = match o {
                    Some(d) => (Seg::Direct(IoSlice::new(d)), d.len() as u64, d.len() as u64),
                    None => {
                        let (r, len) = ranges.next()?;
                        let out_len = r.len() as u64;
                        (Seg::Bounce(r), len, out_len)
                    }
                };
                let placed = Placed {
                    seg,
                    in_start,
                    in_len,
                    out_start: out,
                    out_len,
                };
                out += out_len;
                Some(placed)
            })
            .collect();
        Ok((
            AlignedPass {
                segs,
                bounce,
                padding,
                align,
            },
            taken,
        ))
    }

    fn slice(&self, s: &Seg<'a>) -> Option<IoSlice<'_>> {
        match s {
            Seg::Direct(d) => Some(*d),
            Seg::Bounce(r) => self.bounce.as_ref().map(|b| IoSlice::new(&b[r.clone()])),
        }
    }

    /// The iovecs to write with `O_DIRECT`: every address and length a
    /// multiple of the alignment (all of the pass but an
    /// [`unaligned_tail`](Self::unaligned_tail)).
    pub fn slices(&self) -> Vec<IoSlice<'_>> {
        let n = self.segs.len() - usize::from(self.unaligned_tail().is_some());
        self.segs[..n]
            .iter()
            .filter_map(|s| self.slice(&s.seg))
            .collect()
    }

    /// The last run, left unpadded (see [`Self::new`]) and not a whole number
    /// of blocks: to be written without `O_DIRECT`.
    pub(crate) fn unaligned_tail(&self) -> Option<IoSlice<'_>> {
        match self.segs.last().map(|s| &s.seg) {
            Some(s @ Seg::Bounce(r)) if !r.len().is_multiple_of(self.align) => self.slice(s),
            _ => None,
        }
    }

    /// Bytes of padding packets added.
    pub(crate) fn padding_bytes(&self) -> u64 {
        self.padding
    }

    /// Bytes written straight from the caller's memory.
    #[cfg(test)]
    pub(crate) fn direct_bytes(&self) -> u64 {
        self.segs
            .iter()
            .map(|s| match &s.seg {
                Seg::Direct(d) => d.len() as u64,
                Seg::Bounce(_) => 0,
            })
            .sum()
    }

    /// How much of the caller's slices is in the file once the first
    /// `out_done` bytes of the layout are: the bytes before the corresponding
    /// position, copied or not (copies count only once written, so that
    /// [`Self::output_of`] of anything at or below it is at or below
    /// `out_done`).
    pub(crate) fn input_done(&self, out_done: u64) -> u64 {
        let k = self
            .segs
            .partition_point(|s| s.out_start + s.out_len <= out_done);
        match self.segs.get(k) {
            Some(s) => s.in_start + (out_done.saturating_sub(s.out_start)).min(s.in_len),
            None => self.segs.last().map_or(0, |s| s.in_start + s.in_len),
        }
    }

    /// Where position `in_pos` of the caller's slices lies in the layout (a
    /// packet boundary there maps to one here: the bytes are the same, the
    /// padding follows a run's last packet).
    pub(crate) fn output_of(&self, in_pos: u64) -> u64 {
        let k = self
            .segs
            .partition_point(|s| s.in_start + s.in_len < in_pos);
        match self.segs.get(k) {
            Some(s) => s.out_start + in_pos.saturating_sub(s.in_start).min(s.in_len),
            None => self.segs.last().map_or(0, |s| s.out_start + s.out_len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(len: usize, fill: u8) -> Vec<u8> {
        let mut f = vec![0x0A];
        let mut v = len;
        while v >= 0x80 {
            f.push(v as u8 | 0x80);
            v >>= 7;
        }
        f.push(v as u8);
        f.extend(std::iter::repeat_n(fill, len));
        f
    }

    #[test]
    fn a_pass_becomes_whole_blocks_of_the_same_packets_plus_padding() {
        // A page-aligned "ring" holding packets, and heap packets around it.
        let mut ring = memmap2::MmapMut::map_anon(4 * DIRECT_ALIGN).expect("map");
        let mut at = 0;
        let mut ring_packets = Vec::new();
        for i in 0..40 {
            let p = framed(200 + i * 7, i as u8);
            ring[at..at + p.len()].copy_from_slice(&p);
            at += p.len();
            ring_packets.push(p);
        }
        let head = framed(50, 0xAA);
        let marker = framed(4, 0xBB);
        let tail = framed(3000, 0xCC);
        let mid = 3 * DIRECT_ALIGN / 2;
        // Split the ring range at a packet boundary past the first blocks,
        // so that the second piece starts unaligned.
        let split = ring_packets
            .iter()
            .scan(0, |a, p| {
                *a += p.len();
                Some(*a)
            })
            .find(|&a| a > mid)
            .expect("a boundary");
        let slices = [
            IoSlice::new(&head),
            IoSlice::new(&ring[..split]),
            IoSlice::new(&marker),
            IoSlice::new(&ring[split..at]),
            IoSlice::new(&tail),
        ];
        let pass = AlignedPass::new(&slices, DIRECT_ALIGN, true).expect("aligned");
        let out = pass.slices();
        for s in &out {
            assert!((s.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN));
            assert!(s.len().is_multiple_of(DIRECT_ALIGN));
        }
        assert!(
            pass.direct_bytes() >= DIRECT_ALIGN as u64,
            "the ring's first block went straight"
        );
        let file: Vec<u8> = out.iter().flat_map(|s| s.iter().copied()).collect();
        let want: Vec<u8> = slices.iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(file.len() as u64, want.len() as u64 + pass.padding_bytes());
        // The records are the pass's, in order, with padding packets between.
        let records = records_besides_padding(&file);
        assert_eq!(records.len(), 43);
        assert_eq!(records, records_besides_padding(&want));
    }

    /// The packets of `file`, padding packets left out.
    fn records_besides_padding(file: &[u8]) -> Vec<&[u8]> {
        let is_padding = |p: &[u8]| p.is_empty() || p.starts_with(&[0xBA, 0x03]);
        crate::wire::framing::frames(file)
            .map(|f| f.packet)
            .filter(|p| !is_padding(p))
            .collect()
    }

    #[test]
    fn a_bounded_layout_takes_the_slices_whose_copies_fit_and_pads_before_the_rest() {
        // Eight page-aligned regions, each three and a half blocks of
        // packets: each copies its partial last block, padded.
        let mut ring = memmap2::MmapMut::map_anon(8 * 4 * DIRECT_ALIGN).expect("map");
        let mut ends = Vec::new();
        for r in 0..8 {
            let start = r * 4 * DIRECT_ALIGN;
            let mut at = start;
            let mut i = 0;
            while at - start < 7 * DIRECT_ALIGN / 2 {
                let p = framed(300 + (r * 31 + i * 7) % 200, (r * 16 + i) as u8);
                ring[at..at + p.len()].copy_from_slice(&p);
                at += p.len();
                i += 1;
            }
            ends.push((start, at));
        }
        let head = framed(50, 0xAA);
        let mut slices = vec![IoSlice::new(&head)];
        slices.extend(ends.iter().map(|&(s, e)| IoSlice::new(&ring[s..e])));
        let want: Vec<u8> = slices.iter().flat_map(|s| s.iter().copied()).collect();
        let max = 3 * DIRECT_ALIGN;
        let (mut from, mut groups, mut file) = (0, 0, Vec::new());
        while from < slices.len() {
            let (pass, took) =
                AlignedPass::bounded(&slices[from..], DIRECT_ALIGN, false, max).expect("laid out");
            assert!(took >= 1);
            let tail = pass
                .unaligned_tail()
                .map(|t| t.to_vec())
                .unwrap_or_default();
            assert!(
                tail.is_empty() || from + took == slices.len(),
                "only the last group leaves its last run unpadded"
            );
            let out: Vec<u8> = pass
                .slices()
                .iter()
                .flat_map(|s| s.iter().copied())
                .collect();
            assert!(out.len().is_multiple_of(DIRECT_ALIGN));
            let copied = out.len() + tail.len() - pass.direct_bytes() as usize;
            assert!(copied <= max || took == 1, "{copied} bytes copied");
            file.extend(out);
            file.extend(tail);
            from += took;
            groups += 1;
        }
        assert!(groups >= 3, "{groups} groups");
        assert_eq!(
            records_besides_padding(&file),
            records_besides_padding(&want)
        );
        // Unbounded, the same slices are one layout.
        let (_, took) =
            AlignedPass::bounded(&slices, DIRECT_ALIGN, false, usize::MAX).expect("laid out");
        assert_eq!(took, slices.len());
    }

    #[test]
    fn nothing_to_write_is_no_iovec() {
        let pass = AlignedPass::new(&[], DIRECT_ALIGN, false).expect("empty");
        assert!(pass.slices().is_empty());
    }

    #[test]
    fn a_last_pass_ends_with_its_own_last_packet() {
        let a = vec![0x0A, 3, 1, 2, 3];
        let pass = AlignedPass::new(&[IoSlice::new(&a)], DIRECT_ALIGN, false).expect("laid out");
        assert!(pass.slices().is_empty());
        assert_eq!(pass.unaligned_tail().as_deref(), Some(&a[..]));
        assert_eq!(pass.padding_bytes(), 0);
    }

    #[test]
    fn a_one_byte_gap_takes_a_block_more() {
        assert_eq!(
            padding_for(DIRECT_ALIGN - 1, DIRECT_ALIGN),
            1 + DIRECT_ALIGN
        );
        assert_eq!(padding_for(DIRECT_ALIGN, DIRECT_ALIGN), 0);
        assert_eq!(padding_for(10, DIRECT_ALIGN), DIRECT_ALIGN - 10);
    }
}
