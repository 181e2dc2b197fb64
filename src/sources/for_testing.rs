//! The `for_testing` data source (also answering to Perfetto's
//! `android.perfetto.FakeProducer` name): writes `for_testing` TestEvent
//! packets numbered 0, 1, 2, … so any test can check order and loss.
//!
//! Each packet is `TracePacket { timestamp, trusted_packet_sequence_id,
//! for_testing: TestEvent { counter: N, seq_value: PRNG(seed), str: filler
//! of message_size bytes, is_last } }`, encoded in place in the ring.
//! TestConfig: `message_count` (0: until stopped), `max_messages_per_second`
//! (0: as fast as possible), `message_size`, `seed`,
//! `send_batch_on_register` (write the whole batch at once at start).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{DataSource, SourceError};
use crate::clock::boottime_ns;
use crate::ringbuf::Writer;
use crate::trace::encoder::ProtoEncoder;
use crate::wire::{test_event, trace_packet};

/// The names this source answers to.
pub const NAMES: [&str; 2] = ["for_testing", "android.perfetto.FakeProducer"];

/// What the source writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestOptions {
    pub message_count: u64,
    pub max_messages_per_second: u32,
    pub message_size: u32,
    pub seed: u32,
    pub send_batch_on_register: bool,
}

/// Counters shared with the writing thread.
#[derive(Debug, Default)]
pub struct TestProgress {
    pub written: AtomicU64,
    pub dropped: AtomicU64,
    pub done: AtomicBool,
}

/// The running source.
pub struct ForTesting {
    name: String,
    opts: TestOptions,
    writer: Option<Writer>,
    stop: Arc<AtomicBool>,
    progress: Arc<TestProgress>,
    thread: Option<JoinHandle<()>>,
}

impl ForTesting {
    pub fn new(name: &str, opts: TestOptions, writer: Writer) -> Self {
        Self {
            name: name.to_string(),
            opts,
            writer: Some(writer),
            stop: Arc::new(AtomicBool::new(false)),
            progress: Arc::new(TestProgress::default()),
            thread: None,
        }
    }

    /// Live counters.
    pub fn progress(&self) -> Arc<TestProgress> {
        self.progress.clone()
    }
}

/// A small deterministic generator (xorshift32) for `seq_value`: the same
/// seed gives the same values on every run.
#[derive(Clone, Copy, Debug)]
pub struct SeqValues(u32);

impl SeqValues {
    pub fn new(seed: u32) -> Self {
        Self(if seed == 0 { 0x9e37_79b9 } else { seed })
    }
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }
}

/// Encodes one test packet into `buf`, returning its length, or `None` if it
/// does not fit.
pub fn encode_test_packet(
    buf: &mut [u8],
    sequence_id: u32,
    ts: u64,
    counter: u64,
    seq_value: u32,
    filler: &[u8],
    is_last: bool,
) -> Option<usize> {
    let mut e = ProtoEncoder::new(buf);
    e.uint(trace_packet::TIMESTAMP, ts);
    e.uint(trace_packet::TRUSTED_PACKET_SEQUENCE_ID, sequence_id as u64);
    let t = e.begin_nested(trace_packet::FOR_TESTING);
    e.uint(test_event::COUNTER, counter);
    e.uint(test_event::SEQ_VALUE, seq_value as u64);
    if !filler.is_empty() {
        e.bytes(test_event::STR, filler);
    }
    if is_last {
        e.bool(test_event::IS_LAST, true);
    }
    e.end_nested(t);
    e.finish().ok()
}

/// Upper bound of an encoded test packet with `filler_len` bytes of filler.
pub fn max_packet_len(filler_len: usize) -> usize {
    // timestamp + seq id + nested header + counter + seq_value + str + is_last
    11 + 6 + 7 + 11 + 6 + 1 + 5 + filler_len + 2
}

/// Time as the writing thread sees it: the boot clock and a sleep, so a
/// test can run the pacing on a clock of its own.
trait Timing {
    /// BOOTTIME nanoseconds.
    fn now_ns(&mut self) -> u64;
    fn sleep(&mut self, d: Duration);
}

/// The real boot clock.
struct BootClock;

