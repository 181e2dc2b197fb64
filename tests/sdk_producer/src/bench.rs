//! `sdk_producer bench`: one data source writing `for_testing` packets of
//! one size as fast as it can, into a tracing service chosen by
//! `--backend`: `system` (whatever listens on the producer socket: the
//! recorder, or traced) or `in-process` (Perfetto's own service, run by the
//! SDK inside this process). The writing loop is the same code for both, so
//! is the shared memory size; the in-process session gets the buffer size
//! and fill policy the system side's config has.
//!
//! `sdk_producer bench --backend system|in-process --size BYTES --packets N
//!                     [--shmem-kb KB] [--buffer-kb KB] [--fill discard|ring]
//!                     [--out TRACE] [--wait-secs S]`
//!
//! Prints, one fact a line (scripts/bench_producer.py reads them):
//! `started`, `packet_bytes B filler F`, `wrote N secs S` (the writing loop
//! alone, from the first packet to the flush of the last), preceded by the
//! CPU every thread of this process used in the loop, `during TID NAME
//! CPU_S` (in-process: the service runs on the SDK's own thread, which this
//! names); then the same from the loop to the end, after the stop (and the
//! read-out of the trace, in-process), `thread TID NAME CPU_S`, and
//! `stopped` or `timed out`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use perfetto_sdk::{
    data_source::{DataSource, DataSourceArgsBuilder, TraceContext},
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

/// The data source the benchmark config names.
pub const DS_NAME: &str = "recorder.bench.sdk";
/// A boot-time-like timestamp base (about 17 minutes), so the varint is the
/// width real ones have.
const TS_BASE: u64 = 1_000_000_000_000;

#[derive(Clone, Copy, PartialEq)]
enum Backend {
    System,
    InProcess,
}

struct Args {
    backend: Backend,
    size: usize,
    packets: u64,
    shmem_kb: u32,
    buffer_kb: u32,
    ring: bool,
    out: Option<String>,
    wait: Duration,
}

fn args(mut it: impl Iterator<Item = String>) -> Args {
    let mut a = Args {
        backend: Backend::System,
        size: 64,
        packets: 100_000,
        shmem_kb: 0,
        buffer_kb: 64 * 1024,
        ring: false,
        out: None,
        wait: Duration::from_secs(60),
    };
    while let Some(k) = it.next() {
        let mut v = || it.next().expect("a value after the flag");
        match k.as_str() {
            "--backend" => {
                a.backend = match v().as_str() {
                    "system" => Backend::System,
                    "in-process" => Backend::InProcess,
                    b => panic!("--backend system|in-process, not {b}"),
                }
            }
            "--size" => a.size = v().parse().expect("--size BYTES"),
            "--packets" => a.packets = v().parse().expect("--packets N"),
            "--shmem-kb" => a.shmem_kb = v().parse().expect("--shmem-kb KB"),
            "--buffer-kb" => a.buffer_kb = v().parse().expect("--buffer-kb KB"),
            "--fill" => {
                a.ring = match v().as_str() {
                    "ring" => true,
                    "discard" => false,
                    f => panic!("--fill discard|ring, not {f}"),
                }
            }
            "--out" => a.out = Some(v()),
            "--wait-secs" => a.wait = Duration::from_secs(v().parse().expect("--wait-secs S")),
            other => panic!("unknown argument {other}"),
        }
    }
    if a.backend == Backend::InProcess {
        assert!(a.out.is_some(), "--backend in-process needs --out TRACE");
    }
    a
}

/// Writes one benchmark packet through the SDK's generated message code.
fn fill(p: &mut TracePacket, n: u64, filler: &str) {
    p.set_timestamp(TS_BASE + n)
        .set_for_testing(|t: &mut TestEvent| {
            t.set_counter(n);
            t.set_str(filler);
        });
}

/// Bytes the SDK encodes for packet `n` with `filler`.
fn encoded_len(n: u64, filler: &str) -> usize {
    let writer = PbMsgWriter::new();
    let _hb = HeapBuffer::new(writer.stream_writer());
    let mut msg = PbMsg::new(&writer).expect("a fresh message");
    fill(&mut TracePacket { msg: &mut msg }, n, filler);
    msg.finalize();
    writer.stream_writer().get_written_size()
}

