//! One write pass: the recorder's own packets, then every buffer's committed
//! data (buffer 0 first), then the pass trailer, handed to the sink as one
//! list of iovecs that point straight into the ring buffers' mmaps.
//!
//! `max_file_size_bytes` is enforced here: the list is cut before the first
//! packet that would reach the cap, the kept part is written and synced,
//! and the pass reports that the cap was reached.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ringbuf::{Buffer, FlushBatch, FlushItem};
use crate::storage::{FileSink, SinkError, cut_at_packet_boundary};
use crate::trace::service;

/// What a pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Bytes written to the file by this pass.
    pub bytes: u64,
    /// Bytes of buffer data (not service packets) in this pass.
    pub buffer_bytes: u64,
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

/// Runs one pass over `buffers` (each with how to take its data) into `sink`.
pub fn write_pass(
    sink: &mut dyn FileSink,
    head: &[Vec<u8>],
    buffers: &[(Arc<Buffer>, Take)],
    tail: impl FnOnce() -> Vec<Vec<u8>>,
    max_file_size: Option<u64>,
    sync: bool,
) -> Result<PassReport, SinkError> {
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
    let result = (|| {
        let kept = match max_file_size {
            Some(cap) => {
                let room = cap.saturating_sub(sink.bytes_written());
                let (kept, cut) = cut_at_packet_boundary(&iov, room);
                cap_reached = cut.cut;
                kept
            }
            None => iov.clone(),
        };
        let bytes = if kept.is_empty() {
            0
        } else {
            sink.write_all(&kept)?
        };
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
        cap_reached,
        duration: started.elapsed(),
    })
}
