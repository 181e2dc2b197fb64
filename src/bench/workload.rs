//! The writer threads: each drives one real [`Writer`] with `for_testing`
//! packets (counter 0, 1, 2, … per sequence, so the file shows every loss),
//! paced to a rate or as fast as it can, and times itself without touching
//! the per-packet fast path:
//!
//! * write latency: a batch of [`BATCH`] packets is timed as a whole and its
//!   mean recorded once per packet (two clock reads per batch);
//! * chunk-acquire latency: the writer keeps a shadow of the room left in its
//!   region (packets have a known reserved size, the region's size is read
//!   back after each acquisition), so it knows which `begin_packet` will
//!   take a new region and times only those calls;
//! * run time: every writer starts at one barrier shared with the flusher
//!   and stops its clock at its last packet, before handing its region over.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::histogram::LatencyHistogram;
use crate::clock::boottime_ns;
use crate::ringbuf::{Writer, slot_header_bytes};
use crate::sources::for_testing::{SeqValues, encode_test_packet, max_packet_len};

/// Packets per timed batch (and per stop/pacing check).
pub(crate) const BATCH: u64 = 64;

/// What one writer thread writes.
#[derive(Clone, Debug, PartialEq)]
pub struct WriterPlan {
    /// Index of the buffer written to.
    pub buffer: usize,
    /// `trusted_packet_sequence_id` (≥ 2).
    pub sequence_id: u32,
    /// Bytes of the TestEvent `str` filler.
    pub filler_len: usize,
    /// Packets per second, or as fast as possible.
    pub(crate) rate_pps: Option<f64>,
    /// Packets to offer, or until stopped.
    pub packets: Option<u64>,
    /// Seed of the `seq_value` generator: the same seed, the same values.
    pub seed: u32,
}

/// Live counters a writer publishes once per batch (plain stores).
#[derive(Debug, Default)]
pub(crate) struct WriterProgress {
    pub offered: AtomicU64,
    /// Framed bytes offered (accepted or not).
    pub(crate) offered_bytes: AtomicU64,
    pub done: AtomicBool,
}

/// What a writer did.
#[derive(Clone, Debug, Default)]
pub struct WriterOutcome {
    /// The writer's `trusted_packet_sequence_id`.
    pub sequence_id: u32,
    /// Index of the buffer written to.
    pub buffer: usize,
    /// Packets offered (`begin_packet` calls), accepted or not.
    pub offered: u64,
    /// Packets committed to the buffer.
    pub accepted: u64,
    /// Counters of the first and the last accepted packet.
    pub first_accepted: Option<u64>,
    /// Counter of the last accepted packet.
    pub last_accepted: Option<u64>,
    /// Packets offered but not stored: `begin_packet` found no room.
    pub dropped: u64,
    pub(crate) offered_bytes: u64,
    pub(crate) accepted_bytes: u64,
    /// Write latency: each batch's mean per packet, recorded once per
    /// packet.
    pub write: LatencyHistogram,
    pub(crate) acquire: LatencyHistogram,
    /// Acquisitions that found no chunk (the packet was dropped).
    pub(crate) acquire_failures: u64,
    /// From the common start to the last packet offered.
    pub elapsed: Duration,
    /// When the last packet was offered.
    pub finished: Option<Instant>,
}

/// The filler length that makes an encoded test packet about `packet_size`
/// bytes (the TracePacket, without the framing); small sizes get no filler.
pub fn filler_for(packet_size: usize) -> usize {
    let mut scratch = vec![0u8; max_packet_len(packet_size) + 16];
    // A typical packet: a boot-time timestamp and a mid-run counter.
    let probe = |filler: usize, scratch: &mut [u8]| {
        let f = vec![b'a'; filler];
        encode_test_packet(scratch, 2, boottime_ns(), 1 << 20, u32::MAX, &f, false).unwrap_or(0)
    };
    let base = probe(0, &mut scratch);
    if packet_size <= base {
        return 0;
    }
    let mut filler = packet_size - base;
    // The filler's own tag and length bytes.
    while filler > 0 && probe(filler, &mut scratch) > packet_size {
        filler -= 1;
    }
    filler
}

/// Where the writers wait until all of them are running, so that they start
/// together with the flusher's clock.
#[derive(Debug, Default)]
pub(crate) struct StartGate {
    /// (writers waiting, open); each holder stores one count or flag, so
    /// a poisoned state is still whole.
    state: Mutex<(usize, bool)>,
    changed: Condvar,
}

