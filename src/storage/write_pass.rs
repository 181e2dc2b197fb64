//! One write pass: the recorder's own packets, then every buffer's committed
//! data (buffer 0 first), then the pass trailer, handed to the sink as one
//! list of iovecs that point straight into the ring buffers' mmaps.
//!
//! `max_file_size_bytes` is enforced here: the list is cut before the first
//! packet that would reach the cap, the kept part is written and synced,
//! and the pass reports that the cap was reached and how much it left out.
//!
//! With a compression stage ([`write_pass_staged`]) the list is compressed
//! first and the cap applies to the compressed packets, the file's bytes.
//!
//! A failed pass says what did not reach the file ([`PassError`]): the sink
//! keeps the whole packets that fit (a full disk), the rest is counted.
//!
//! The pass lets go of each ring region as soon as its bytes are in the
//! file (`Unpin`): the sink reports how much of the list it has written
//! ([`WriteProgress`]), the pass maps that to each batch's data and unpins
//! the regions it covers (ringbuf M4), so writers take those chunks while
//! the rest of the pass is still in flight. Compressed, the batches are
//! let go of once compressed (the zstd frames are copies); under `O_DIRECT`
//! the progress is mapped through the block layout ([`AlignedPass`]).
//!
//! The one `unsafe` call (`FlushBatch::release_written`, ringbuf M4, in
//! `Unpin::through`) rests on:
//! - **P1** (storage) nothing reads the list below the floor a report
//!   returned, and only bytes whose requests completed are reported. This
//!   is not a promise of each sink: a sink sees the list only through a
//!   [`WriteList`](crate::storage::WriteList), whose views are borrows that
//!   start at or above the floor and end before the next report, so a safe
//!   sink cannot break it; the io_uring sink, which keeps raw iovecs in
//!   flight, reports only below them (its U1);
//! - **P2** this pass reads no byte of the list after handing it to the
//!   sink: cutting at the cap, counting packets and compressing happen
//!   before any write; an `O_DIRECT` pass is laid out in groups
//!   ([`MAX_BOUNCE_BYTES`]), each copied before it is handed over, and the
//!   groups still to be laid out lie above everything handed over so far,
//!   where no region has been let go of (a region goes only once its last
//!   byte is reported written). The progress handlers below hold only
//!   positions. P2 is local to [`write_pass_staged`] and the functions it
//!   calls in this file.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::packets;
use crate::ringbuf::{Buffer, FlushBatch, FlushItem};
use crate::storage::compress::{CompressError, ZstdStage, count_records};
use crate::storage::direct::{AlignedPass, DirectError, MIN_DIRECT_PASS, padding_to_block};
use crate::storage::{FileSink, SinkError, WriteProgress, cut_at_packet_boundary};

/// Most bytes an `O_DIRECT` pass copies at once (each region's partial last
/// block, service packets, padding: about one block per 64 KiB region, a
/// sixteenth of the pass). A pass that needs more is laid out and written
/// in groups of slices, one after the other, each with a bounce mapping of
/// its own, so a large ring's final pass (a 1 GiB flight recorder's would
/// map 64 MiB) stays bounded. Each group boundary drains the sink's queue
/// (4 MiB groups measured 0.87× the rate of full-speed streaming, see
/// BENCHMARKS.md), so ordinary passes (a 100 ms pass at 2 GB/s copies
/// about 14 MiB) stay one group.
pub(crate) const MAX_BOUNCE_BYTES: usize = 16 << 20;