/// The filler that makes a mid-run packet `size` bytes (or just under, when
/// a length varint grows by a byte at that size).
fn filler_for(size: usize, packets: u64) -> String {
    let n = packets / 2;
    let mut len = size.saturating_sub(encoded_len(n, ""));
    while len > 0 && encoded_len(n, &"a".repeat(len)) > size {
        len -= 1;
    }
    (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect()
}

fn trace_config(buffer_kb: u32, ring: bool) -> Vec<u8> {
    let writer = PbMsgWriter::new();
    let hb = HeapBuffer::new(writer.stream_writer());
    let mut msg = PbMsg::new(&writer).expect("a fresh message");
    {
        let mut cfg = TraceConfig { msg: &mut msg };
        cfg.set_buffers(|b: &mut TraceConfigBufferConfig| {
            b.set_size_kb(buffer_kb);
            b.set_fill_policy(if ring {
                BufferConfigFillPolicy::RingBuffer
            } else {
                BufferConfigFillPolicy::Discard
            });
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

/// CPU seconds of every thread of this process so far, by tid, with its
/// name (`se.sum_exec_runtime` in /proc/self/task/TID/sched: nanosecond
/// resolution where `stat`'s ticks are 10 ms).
fn thread_cpu() -> Vec<(u32, String, f64)> {
    let mut v = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return v;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let path = e.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let sched = std::fs::read_to_string(path.join("sched")).unwrap_or_default();
        let ms = sched
            .lines()
            .find(|l| l.starts_with("se.sum_exec_runtime"))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|x| x.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        v.push((tid, name.trim().to_string(), ms / 1e3));
    }
    v
}

/// Thread `tid`'s CPU seconds in a [`thread_cpu`] sample (0: not there).
fn cpu_of(sample: &[(u32, String, f64)], tid: u32) -> f64 {
    sample
        .iter()
        .find(|(t, _, _)| *t == tid)
        .map_or(0.0, |s| s.2)
}

pub fn main(it: impl Iterator<Item = String>) {
    let a = args(it);
    Producer::init(
        ProducerInitArgsBuilder::new()
            .backends(match a.backend {
                Backend::System => Backends::SYSTEM,
                Backend::InProcess => Backends::IN_PROCESS,
            })
            .shmem_size_hint_kb(a.shmem_kb)
            .build(),
    );
    let started = Arc::new(AtomicBool::new(false));
    let stopped = Arc::new(AtomicBool::new(false));
    let (s1, s2) = (started.clone(), stopped.clone());
    let mut ds = DataSource::new();
    ds.register(
        DS_NAME,
        DataSourceArgsBuilder::new()
            .on_start(move |_, _| s1.store(true, Ordering::SeqCst))
            .on_stop(move |_, _| s2.store(true, Ordering::SeqCst))
            .build(),
    )
    .expect("register the data source");

    let mut session = match a.backend {
        Backend::System => None,
        Backend::InProcess => {
            let mut s = TracingSession::in_process().expect("in-process session");
            s.setup(&trace_config(a.buffer_kb, a.ring));
            s.start_blocking();
            Some(s)
        }
    };
    let t0 = Instant::now();
    while !started.load(Ordering::SeqCst) {
        if t0.elapsed() > a.wait {
            crate::say("never started");
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    crate::say("started");
    let filler = filler_for(a.size, a.packets);
    crate::say(&format!(
        "packet_bytes {} filler {}",
        encoded_len(a.packets / 2, &filler),
        filler.len()
    ));

    let before = thread_cpu();
    let t = Instant::now();
    for n in 0..a.packets {
        ds.trace(|ctx: &mut TraceContext| {
            ctx.add_packet(|p: &mut TracePacket| fill(p, n, &filler));
        });
    }
    // Commit the chunk this thread still holds.
    ds.trace(|ctx: &mut TraceContext| ctx.flush(|| {}));
    let secs = t.elapsed().as_secs_f64();
    // CPU while writing, before the stop and the read-out (Perfetto's
    // in-process read-out is much dearer than its recording).
    for (tid, name, cpu) in thread_cpu() {
        crate::say(&format!(
            "during {tid} {name} {:.6}",
            cpu - cpu_of(&before, tid)
        ));
    }
    crate::say(&format!("wrote {} secs {secs:.6}", a.packets));

    if let (Some(s), Some(out)) = (session.as_mut(), &a.out) {
        s.stop_blocking();
        let file = File::create(out).expect("create the trace file");
        let sink = Arc::new(Mutex::new(BufWriter::with_capacity(1 << 20, file)));
        let into = sink.clone();
        // The callback runs on the SDK's thread; the service's copy-out is
        // its cost, the file write this process's.
        s.read_trace_blocking(move |data, _more| {
            into.lock()
                .expect("trace file lock")
                .write_all(data)
                .expect("write the trace");
        });
        sink.lock()
            .expect("trace file lock")
            .flush()
            .expect("write the trace");
    }
    let t1 = Instant::now();
    while session.is_none() && !stopped.load(Ordering::SeqCst) && t1.elapsed() < a.wait {
        std::thread::sleep(Duration::from_millis(2));
    }
    for (tid, name, cpu) in thread_cpu() {
        crate::say(&format!(
            "thread {tid} {name} {:.6}",
            cpu - cpu_of(&before, tid)
        ));
    }
    drop(session);
    crate::say(if stopped.load(Ordering::SeqCst) {
        "stopped"
    } else {
        "timed out"
    });
}
