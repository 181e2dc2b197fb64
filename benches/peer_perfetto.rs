//! Side by side with Perfetto's own in-process tracing service (the
//! `perfetto-sdk` crate over the vendored C SDK): the same `for_testing`
//! packets (same fields, same filler), one writer, a 16 MiB RING_BUFFER
//! buffer, 64 MiB of payload per run, through each side's writer API, in
//! the same process and run. Prints packets/s, MB/s, buffer bytes per
//! packet and the ratios.
//!
//! `cargo bench --features peer-perfetto --bench peer_perfetto`
//! (the default build does not depend on the SDK).

use std::time::{Duration, Instant};

use perfetto_sdk::{
    data_source::{DataSource, DataSourceArgsBuilder, TraceContext},
    heap_buffer::HeapBuffer,
    pb_msg::{PbMsg, PbMsgWriter},
    producer::{Backends, Producer, ProducerInitArgsBuilder},
    protos::config::{
        data_source_config::DataSourceConfig,
        trace_config::{TraceConfig, TraceConfigBufferConfig, TraceConfigDataSource},
    },
    protos::trace::{test_event::TestEvent, trace_packet::TracePacket},
    tracing_session::TracingSession,
};
use protobuf::Message;
use recorder::bench::workload::filler_for;
use recorder::clock::boottime_ns;
use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, WriterId};
use recorder::sources::for_testing::{SeqValues, encode_test_packet, max_packet_len};

const BUFFER_KB: u32 = 16 * 1024;
const PAYLOAD_BYTES: usize = 64 * 1024 * 1024;
const RUNS: usize = 5;
const DS_NAME: &str = "recorder.bench.for_testing";

struct Side {
    elapsed: Duration,
    packets: u64,
    /// Buffer bytes used per packet (framing, chunk headers, padding).
    buffer_bytes_per_packet: f64,
}

fn session_config() -> Vec<u8> {
    let writer = PbMsgWriter::new();
    let hb = HeapBuffer::new(writer.stream_writer());
    let mut msg = PbMsg::new(&writer).expect("a fresh message");
    {
        let mut cfg = TraceConfig { msg: &mut msg };
        cfg.set_buffers(|b: &mut TraceConfigBufferConfig| {
            b.set_size_kb(BUFFER_KB);
        });
        cfg.set_data_sources(|d: &mut TraceConfigDataSource| {
            d.set_config(|c: &mut DataSourceConfig| {
                c.set_name(DS_NAME);
            });
        });
    }
    msg.finalize();
    let size = writer.stream_writer().get_written_size();
    let mut out = vec![0u8; size];
    hb.copy_into(&mut out);
    out
}

fn perfetto_run(ds: &DataSource<'static>, filler: &str, packets: u64) -> Side {
    let mut session = TracingSession::in_process().expect("in-process session");
    session.setup(&session_config());
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
    let mut trace = Vec::new();
    session.read_trace_blocking(|data, _end| trace.extend_from_slice(data));
    // bytes_written of the buffer, from the service's own trace_stats.
    let decoded = perfetto_protos::trace::Trace::parse_from_bytes(&trace).expect("trace decodes");
    let bytes_written = decoded
        .packet
        .iter()
        .filter(|p| p.has_trace_stats())
        .filter_map(|p| {
            p.trace_stats()
                .buffer_stats
                .first()
                .map(|b| b.bytes_written())
        })
        .max()
        .unwrap_or(0);
    Side {
        elapsed,
        packets,
        buffer_bytes_per_packet: bytes_written as f64 / packets as f64,
    }
}

fn recorder_run(filler: &[u8], packets: u64) -> Side {
    let params = BufferParams::new(BUFFER_KB as usize * 1024, FillPolicy::RingBuffer);
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
    let s = buffer.stats();
    Side {
        elapsed,
        packets,
        buffer_bytes_per_packet: (s.bytes_written + s.padding_bytes_written) as f64
            / s.packets_written.max(1) as f64,
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

    println!(
        "{:>6}  {:>12}  {:>12}  {:>9}  {:>9}  {:>10}  {:>10}  {:>7}",
        "pkt_B",
        "perfetto/s",
        "recorder/s",
        "pf_MB/s",
        "rec_MB/s",
        "pf_buf_B",
        "rec_buf_B",
        "ratio"
    );
    for size in [64usize, 1024] {
        let filler_len = filler_for(size);
        let filler: String = (0..filler_len)
            .map(|i| (b'a' + (i % 26) as u8) as char)
            .collect();
        let packets = (PAYLOAD_BYTES / size) as u64;
        let mut pf = Vec::new();
        let mut rec = Vec::new();
        let (mut pf_buf, mut rec_buf) = (0.0, 0.0);
        // Warm-up of both sides, then alternate runs so noise hits both.
        perfetto_run(ds, &filler, packets / 8);
        recorder_run(filler.as_bytes(), packets / 8);
        for _ in 0..RUNS {
            let p = perfetto_run(ds, &filler, packets);
            pf.push(p.packets as f64 / p.elapsed.as_secs_f64());
            pf_buf = p.buffer_bytes_per_packet;
            let r = recorder_run(filler.as_bytes(), packets);
            rec.push(r.packets as f64 / r.elapsed.as_secs_f64());
            rec_buf = r.buffer_bytes_per_packet;
        }
        let (p, r) = (median(pf), median(rec));
        println!(
            "{:>6}  {:>12.0}  {:>12.0}  {:>9.0}  {:>9.0}  {:>10.1}  {:>10.1}  {:>6.2}x",
            size,
            p,
            r,
            p * size as f64 / 1e6,
            r * size as f64 / 1e6,
            pf_buf,
            rec_buf,
            r / p
        );
    }
}
