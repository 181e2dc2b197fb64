//! One write pass: the recorder's own packets, then every buffer's committed
//! data (buffer 0 first), then the pass trailer, handed to the sink as one
//! list of iovecs that point straight into the ring buffers' mmaps.
//!
//! `max_file_size_bytes` is enforced here: the list is cut before the first
//! packet that would reach the cap, the kept part is written and synced,
//! and the pass reports that the cap was reached.
//!
//! With a compression stage ([`write_pass_staged`]) the list is compressed
//! first and the cap applies to the compressed packets, the file's bytes.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ringbuf::{Buffer, FlushBatch, FlushItem};
use crate::storage::compress::{CompressError, ZstdStage, count_records};
use crate::storage::{FileSink, SinkError, cut_at_packet_boundary};
use crate::trace::service;

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
    pub cap_reached: bool,
    pub duration: Duration,
}

/// Where the pass takes buffer data from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// Consume what is committed (streaming and the final pass).
    Consume,
    /// Leave it in place (snapshots).
    Snapshot,
    /// No buffer data (a session still waiting for its trigger).
    Nothing,
}

/// What happens between the ring and the sink.
#[derive(Debug, Default)]
pub struct PassStage<'a> {
    /// Compress the pass (facts §4.9).
    pub compress: Option<&'a mut ZstdStage>,
    /// Count the packets written (a walk over the record headers).
    pub count_packets: bool,
}

/// A pass failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PassError {
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Compress(#[from] CompressError),
}

/// Runs one pass over `buffers` (each with how to take its data) into `sink`.
pub fn write_pass(
    sink: &mut dyn FileSink,
    head: &[Vec<u8>],
    buffers: &[(Arc<Buffer>, Take)],
    tail: impl FnOnce() -> Vec<Vec<u8>>,
    max_file_size: Option<u64>,
    sync: bool,
) -> Result<PassReport, SinkError> {
    let stage = PassStage::default();
    match write_pass_staged(sink, head, buffers, tail, max_file_size, sync, stage) {
        Ok(r) => Ok(r),
        Err(PassError::Sink(e)) => Err(e),
        Err(PassError::Compress(_)) => unreachable!("a pass without a stage does not compress"),
    }
}

/// [`write_pass`] with an optional compression stage between the ring and
/// the sink.
pub fn write_pass_staged(
    sink: &mut dyn FileSink,
    head: &[Vec<u8>],
    buffers: &[(Arc<Buffer>, Take)],
    tail: impl FnOnce() -> Vec<Vec<u8>>,
    max_file_size: Option<u64>,
    sync: bool,
    stage: PassStage<'_>,
) -> Result<PassReport, PassError> {
    let started = Instant::now();
    let batches: Vec<FlushBatch> = buffers
        .iter()
        .filter_map(|(b, take)| match take {
            Take::Consume => Some(b.take_flush()),
            Take::Snapshot => Some(b.snapshot()),
            Take::Nothing => None,
        })
        .collect();
    // Loss markers are owned here so the iovecs can borrow them.
    let markers: Vec<Vec<u8>> = batches
        .iter()
        .flat_map(|b| b.items())
        .filter_map(|it| match it {
            FlushItem::Loss { writer } => Some(service::loss_marker(writer.0)),
            FlushItem::Data(_) => None,
        })
        .collect();
    let tail = tail();
    let mut iov: Vec<IoSlice<'_>> = head.iter().map(|p| IoSlice::new(p)).collect();
    let mut buffer_bytes = 0u64;
    let mut next_marker = markers.iter();
    for b in &batches {
        for it in b.items() {
            match it {
                FlushItem::Data(d) => {
                    buffer_bytes += d.len() as u64;
                    iov.push(IoSlice::new(d));
                }
                FlushItem::Loss { .. } => {
                    if let Some(m) = next_marker.next() {
                        iov.push(IoSlice::new(m));
                    }
                }
            }
        }
    }
    iov.extend(tail.iter().map(|p| IoSlice::new(p)));

    let mut cap_reached = false;
    let mut input_bytes = 0u64;
    let mut compressed_packets = 0u64;
    let mut packets = 0u64;
    let result = (|| -> Result<u64, PassError> {
        let compressed = match stage.compress {
            Some(z) => Some(z.compress(&iov)?),
            None => None,
        };
        let records = match &compressed {
            Some(c) => c.slices(),
            None => iov.clone(),
        };
        let kept = match max_file_size {
            Some(cap) => {
                let room = cap.saturating_sub(sink.bytes_written());
                let (kept, cut) = cut_at_packet_boundary(&records, room);
                cap_reached = cut.cut;
                kept
            }
            None => records,
        };
        let bytes = if kept.is_empty() {
            0
        } else {
            sink.write_all(&kept)?
        };
        (input_bytes, compressed_packets) = match &compressed {
            Some(c) => c.input_of_prefix(bytes),
            None => (bytes, 0),
        };
        if stage.count_packets {
            packets = match &compressed {
                Some(c) => c.packets_of_prefix(bytes),
                None => count_records(&kept),
            };
        }
        if sync || cap_reached {
            sink.sync_data()?;
        }
        Ok(bytes)
    })();
    drop(iov);
    for b in batches {
        b.release();
    }
    let bytes = result?;
    Ok(PassReport {
        bytes,
        buffer_bytes,
        input_bytes,
        compressed_packets,
        packets,
        cap_reached,
        duration: started.elapsed(),
    })
}
