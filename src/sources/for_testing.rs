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
use std::time::{Duration, Instant};

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

fn run(mut writer: Writer, opts: TestOptions, stop: Arc<AtomicBool>, progress: Arc<TestProgress>) {
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
    let started = Instant::now();
    let mut n: u64 = 0;
    let mut ts = boottime_ns();
    let mut dropped = 0u64;
    while unlimited || n < opts.message_count {
        // Check for stop and publish progress once per batch, not per packet.
        if n.is_multiple_of(256) {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            progress.written.store(n, Ordering::Relaxed);
            progress.dropped.store(dropped, Ordering::Relaxed);
            ts = ts.max(boottime_ns());
            if rate > 0 {
                let due = Duration::from_secs_f64(n as f64 / rate as f64);
                let elapsed = started.elapsed();
                if due > elapsed {
                    std::thread::sleep((due - elapsed).min(Duration::from_millis(50)));
                    continue;
                }
            }
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
            .spawn(move || run(writer, opts, stop, progress))
            .map_err(|e| SourceError::Failed {
                source_name: self.name.clone(),
                msg: e.to_string(),
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
                msg: "writer thread panicked".into(),
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