impl StartGate {
    /// A writer is ready: returns once the gate opens.
    pub(crate) fn wait(&self) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.0 += 1;
        self.changed.notify_all();
        while !s.1 {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits until `writers` are waiting, then lets them all go.
    pub(crate) fn open_when_ready(&self, writers: usize) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while s.0 < writers {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.1 = true;
        self.changed.notify_all();
    }

    /// Lets every writer go now.
    pub(crate) fn open(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).1 = true;
        self.changed.notify_all();
    }
}

/// Runs one writer, from the moment every writer is running and the
/// flusher lets them go through `start`, until its packet count is reached or `stop` is set.
pub(crate) fn run_writer(
    mut writer: Writer,
    plan: WriterPlan,
    start: Arc<StartGate>,
    stop: Arc<AtomicBool>,
    progress: Arc<WriterProgress>,
) -> WriterOutcome {
    let seq = plan.sequence_id;
    let filler: Vec<u8> = (0..plan.filler_len)
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    let max_len = max_packet_len(filler.len());
    // Bytes `begin_packet(max_len)` puts before each packet.
    let header = slot_header_bytes(max_len);
    let reserved = header + max_len;
    let mut room: usize = 0;
    let mut values = SeqValues::new(plan.seed);
    let mut out = WriterOutcome {
        sequence_id: seq,
        buffer: plan.buffer,
        ..WriterOutcome::default()
    };
    start.wait();
    let started = Instant::now();
    let mut n: u64 = 0;
    let mut last_len = max_len;
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let batch = match plan.packets {
            Some(total) if n >= total => break,
            Some(total) => BATCH.min(total - n),
            None => BATCH,
        };
        if let Some(rate) = plan.rate_pps {
            let due = Duration::from_secs_f64(n as f64 / rate);
            let elapsed = started.elapsed();
            if due > elapsed {
                std::thread::sleep((due - elapsed).min(Duration::from_millis(20)));
                continue;
            }
        }
        let ts0 = boottime_ns();
        let t0 = Instant::now();
        for i in 0..batch {
            let ts = ts0 + i;
            let is_last = plan.packets.is_some_and(|t| n + 1 == t);
            let value = values.next();
            let acquires = room < reserved;
            let ta = acquires.then(Instant::now);
            match writer.begin_packet(max_len) {
                Ok(mut slot) => {
                    match encode_test_packet(slot.buf(), seq, ts, n, value, &filler, is_last) {
                        Some(len) => {
                            slot.commit(len);
                            last_len = len;
                            out.accepted += 1;
                            out.first_accepted.get_or_insert(n);
                            out.last_accepted = Some(n);
                            out.accepted_bytes += (header + len) as u64;
                        }
                        // Cannot happen: max_len bounds the encoding.
                        None => out.dropped += 1,
                    }
                    if let Some(ta) = ta {
                        out.acquire.record_ns(ta.elapsed().as_nanos() as u64);
                        room = writer.region_bytes();
                    }
                    room = room.saturating_sub(header + last_len);
                }
                Err(_) => {
                    if acquires {
                        out.acquire_failures += 1;
                    }
                    out.dropped += 1;
                    room = 0;
                }
            }
            out.offered_bytes += (header + last_len) as u64;
            n += 1;
        }
        let ns = t0.elapsed().as_nanos() as u64;
        out.write.record_n_ns(ns / batch, batch);
        progress.offered.store(n, Ordering::Relaxed);
        progress
            .offered_bytes
            .store(out.offered_bytes, Ordering::Relaxed);
    }
    let finished = Instant::now();
    out.finished = Some(finished);
    out.elapsed = finished - started;
    writer.flush();
    out.offered = n;
    progress.offered.store(n, Ordering::Relaxed);
    progress
        .offered_bytes
        .store(out.offered_bytes, Ordering::Relaxed);
    progress.done.store(true, Ordering::Release);
    drop(writer);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_for_hits_the_size() {
        let mut scratch = vec![0u8; 4096];
        for size in [64usize, 100, 1024, 2000] {
            let f = filler_for(size);
            let filler = vec![b'a'; f];
            let len = encode_test_packet(
                &mut scratch,
                2,
                boottime_ns(),
                1 << 20,
                u32::MAX,
                &filler,
                false,
            )
            .expect("fits");
            assert!(len <= size && len + 3 >= size, "size {size}: {len}");
        }
        assert_eq!(filler_for(1), 0);
    }
}
