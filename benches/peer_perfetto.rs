//! Side by side with Perfetto's own in-process tracing service (the
//! `perfetto-sdk` crate over the vendored C SDK): the same `for_testing`
//! packets (same fields, same filler), one writer, a 16 MiB buffer,
//! RING_BUFFER and DISCARD, 64 MiB of payload per run, through each side's
//! writer API, in the same process and run. Prints packets/s, MB/s, buffer
//! bytes per kept packet, the ratios, and which packets each side kept.
//!
//! Perfetto's producer drops packets when its shared memory is full (the
//! writer outruns the service thread), so its bytes of buffer per packet are
//! taken over the packets it kept: `bytes_read` of its TraceStats buffer (the
//! chunk records it handed to the trace) over the test packets in the trace,
//! with its own loss counters printed beside them. Ours are the bytes the
//! last read handed out (chunk padding included) over the packets it held.
//!
//! `cargo bench --features peer-perfetto --bench peer_perfetto`
//! (the default build does not depend on the SDK).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use perfetto_sdk::{
    data_source::{
        DataSource, DataSourceArgsBuilder, DataSourceBufferExhaustedPolicy, TraceContext,
    },
    heap_buffer::HeapBuffer,
    pb_msg::{PbMsg, PbMsgWriter},
    producer::{Backends, Producer, ProducerInitArgsBuilder},
    protos::config::{
        data_source_config::DataSourceConfig,
        trace_config::{
            BufferConfigFillPolicy, TraceConfig, TraceConfigBufferConfig, TraceConfigDataSource,
        },
    },
    protos::trace::{test_event::TestEvent, trace_packet::TracePacket},
    tracing_session::TracingSession,
};
use protobuf::Message;
use recorder::bench::verify::{self, SequenceFound};
use recorder::bench::workload::filler_for;
use recorder::clock::boottime_ns;
use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, FlushItem, WriterId, slot_header_bytes};
use recorder::sources::for_testing::{SeqValues, encode_test_packet, max_packet_len};
use recorder::wire::fields;
use recorder::wire::framing::frames;

const BUFFER_KB: u32 = 16 * 1024;
const PAYLOAD_BYTES: usize = 64 * 1024 * 1024;
const RUNS: usize = 5;
const DS_NAME: &str = "recorder.bench.for_testing";
const DS_STALL: &str = "recorder.bench.for_testing.stall";

/// What one side kept of one run.
#[derive(Default)]
struct Kept {
    /// Test packets in the output.
    packets: u64,
    /// Buffer bytes those packets took.
    buffer_bytes: u64,
    /// Ours: their framed bytes (slot header + TracePacket).
    framed: u64,
    first: Option<u64>,
    last: Option<u64>,
    runs: u64,
    /// Packets marked `previous_packet_dropped` (ours: loss markers).
    dropped_marks: u64,
}

impl Kept {
    fn per_packet(&self) -> f64 {
        self.buffer_bytes as f64 / self.packets.max(1) as f64
    }

    /// `first..=last in N runs` (what a policy keeps shows at a glance).
    fn shape(&self) -> String {
        match (self.first, self.last) {
            (Some(f), Some(l)) => format!("{f}..={l} in {} run(s)", self.runs),
            _ => "nothing".into(),
        }
    }
}

struct Side {
    elapsed: Duration,
    packets: u64,
    kept: Kept,
    /// Perfetto's own loss counters (empty for ours).
    loss: String,
    /// Perfetto: bytes of chunks that reached its buffer (its producer drops
    /// the rest when its shared memory is full).
    reached_bytes: u64,
    /// Perfetto: TracePacket bytes per kept packet as its producer wrote them.
    packet_bytes: f64,
}

fn session_config(ds_name: &str, policy: BufferConfigFillPolicy) -> Vec<u8> {
    let writer = PbMsgWriter::new();
    let hb = HeapBuffer::new(writer.stream_writer());
    let mut msg = PbMsg::new(&writer).expect("a fresh message");
    {
        let mut cfg = TraceConfig { msg: &mut msg };
        cfg.set_buffers(|b: &mut TraceConfigBufferConfig| {
            b.set_size_kb(BUFFER_KB);
            b.set_fill_policy(policy);
        });
        cfg.set_data_sources(|d: &mut TraceConfigDataSource| {
            d.set_config(|c: &mut DataSourceConfig| {
                c.set_name(ds_name);
            });
        });
    }
    msg.finalize();
    let size = writer.stream_writer().get_written_size();
    let mut out = vec![0u8; size];
    hb.copy_into(&mut out);
    out
}

