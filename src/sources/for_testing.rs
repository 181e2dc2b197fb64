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

use std::time::{Duration, Instant};

use super::{DataSource, SourceError};
use crate::clock::boottime_ns;
use crate::ringbuf::Writer;
use crate::trace::encoder::ProtoEncoder;
use crate::wire::{test_event, trace_packet};

/// What the source writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TestOptions {
    pub message_count: u64,
    pub max_messages_per_second: u32,
    pub message_size: u32,
    pub seed: u32,
    pub(crate) send_batch_on_register: bool,
}

/// The source of one session: its writer and where it is in its sequence.
/// The event loop runs it when [`DataSource::next_due`] says: a paced
/// source writes the packets whose time has come, at most one run per
/// [`PACED_STEP`]; an unpaced one writes [`UNPACED_BATCH`] packets per run
/// and is due again at once, so the loop serves everything else between
/// its batches.
pub(crate) struct ForTesting {
    name: String,
    opts: TestOptions,
    writer: Option<Writer>,
    /// Set by `start`, with when it started on the loop's clock.
    pacer: Option<(Pacer, Instant)>,
}

impl ForTesting {
    pub(crate) fn new(name: &str, opts: TestOptions, writer: Writer) -> Self {
        Self {
            name: name.to_string(),
            opts,
            writer: Some(writer),
            pacer: None,
        }
    }
}

/// A small deterministic generator (xorshift32) for `seq_value`: the same
/// seed gives the same values on every run.
#[derive(Clone, Copy, Debug)]
pub struct SeqValues(u32);