impl Timing for BootClock {
    fn now_ns(&mut self) -> u64 {
        boottime_ns()
    }
    fn sleep(&mut self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// Longest sleep between checks for stop.
const MAX_SLEEP: Duration = Duration::from_millis(50);
/// Unpaced, stop and progress are checked once per this many packets.
const UNPACED_BATCH: u64 = 256;

/// When packet `n` is due, in nanoseconds after the first: `n / rate`
/// seconds, so packets leave at a steady rate from the start, not in bursts.
fn due_ns(n: u64, rate: u32) -> u64 {
    let ns = u128::from(n) * 1_000_000_000 / u128::from(rate.max(1));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

fn run(
    mut writer: Writer,
    opts: TestOptions,
    stop: Arc<AtomicBool>,
    progress: Arc<TestProgress>,
    clock: &mut impl Timing,
) {
    let seq = writer.id().0;
    let filler: Vec<u8> = (0..opts.message_size)
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    let max_len = max_packet_len(filler.len());
    let mut values = SeqValues::new(opts.seed);
    let unlimited = opts.message_count == 0;
    let rate = if opts.send_batch_on_register {
        0
    } else {
        opts.max_messages_per_second
    };
    let started = clock.now_ns();
    let mut n: u64 = 0;
    let mut ts = started;
    let mut dropped = 0u64;
    while unlimited || n < opts.message_count {
        if rate > 0 {
            // Paced: every packet waits for its time (and checks for stop,
            // which costs nothing next to the wait).
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let now = clock.now_ns();
            let due = started.saturating_add(due_ns(n, rate));
            if due > now {
                progress.written.store(n, Ordering::Relaxed);
                progress.dropped.store(dropped, Ordering::Relaxed);
                clock.sleep(Duration::from_nanos(due - now).min(MAX_SLEEP));
                continue;
            }
            ts = ts.max(now);
        } else if n.is_multiple_of(UNPACED_BATCH) {
            // As fast as possible: check for stop and publish progress once
            // per batch, not per packet.
            if stop.load(Ordering::Relaxed) {
                break;
            }
            progress.written.store(n, Ordering::Relaxed);
            progress.dropped.store(dropped, Ordering::Relaxed);
            ts = ts.max(clock.now_ns());
        }
        let is_last = !unlimited && n + 1 == opts.message_count;
        let value = values.next();
        match writer.begin_packet(max_len) {
            Ok(mut slot) => {
                match encode_test_packet(slot.buf(), seq, ts, n, value, &filler, is_last) {
                    Some(len) => slot.commit(len),
                    None => dropped += 1,
                }
            }
            Err(_) => dropped += 1,
        }
        ts += 1;
        n += 1;
    }
    writer.flush();
    progress.written.store(n, Ordering::Relaxed);
    progress.dropped.store(dropped, Ordering::Relaxed);
    progress.done.store(true, Ordering::Release);
}

impl DataSource for ForTesting {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(&mut self) -> Result<(), SourceError> {
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        let (opts, stop, progress) = (self.opts.clone(), self.stop.clone(), self.progress.clone());
        let t = std::thread::Builder::new()
            .name("recorder-for_testing".into())
            .spawn(move || run(writer, opts, stop, progress, &mut BootClock))
            .map_err(|e| SourceError::Failed {
                source_name: self.name.clone(),
                cause: Box::new(e),
            })?;
        self.thread = Some(t);
        Ok(())
    }

    fn flush(&mut self, _timeout: Duration) -> Result<(), SourceError> {
        // Committed packets are visible to the next pass without help.
        Ok(())
    }

    fn stop(&mut self) -> Result<(), SourceError> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().map_err(|_| SourceError::Failed {
                source_name: self.name.clone(),
                cause: "writer thread panicked".into(),
            })?;
        }
        // Never started: drop the writer so its (empty) chunk is released.
        self.writer = None;
        Ok(())
    }

    fn packets_dropped(&self) -> u64 {
        self.progress.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ringbuf::{Buffer, BufferParams, FillPolicy, FlushItem, WriterId};
    use crate::wire::framing::frames;
    use perfetto_protos::trace_packet::TracePacket;
    use protobuf::Message;

    /// A clock that moves only when slept on, plus a little per reading (the
    /// time a packet takes to write).
    struct FakeClock {
        now_ns: u64,
        slept: Duration,
    }

    impl Timing for FakeClock {
        fn now_ns(&mut self) -> u64 {
            self.now_ns += 1_000;
            self.now_ns
        }
        fn sleep(&mut self, d: Duration) {
            self.slept += d;
            self.now_ns += d.as_nanos() as u64;
        }
    }

    /// Runs the source on the fake clock; the (timestamp, counter) of each
    /// packet, decoded by Perfetto's own protos, and the time slept.
    fn record(opts: TestOptions) -> (Vec<(u64, u64)>, Duration) {
        let b = Buffer::new(BufferParams::new(1 << 20, FillPolicy::Discard)).expect("buffer");
        let mut clock = FakeClock {
            now_ns: 1_000_000_000,
            slept: Duration::ZERO,
        };
        let progress = Arc::new(TestProgress::default());
        let stop = Arc::new(AtomicBool::new(false));
        run(
            b.writer(WriterId(2)),
            opts,
            stop,
            progress.clone(),
            &mut clock,
        );
        assert!(progress.done.load(Ordering::Acquire));
        let batch = b.take_flush();
        let mut out = Vec::new();
        for item in batch.items() {
            if let FlushItem::Data(d) = item {
                for f in frames(d) {
                    let p = TracePacket::parse_from_bytes(f.packet).expect("decodes");
                    out.push((p.timestamp(), p.for_testing().counter()));
                }
            }
        }
        (out, clock.slept)
    }

    #[test]
    fn a_rate_spreads_packets_evenly_from_the_start() {
        let (packets, slept) = record(TestOptions {
            message_count: 40,
            max_messages_per_second: 20,
            ..TestOptions::default()
        });
        assert_eq!(packets.len(), 40);
        let first = packets[0].0;
        for (i, (ts, counter)) in packets.iter().enumerate() {
            assert_eq!(*counter, i as u64);
            // Packet n leaves n/20 s after the first, never before.
            let due = first + i as u64 * 50_000_000;
            assert!(
                (due..due + 5_000_000).contains(ts),
                "packet {i} at +{} ms",
                (ts - first) / 1_000_000
            );
        }
        // No burst at the start: one packet in the first 50 ms.
        assert_eq!(
            packets.iter().filter(|p| p.0 < first + 50_000_000).count(),
            1
        );
        // The run takes (n - 1)/rate of (fake) time.
        assert!(slept >= Duration::from_millis(39 * 50 - 40), "{slept:?}");
    }

    #[test]
    fn without_a_rate_packets_leave_at_once() {
        let (packets, slept) = record(TestOptions {
            message_count: 600,
            ..TestOptions::default()
        });
        assert_eq!(packets.len(), 600);
        assert_eq!(slept, Duration::ZERO);
        assert!(
            packets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 + 1 == w[1].1)
        );
    }
}