/// What a pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Bytes written to the file by this pass.
    pub bytes: u64,
    /// Bytes of buffer data (not service packets) in this pass.
    pub buffer_bytes: u64,
    /// Bytes of the records written, before compression (equal to `bytes`
    /// without a compression stage).
    pub input_bytes: u64,
    /// Compressed packets written.
    pub compressed_packets: u64,
    /// TracePackets written (inside the compressed ones too), when the
    /// stage asked for the count (segments do, for their sidecars).
    pub packets: u64,
    /// The cap was reached: the session must stop.
    pub(crate) cap_reached: bool,
    /// Bytes the cap left out of this pass (records not written).
    pub(crate) cut_bytes: u64,
    /// Wall time of the pass, from taking the buffers' data to handing the
    /// last byte over (the sync included when asked).
    pub duration: Duration,
}

/// Where the pass takes buffer data from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// Consume what is committed (streaming and the final pass).
    Consume,
    /// Leave it in place (snapshots).
    Snapshot,
}

/// What happens between the ring and the sink.
#[derive(Default)]
pub struct PassStage<'a> {
    /// Compress the pass (ARCHITECTURE.md §7.9).
    pub compress: Option<&'a mut ZstdStage>,
    /// Count the packets written (a walk over the record headers).
    pub count_packets: bool,
    /// The session's last pass: on an `O_DIRECT` file its last partial
    /// block goes through the page cache unpadded, so the file ends with
    /// the pass's last packet (storage::direct).
    pub last: bool,
    /// Most bytes an `O_DIRECT` layout copies at once; `None`:
    /// [`MAX_BOUNCE_BYTES`] (a seam for tests of the grouping).
    pub max_bounce: Option<usize>,
    /// Called while the pass waits on the file ([`WriteProgress::idle`]).
    pub idle: Option<&'a mut dyn FnMut()>,
}

impl std::fmt::Debug for PassStage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassStage")
            .field("compress", &self.compress.is_some())
            .field("count_packets", &self.count_packets)
            .field("last", &self.last)
            .field("max_bounce", &self.max_bounce)
            .field("idle", &self.idle.is_some())
            .finish()
    }
}

/// What made a pass fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PassFailure {
    /// The sink failed, and is poisoned: no retries.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// The compression stage failed.
    #[error(transparent)]
    Compress(#[from] CompressError),
    /// The pass could not be laid out in `O_DIRECT` blocks (no bounce
    /// buffer could be mapped).
    #[error(transparent)]
    Direct(#[from] DirectError),
}

/// A pass that failed, with what of it reached the file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{source}; {unwritten_bytes} bytes of this write pass did not reach the file ({kept_bytes} bytes of whole packets before them did)"
)]
pub struct PassError {
    /// What failed.
    #[source]
    pub source: PassFailure,
    /// Bytes of this pass kept in the file (whole packets).
    pub kept_bytes: u64,
    /// Bytes of this pass that are not in the file.
    pub(crate) unwritten_bytes: u64,
}

/// Runs one pass over `buffers` (each with how to take its data) into
/// `sink`, with no stage between them. `tail` is told whether anything
/// (the head, buffer data, a loss marker) comes before it in this pass.
/// A pass with nothing to write makes no write call (only the sync, if
/// asked for): an idle stream costs a look at its buffers, not a write.
pub fn write_pass(
    sink: &mut dyn FileSink,
    head: &[Vec<u8>],
    buffers: &[(Arc<Buffer>, Take)],
    tail: impl FnOnce(bool) -> Vec<Vec<u8>>,
    max_file_size: Option<u64>,
    sync: bool,
) -> Result<PassReport, PassError> {
    let stage = PassStage::default();
    write_pass_staged(sink, head, buffers, tail, max_file_size, sync, stage)
}