impl SeqValues {
    /// The generator seeded with `seed` (0, which xorshift never leaves, is
    /// replaced by a fixed non-zero seed).
    pub fn new(seed: u32) -> Self {
        Self(if seed == 0 { 0x9e37_79b9 } else { seed })
    }
    /// The next value of the sequence.
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

/// A paced source runs at most this often: the packets due meanwhile are
/// written together (each stamped when written), so a rate of thousands
/// per second costs a thousand wake-ups, not one per packet.
pub(crate) const PACED_STEP: Duration = Duration::from_millis(1);
/// Unpaced, one run writes at most this many packets.
pub(crate) const UNPACED_BATCH: u64 = 1024;

/// When packet `n` is due, in nanoseconds after the first: `n / rate`
/// seconds, so packets leave at a steady rate from the start, not in bursts.
fn due_ns(n: u64, rate: u32) -> u64 {
    let ns = u128::from(n) * 1_000_000_000 / u128::from(rate.max(1));
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// Where the sequence is: the next packet's number and timestamp, the
/// values and filler, the time of the first packet.
struct Pacer {
    started_ns: u64,
    n: u64,
    ts: u64,
    dropped: u64,
    values: SeqValues,
    filler: Vec<u8>,
    /// Packets per second; 0: as fast as the loop lets it.
    rate: u32,
    /// When the next run is due, in boot-clock ns; `None` once done.
    next_ns: Option<u64>,
}

impl Pacer {
    fn new(opts: &TestOptions, now_ns: u64) -> Self {
        Self {
            started_ns: now_ns,
            n: 0,
            ts: now_ns,
            dropped: 0,
            values: SeqValues::new(opts.seed),
            filler: (0..opts.message_size)
                .map(|i| b'a' + (i % 26) as u8)
                .collect(),
            rate: if opts.send_batch_on_register {
                0
            } else {
                opts.max_messages_per_second
            },
            next_ns: Some(now_ns),
        }
    }

    /// Writes what is due at `now_ns` into `writer`: paced, every packet
    /// whose time has come; unpaced, one batch. Sets the next run.
    fn run(&mut self, opts: &TestOptions, writer: &mut Writer, now_ns: u64) {
        let unlimited = opts.message_count == 0;
        let limit = if unlimited {
            u64::MAX
        } else {
            opts.message_count
        };
        let until = if self.rate > 0 {
            // Packets 0..=k are due, k = the last whose time has come.
            let elapsed = now_ns.saturating_sub(self.started_ns);
            let k = u128::from(elapsed) * u128::from(self.rate) / 1_000_000_000;
            u64::try_from(k).unwrap_or(u64::MAX).saturating_add(1)
        } else {
            self.n.saturating_add(UNPACED_BATCH)
        }
        .min(limit);
        let seq = writer.id().0;
        let max_len = max_packet_len(self.filler.len());
        self.ts = self.ts.max(now_ns);
        while self.n < until {
            let is_last = !unlimited && self.n + 1 == opts.message_count;
            let value = self.values.next();
            match writer.begin_packet(max_len) {
                Ok(mut slot) => match encode_test_packet(
                    slot.buf(),
                    seq,
                    self.ts,
                    self.n,
                    value,
                    &self.filler,
                    is_last,
                ) {
                    Some(len) => slot.commit(len),
                    None => self.dropped += 1,
                },
                Err(_) => self.dropped += 1,
            }
            self.ts += 1;
            self.n += 1;
        }
        self.next_ns = if self.n >= limit {
            writer.flush();
            None
        } else if self.rate > 0 {
            let due = self.started_ns.saturating_add(due_ns(self.n, self.rate));
            Some(due.max(now_ns + PACED_STEP.as_nanos() as u64))
        } else {
            Some(now_ns)
        };
    }
}

impl DataSource for ForTesting {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(&mut self) -> Result<(), SourceError> {
        if self.writer.is_none() || self.pacer.is_some() {
            return Ok(());
        }
        let now = Instant::now();
        self.pacer = Some((Pacer::new(&self.opts, boottime_ns()), now));
        self.run(now, false)
    }

    fn next_due(&self) -> Option<Instant> {
        self.writer.as_ref()?;
        let (p, origin) = self.pacer.as_ref()?;
        // On the loop's clock, from the pacer's own: the boot clock's
        // reading now would always lie a little ahead of `now`.
        Some(*origin + Duration::from_nanos(p.next_ns?.saturating_sub(p.started_ns)))
    }

    fn run(&mut self, now: Instant, _woken: bool) -> Result<(), SourceError> {
        if self.next_due().is_some_and(|due| due <= now)
            && let (Some((p, _)), Some(w)) = (&mut self.pacer, &mut self.writer)
        {
            p.run(&self.opts, w, boottime_ns());
        }
        Ok(())
    }

    fn flush(&mut self, _timeout: Duration) -> Result<(), SourceError> {
        // Committed packets are visible to the next pass without help.
        Ok(())
    }

    fn stop(&mut self) -> Result<(), SourceError> {
        // Dropping the writer commits what it holds; nothing more is due.
        self.writer = None;
        Ok(())
    }

    fn packets_dropped(&self) -> u64 {
        self.pacer.as_ref().map_or(0, |(p, _)| p.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ringbuf::{Buffer, BufferParams, FillPolicy, FlushItem, WriterId};
    use crate::wire::framing::frames;
    use perfetto_protos::trace_packet::TracePacket;
    use protobuf::Message;

    /// Runs the source on a clock of its own: each run happens when the
    /// last one said, plus 1 µs of work per packet. The (timestamp,
    /// counter) of each packet, decoded by Perfetto's own protos, and the
    /// time the runs waited in all.
    fn record(opts: TestOptions) -> (Vec<(u64, u64)>, Duration) {
        let b = Buffer::new(BufferParams::new(1 << 20, FillPolicy::Discard)).expect("buffer");
        let mut w = b.writer(WriterId(2));
        let mut now = 1_000_000_000u64;
        let mut p = Pacer::new(&opts, now);
        let mut waited = 0u64;
        while let Some(at) = p.next_ns {
            waited += at.saturating_sub(now);
            now = now.max(at);
            let before = p.n;
            p.run(&opts, &mut w, now);
            now += (p.n - before) * 1_000;
        }
        drop(w);
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
        (out, Duration::from_nanos(waited))
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