/// Mean TracePacket bytes Perfetto's producer writes for these packets
/// (encoded by the SDK itself; the service adds the trusted fields only
/// when it reads, so they take no buffer space).
fn perfetto_packet_len(filler: &str, packets: u64) -> f64 {
    let ts = boottime_ns();
    let mut values = SeqValues::new(1);
    let step = (packets / 256).max(1);
    let (mut total, mut n) = (0usize, 0usize);
    for counter in (0..packets).step_by(step as usize) {
        let writer = PbMsgWriter::new();
        let _hb = HeapBuffer::new(writer.stream_writer());
        let mut msg = PbMsg::new(&writer).expect("a fresh message");
        {
            let mut p = TracePacket { msg: &mut msg };
            let v = values.next();
            p.set_timestamp(ts + counter)
                .set_for_testing(|t: &mut TestEvent| {
                    t.set_counter(counter);
                    t.set_seq_value(v);
                    t.set_str(filler);
                });
        }
        msg.finalize();
        total += writer.stream_writer().get_written_size();
        n += 1;
    }
    total as f64 / n.max(1) as f64
}

/// Mean bytes per test packet of the fields its producer wrote, read from
/// the raw trace: the service copies the producer's bytes verbatim and
/// appends its trusted fields (uid 3, sequence id 10, pid 79, machine id 98,
/// previous_packet_dropped 42), which are left out here.
fn producer_bytes_per_packet(trace: &[u8]) -> f64 {
    use recorder::wire::trace_packet as tp;
    const TRUSTED: [u32; 5] = [
        tp::TRUSTED_UID,
        tp::TRUSTED_PACKET_SEQUENCE_ID,
        tp::PREVIOUS_PACKET_DROPPED,
        tp::TRUSTED_PID,
        tp::MACHINE_ID,
    ];
    let (mut packets, mut bytes) = (0u64, 0u64);
    for record in frames(trace) {
        let (mut mine, mut test) = (0u64, false);
        for f in fields(record.packet).map_while(Result::ok) {
            test |= f.number == tp::FOR_TESTING;
            if !TRUSTED.contains(&f.number) {
                mine += (f.end - f.start) as u64;
            }
        }
        if test {
            packets += 1;
            bytes += mine;
        }
    }
    bytes as f64 / packets.max(1) as f64
}

/// Counters of `counters` (in output order) as first/last/runs.
fn runs_of(counters: impl IntoIterator<Item = u64>, kept: &mut Kept) {
    let mut next = None;
    for c in counters {
        kept.packets += 1;
        kept.first.get_or_insert(c);
        kept.last = Some(c);
        if next != Some(c) {
            kept.runs += 1;
        }
        next = Some(c + 1);
    }
}