/// [`write_pass`] with an optional compression stage between the ring and
/// the sink.
pub fn write_pass_staged(
    sink: &mut dyn FileSink,
    head: &[Vec<u8>],
    buffers: &[(Arc<Buffer>, Take)],
    tail: impl FnOnce(bool) -> Vec<Vec<u8>>,
    max_file_size: Option<u64>,
    sync: bool,
    mut stage: PassStage<'_>,
) -> Result<PassReport, PassError> {
    let started = Instant::now();
    let before = sink.bytes_written();
    let batches: Vec<FlushBatch> = buffers
        .iter()
        .map(|(b, take)| match take {
            Take::Consume => b.take_flush(),
            Take::Snapshot => b.snapshot(),
        })
        .collect();
    // Loss markers are owned here so the iovecs can borrow them.
    let markers: Vec<Vec<u8>> = batches
        .iter()
        .flat_map(|b| b.items())
        .filter_map(|it| match it {
            FlushItem::Loss { writer } => Some(packets::loss_marker(writer.0)),
            FlushItem::Data(_) => None,
        })
        .collect();
    let carried = !head.is_empty() || batches.iter().any(|b| !b.is_empty());
    let tail = tail(carried);
    let list = PassList::gather(head, &batches, &markers, &tail);
    let (total, buffer_bytes) = (total_len(&list.iov), list.buffer_bytes);
    if total == 0 {
        if sync {
            sink.sync_data().map_err(|e| PassError {
                source: e.into(),
                kept_bytes: 0,
                unwritten_bytes: 0,
            })?;
        }
        return Ok(PassReport {
            duration: started.elapsed(),
            ..PassReport::default()
        });
    }
    let mut unpin = Unpin {
        batches: &batches,
        spans: list.spans,
        next: 0,
        floor: 0,
        idle: stage.idle.take(),
    };
    let mut w = Written::default();
    let to = Target {
        sink,
        before,
        max_file_size,
        sync,
    };
    let result = write_records(to, &list.iov, &mut unpin, stage, &mut w);
    drop(list.iov);
    for b in batches {
        b.release();
    }
    let bytes = result.map_err(|source| PassError {
        source,
        kept_bytes: w.kept_input,
        unwritten_bytes: total.saturating_sub(w.kept_input),
    })?;
    Ok(PassReport {
        bytes,
        buffer_bytes,
        input_bytes: w.input_bytes,
        compressed_packets: w.compressed_packets,
        packets: w.packets,
        cap_reached: w.cap_reached,
        cut_bytes: w.cut_bytes,
        duration: started.elapsed(),
    })
}

/// A pass's list: the head, each batch's data (with loss markers where
/// the batch lost packets), the tail.
struct PassList<'a> {
    iov: Vec<IoSlice<'a>>,
    /// Where each batch's data lies in the list.
    spans: Vec<Span>,
    /// Bytes of buffer data in the list.
    buffer_bytes: u64,
}

impl<'a> PassList<'a> {
    fn gather(
        head: &'a [Vec<u8>],
        batches: &'a [FlushBatch],
        markers: &'a [Vec<u8>],
        tail: &'a [Vec<u8>],
    ) -> Self {
        let mut iov: Vec<IoSlice<'a>> = head.iter().map(|p| IoSlice::new(p)).collect();
        let mut at = total_len(&iov);
        let mut buffer_bytes = 0u64;
        let mut next_marker = markers.iter();
        let mut spans = Vec::new();
        for (batch, b) in batches.iter().enumerate() {
            let mut data_at = 0u64;
            for it in b.items() {
                match it {
                    FlushItem::Data(d) => {
                        let len = d.len() as u64;
                        spans.push(Span {
                            at,
                            len,
                            batch,
                            data_at,
                        });
                        at += len;
                        data_at += len;
                        buffer_bytes += len;
                        iov.push(IoSlice::new(d));
                    }
                    FlushItem::Loss { .. } => {
                        if let Some(m) = next_marker.next() {
                            at += m.len() as u64;
                            iov.push(IoSlice::new(m));
                        }
                    }
                }
            }
        }
        iov.extend(tail.iter().map(|p| IoSlice::new(p)));
        Self {
            iov,
            spans,
            buffer_bytes,
        }
    }
}

/// Where a pass goes and on what terms.
struct Target<'s> {
    sink: &'s mut dyn FileSink,
    /// The sink's bytes before the pass.
    before: u64,
    max_file_size: Option<u64>,
    sync: bool,
}