fn perfetto_run(
    (ds, ds_name): (&DataSource<'static>, &str),
    policy: BufferConfigFillPolicy,
    filler: &str,
    packets: u64,
) -> Side {
    let mut session = TracingSession::in_process().expect("in-process session");
    session.setup(&session_config(ds_name, policy));
    session.start_blocking();
    let mut values = SeqValues::new(1);
    let ts0 = boottime_ns();
    let started = Instant::now();
    for n in 0..packets {
        let v = values.next();
        ds.trace(|ctx: &mut TraceContext| {
            ctx.add_packet(|p: &mut TracePacket| {
                p.set_timestamp(ts0 + n)
                    .set_for_testing(|t: &mut TestEvent| {
                        t.set_counter(n);
                        t.set_seq_value(v);
                        t.set_str(filler);
                    });
            });
        });
    }
    let elapsed = started.elapsed();
    session.stop_blocking();
    // The callback must be 'static (the SDK may call it from its thread).
    let sink = Arc::new(Mutex::new(Vec::new()));
    let into = sink.clone();
    session.read_trace_blocking(move |data, _end| {
        if let Ok(mut t) = into.lock() {
            t.extend_from_slice(data);
        }
    });
    let trace = std::mem::take(&mut *sink.lock().expect("trace lock"));
    let decoded = perfetto_protos::trace::Trace::parse_from_bytes(&trace).expect("trace decodes");
    let packet_bytes = producer_bytes_per_packet(&trace);
    let mut kept = Kept::default();
    let ours = decoded.packet.iter().filter(|p| p.has_for_testing());
    kept.dropped_marks = ours.clone().filter(|p| p.previous_packet_dropped()).count() as u64;
    runs_of(ours.map(|p| p.for_testing().counter()), &mut kept);
    // The service's own counters (the last TraceStats is the final one).
    let stats = decoded
        .packet
        .iter()
        .filter(|p| p.has_trace_stats())
        .map(|p| p.trace_stats())
        .next_back();
    let mut loss = String::from("no TraceStats");
    let mut reached_bytes = 0;
    if let Some(ts) = stats
        && let Some(b) = ts.buffer_stats.first()
    {
        kept.buffer_bytes = b.bytes_read();
        reached_bytes = b.bytes_written();
        loss = format!(
            "written {} B, overwritten {} B, read {} B; chunks_discarded {} (+{} service), \
             abi_violations {}, trace_writer_packet_loss {}, patches_failed {}, \
             padding {} B",
            b.bytes_written(),
            b.bytes_overwritten(),
            b.bytes_read(),
            b.chunks_discarded(),
            ts.chunks_discarded(),
            b.abi_violations(),
            b.trace_writer_packet_loss(),
            b.patches_failed(),
            b.padding_bytes_written(),
        );
    }
    Side {
        elapsed,
        packets,
        kept,
        loss,
        reached_bytes,
        packet_bytes,
    }
}

fn recorder_run(policy: FillPolicy, filler: &[u8], packets: u64) -> Side {
    let params = BufferParams::new(BUFFER_KB as usize * 1024, policy);
    let buffer = Buffer::new(params).expect("buffer");
    let mut w = buffer.writer(WriterId(2));
    let max_len = max_packet_len(filler.len());
    let mut values = SeqValues::new(1);
    let ts0 = boottime_ns();
    let started = Instant::now();
    for n in 0..packets {
        let v = values.next();
        if let Ok(mut slot) = w.begin_packet(max_len)
            && let Some(len) = encode_test_packet(slot.buf(), 2, ts0 + n, n, v, filler, false)
        {
            slot.commit(len);
        }
    }
    let elapsed = started.elapsed();
    w.flush();
    drop(w);
    // What a write pass would hand to the file, decoded like a bench trace.
    let batch = buffer.take_flush();
    let mut file = Vec::new();
    for it in batch.items() {
        match it {
            FlushItem::Data(d) => file.extend_from_slice(d),
            FlushItem::Loss { writer } => {
                file.extend(recorder::storage::packets::loss_marker(writer.0))
            }
        }
    }
    drop(batch);
    let s = buffer.stats();
    let found: SequenceFound = verify::decode(&file)
        .expect("our buffer decodes")
        .sequences
        .remove(&2)
        .unwrap_or_default();
    let kept = Kept {
        packets: found.packets,
        // Framed bytes plus the chunk padding behind them, pro rata.
        buffer_bytes: found.bytes + s.unused_chunk_bytes * found.packets / s.packets_written.max(1),
        framed: found.bytes,
        first: found.first_counter,
        last: found.last_counter,
        runs: found.runs,
        dropped_marks: found.loss_markers,
    };
    Side {
        elapsed,
        packets,
        kept,
        loss: String::new(),
        reached_bytes: 0,
        packet_bytes: 0.0,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    Producer::init(
        ProducerInitArgsBuilder::new()
            .backends(Backends::IN_PROCESS)
            .build(),
    );
    let mut ds = DataSource::new();
    ds.register(DS_NAME, DataSourceArgsBuilder::new().build())
        .expect("data source registers");
    let ds: &'static DataSource<'static> = Box::leak(Box::new(ds));
    // The same source whose writer waits for shared memory instead of
    // dropping: nothing is lost before Perfetto's buffer, so its bytes per
    // packet are exact.
    let mut stall = DataSource::new();
    stall
        .register(
            DS_STALL,
            DataSourceArgsBuilder::new()
                .buffer_exhausted_policy(DataSourceBufferExhaustedPolicy::StallAndDrop)
                .build(),
        )
        .expect("data source registers");
    let stall: &'static DataSource<'static> = Box::leak(Box::new(stall));

    println!(
        "{:>6}  {:>10}  {:>12}  {:>12}  {:>6}  {:>9}  {:>9}  {:>8}  {:>9}  {:>7}  {:>8}  {:>9}",
        "pkt_B",
        "policy",
        "perfetto/s",
        "recorder/s",
        "ratio",
        "pf_MB/s",
        "rec_MB/s",
        "pf_buf_B",
        "rec_buf_B",
        "buf_ratio",
        "pf_kept%",
        "rec_kept%",
    );
    let mut notes = Vec::new();
    for size in [64usize, 1024] {
        let filler_len = filler_for(size);
        let filler: String = (0..filler_len)
            .map(|i| (b'a' + (i % 26) as u8) as char)
            .collect();
        let packets = (PAYLOAD_BYTES / size) as u64;
        let pf_len = perfetto_packet_len(&filler, packets);
        // What `begin_packet` puts before each of our packets.
        let header = slot_header_bytes(max_packet_len(filler_len));
        for (source, pf_policy, policy, name) in [
            (
                (ds, DS_NAME),
                BufferConfigFillPolicy::RingBuffer,
                FillPolicy::RingBuffer,
                "ring",
            ),
            (
                (ds, DS_NAME),
                BufferConfigFillPolicy::Discard,
                FillPolicy::Discard,
                "discard",
            ),
            (
                (stall, DS_STALL),
                BufferConfigFillPolicy::RingBuffer,
                FillPolicy::RingBuffer,
                "ring+stall",
            ),
        ] {
            let mut pf = Vec::new();
            let mut rec = Vec::new();
            let mut last = None;
            // Warm-up of both sides, then alternate runs so noise hits both.
            perfetto_run(source, pf_policy, &filler, packets / 8);
            recorder_run(policy, filler.as_bytes(), packets / 8);
            for _ in 0..RUNS {
                let p = perfetto_run(source, pf_policy, &filler, packets);
                pf.push(p.packets as f64 / p.elapsed.as_secs_f64());
                let r = recorder_run(policy, filler.as_bytes(), packets);
                rec.push(r.packets as f64 / r.elapsed.as_secs_f64());
                last = Some((p, r));
            }
            let Some((p, r)) = last else { continue };
            let (pps, rps) = (median(pf), median(rec));
            println!(
                "{:>6}  {:>10}  {:>12.0}  {:>12.0}  {:>5.2}x  {:>9.0}  {:>9.0}  {:>8.1}  {:>9.1}  {:>8.3}x  {:>8.1}  {:>9.1}",
                size,
                name,
                pps,
                rps,
                rps / pps,
                pps * size as f64 / 1e6,
                rps * size as f64 / 1e6,
                p.kept.per_packet(),
                r.kept.per_packet(),
                r.kept.per_packet() / p.kept.per_packet(),
                p.kept.packets as f64 * 100.0 / p.packets as f64,
                r.kept.packets as f64 * 100.0 / r.packets as f64,
            );
            notes.push(format!(
                "{size} B {name}, last run of {}: about {:.0}% reached perfetto's buffer, it kept {} \
                 ({} marked dropped; {}), \
                 per packet {:.1} B = {:.1} B TracePacket (as in its trace; {:.1} B encoded \
                 by the SDK alone) + {:.1} B size header and chunk headers; recorder kept {} ({} loss markers), per packet {:.1} B = {} B slot \
                 header + {:.1} B TracePacket + {:.1} B chunk padding",
                p.packets,
                p.reached_bytes as f64 * 100.0 / p.kept.per_packet() / p.packets as f64,
                p.kept.shape(),
                p.kept.dropped_marks,
                p.loss,
                p.kept.per_packet(),
                p.packet_bytes,
                pf_len,
                p.kept.per_packet() - p.packet_bytes,
                r.kept.shape(),
                r.kept.dropped_marks,
                r.kept.per_packet(),
                header,
                r.kept.framed as f64 / r.kept.packets.max(1) as f64 - header as f64,
                (r.kept.buffer_bytes - r.kept.framed) as f64 / r.kept.packets.max(1) as f64,
            ));
        }
    }
    println!();
    for n in notes {
        println!("{n}");
    }
}