/// What a pass learnt as it went, kept when it fails part way.
#[derive(Default)]
struct Written {
    cap_reached: bool,
    cut_bytes: u64,
    input_bytes: u64,
    compressed_packets: u64,
    packets: u64,
    /// The pass's own (uncompressed) bytes in the file.
    kept_input: u64,
}

/// Compresses, cuts at the cap, lays out and writes the list; returns the
/// bytes written. Nothing reads the list once it is handed to the sink (P2).
fn write_records(
    to: Target<'_>,
    iov: &[IoSlice<'_>],
    unpin: &mut Unpin<'_, '_>,
    stage: PassStage<'_>,
    w: &mut Written,
) -> Result<u64, PassFailure> {
    let Target {
        sink,
        before,
        max_file_size,
        sync,
    } = to;
    let compressed = match stage.compress {
        Some(z) => {
            let c = z.compress(iov)?;
            // The frames are copies: the ring's bytes are not read again.
            unpin.through(total_len(iov));
            Some(c)
        }
        None => None,
    };
    let records = match &compressed {
        Some(c) => c.slices(),
        None => iov.to_vec(),
    };
    let kept = match max_file_size {
        Some(cap) => {
            let room = cap.saturating_sub(sink.bytes_written());
            let (kept, cut) = cut_at_packet_boundary(&records, room);
            w.cap_reached = cut.cut;
            w.cut_bytes = total_len(&records).saturating_sub(cut.kept_bytes);
            kept
        }
        None => records,
    };
    // Bytes of the padding that took the file back to a block boundary.
    let resume_padding = settle_direct(sink, total_len(&kept), stage.last, max_file_size)?;
    // An O_DIRECT file takes whole blocks: the pass is laid out in them,
    // with padding packets (storage::direct), the last run unpadded in the
    // session's last pass.
    let direct = sink.direct_alignment().map(|align| Layout {
        align,
        pad_last: !stage.last,
        max_bounce: stage.max_bounce.unwrap_or(MAX_BOUNCE_BYTES),
    });
    // Counted before the write (P2).
    if stage.count_packets && compressed.is_none() {
        w.packets = count_records(&kept);
    }
    // Compressed frames are copies, kept until the pass ends, and the
    // ring's regions were let go of above: nothing to unpin while they
    // are written, so the floor stays 0 and a failed write is cut back
    // at the last whole frame (the ring's floor means nothing in them).
    let mut frames = Unpin {
        batches: unpin.batches,
        spans: Vec::new(),
        next: 0,
        floor: 0,
        idle: if compressed.is_some() {
            unpin.idle.take()
        } else {
            None
        },
    };
    let progress = if compressed.is_some() {
        &mut frames
    } else {
        unpin
    };
    let (bytes, padding) = if kept.is_empty() {
        (0, 0)
    } else {
        match write_kept(sink, &kept, direct, progress) {
            Ok(written) => written,
            Err(e) => {
                // The sink kept whole records: count them in the pass's
                // own (uncompressed) bytes.
                let in_file = sink.bytes_written().saturating_sub(before + resume_padding);
                w.kept_input = match &compressed {
                    Some(c) => c.input_of_prefix(in_file).0,
                    None => in_file,
                };
                return Err(e);
            }
        }
    };
    (w.input_bytes, w.compressed_packets) = match &compressed {
        Some(c) => c.input_of_prefix(bytes - padding),
        None => (bytes - padding, 0),
    };
    w.kept_input = w.input_bytes;
    if stage.count_packets
        && let Some(c) = &compressed
    {
        w.packets = c.packets_of_prefix(bytes);
    }
    if sync || w.cap_reached {
        sink.sync_data()?;
    }
    Ok(resume_padding + bytes)
}

/// Before a pass of `kept_len` bytes: a pass too small to fill blocks goes
/// through the page cache; a large one after such passes pads the file to
/// a block boundary and turns O_DIRECT back on (storage::direct,
/// MIN_DIRECT_PASS). Returns the padding written.
fn settle_direct(
    sink: &mut dyn FileSink,
    kept_len: u64,
    last: bool,
    max_file_size: Option<u64>,
) -> Result<u64, PassFailure> {
    if kept_len > 0 && kept_len < MIN_DIRECT_PASS && sink.direct_alignment().is_some() {
        sink.end_direct()?;
    } else if kept_len >= MIN_DIRECT_PASS
        && !last
        && sink.direct_alignment().is_none()
        && let Some(align) = sink.direct_capability()
    {
        let pad = padding_to_block(sink.bytes_written(), align);
        let at = sink.bytes_written() + pad.len() as u64;
        if max_file_size.is_none_or(|cap| at + kept_len <= cap) {
            let mut written = 0;
            if !pad.is_empty() {
                written = sink.write_all(&[IoSlice::new(&pad)])?;
            }
            sink.resume_direct()?;
            return Ok(written);
        }
    }
    Ok(0)
}

/// How an `O_DIRECT` pass is laid out.
#[derive(Clone, Copy, Debug)]
struct Layout {
    align: usize,
    /// Pad the pass's last run (not in the session's last pass).
    pad_last: bool,
    max_bounce: usize,
}

/// Writes `kept`, laid out in blocks under `direct` (a group of slices at a
/// time, each copying at most `max_bounce` bytes, unless one slice needs
/// more), telling `progress` how far it got; an unaligned tail goes last,
/// through the page cache. Returns the bytes written and how many of them
/// are padding.
fn write_kept(
    sink: &mut dyn FileSink,
    kept: &[IoSlice<'_>],
    direct: Option<Layout>,
    progress: &mut Unpin<'_, '_>,
) -> Result<(u64, u64), PassFailure> {
    let Some(l) = direct else {
        return Ok((sink.write_all_reporting(kept, progress)?, 0));
    };
    let (mut bytes, mut padding) = (0, 0);
    let (mut from, mut in_at) = (0, 0);
    while from < kept.len() {
        let (layout, took) =
            AlignedPass::bounded(&kept[from..], l.align, l.pad_last, l.max_bounce)?;
        let tail = layout.unaligned_tail();
        bytes += sink.write_all_reporting(
            &layout.slices(),
            &mut Aligned {
                layout: &layout,
                unpin: progress,
                in_at,
            },
        )?;
        if let Some(t) = &tail {
            sink.end_direct()?;
            bytes += sink.write_all(std::slice::from_ref(t))?;
        }
        padding += layout.padding_bytes();
        in_at += total_len(&kept[from..from + took]);
        from += took;
    }
    Ok((bytes, padding))
}

/// Writes `records` (whole `0x0A <len> <packet>` records, each slice ending
/// at a packet boundary) as a file's last write, with no ring behind it,
/// and syncs: laid out in blocks where the file takes `O_DIRECT` (storage
/// direct; the last run unpadded, through the page cache), else through the
/// page cache. For the save of a dead recorder's rings, read in place.
/// Returns the bytes written.
pub(crate) fn write_last(
    sink: &mut dyn FileSink,
    records: &[IoSlice<'_>],
) -> Result<u64, PassFailure> {
    let padding = settle_direct(sink, total_len(records), true, None)?;
    let direct = sink.direct_alignment().map(|align| Layout {
        align,
        pad_last: false,
        max_bounce: MAX_BOUNCE_BYTES,
    });
    // Nothing to let go of: the caller keeps its memory until this returns.
    let mut nothing = Unpin {
        batches: &[],
        spans: Vec::new(),
        next: 0,
        floor: 0,
        idle: None,
    };
    let (bytes, _) = write_kept(sink, records, direct, &mut nothing)?;
    sink.sync_data()?;
    Ok(padding + bytes)
}

fn total_len(iov: &[IoSlice<'_>]) -> u64 {
    iov.iter().map(|s| s.len() as u64).sum()
}

/// Where one data range of a batch lies in the pass's list.
#[derive(Clone, Copy, Debug)]
struct Span {
    /// Position in the list.
    at: u64,
    len: u64,
    /// Index of its batch.
    batch: usize,
    /// Position in that batch's data.
    data_at: u64,
}

/// Lets go of the ring regions whose bytes are in the file, as the sink
/// reports them (see the module docs).
struct Unpin<'b, 'i> {
    batches: &'b [FlushBatch],
    /// The batches' data ranges, in list order.
    spans: Vec<Span>,
    /// The first span not wholly written yet.
    next: usize,
    /// Where the last region let go of ends in the list.
    floor: u64,
    /// The caller's work while the pass waits on the file.
    idle: Option<&'i mut dyn FnMut()>,
}

impl Unpin<'_, '_> {
    /// The first `done` bytes of the list are in the file: unpins the
    /// regions within them. Returns the floor: where the last region let go
    /// of ends in the list, a packet boundary (0 while none is).
    fn through(&mut self, done: u64) -> u64 {
        let mut i = self.next;
        // The last span reached, and how far into its batch's data.
        let mut reached: Option<(usize, u64)> = None;
        while let Some(&s) = self.spans.get(i) {
            if s.at >= done {
                break;
            }
            if let Some((j, data_done)) = reached
                && self.spans[j].batch != s.batch
            {
                self.release(j, data_done);
            }
            let written = (done - s.at).min(s.len);
            reached = Some((i, s.data_at + written));
            if written < s.len {
                break;
            }
            i += 1;
        }
        if let Some((j, data_done)) = reached {
            self.release(j, data_done);
        }
        self.next = i;
        self.floor
    }

    /// Unpins the regions in the first `data_done` bytes of span `j`'s
    /// batch (all below `done` in the list) and moves the floor.
    #[allow(unsafe_code)]
    fn release(&mut self, j: usize, data_done: u64) {
        let batch = self.spans[j].batch;
        let b = &self.batches[batch];
        let before = b.released_through();
        // SAFETY: M4 — the first `data_done` bytes of this batch's data lie
        // below `done` in the list, which the sink has written (its requests
        // completed, P1); the regions let go of end at or below the floor
        // returned, under which the sink's `WriteList` shows it nothing
        // again (P1), and this pass reads none of it after handing it over
        // (P2).
        let released = unsafe { b.release_written(data_done) };
        if released > before {
            // The batch's data position, back in the list.
            let first = self.spans[..=j].partition_point(|t| t.batch < batch);
            let k = first + self.spans[first..=j].partition_point(|t| t.data_at + t.len < released);
            let t = self.spans[k];
            self.floor = self.floor.max(t.at + (released - t.data_at));
        }
    }
}

impl WriteProgress for Unpin<'_, '_> {
    fn written(&mut self, done: u64) -> u64 {
        self.through(done)
    }

    fn idle(&mut self) {
        if let Some(f) = &mut self.idle {
            f();
        }
    }
}

/// Progress through an `O_DIRECT` layout of the list's slices from
/// position `in_at` on: its positions mapped to the list's and back (a
/// floor below the group is 0 in it).
struct Aligned<'l, 'a, 'u, 'b, 'i> {
    layout: &'l AlignedPass<'a>,
    unpin: &'u mut Unpin<'b, 'i>,
    in_at: u64,
}

impl WriteProgress for Aligned<'_, '_, '_, '_, '_> {
    fn written(&mut self, done: u64) -> u64 {
        let floor = self
            .unpin
            .through(self.in_at + self.layout.input_done(done));
        self.layout.output_of(floor.saturating_sub(self.in_at))
    }

    fn idle(&mut self) {
        WriteProgress::idle(self.unpin);
    }
}
