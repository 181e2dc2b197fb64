//! linux.ftrace pieces shared by its tests: the captured fixtures and their
//! encoding, the bundles and events of a trace, a pipe ping-pong to record,
//! and the lock that keeps real-kernel tests one at a time.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use perfetto_protos::ftrace_event::FtraceEvent;
use perfetto_protos::ftrace_event_bundle::FtraceEventBundle;
use perfetto_protos::trace::Trace;
use perfetto_protos::trace_packet::TracePacket;
use protobuf::Message;

use recorder::sources::ftrace::encode::{BundleEncoder, CpuCursor};
use recorder::sources::ftrace::event_table::EventTable;
use recorder::sources::ftrace::format::PageLayout;
use recorder::sources::ftrace::tracefs::Tracefs;
use recorder::sources::ftrace::{
    FtraceSource, PrintFilter, VecOutput, load_layouts, resolve_event, subbuf,
};

pub const SEQ: u32 = 7;

/// Compact scheduling and task events with a process scan, streamed every
/// 200 ms for `duration_ms`: what segment tests cut and resolve threads in.
pub fn sched_stream_config(duration_ms: u32) -> String {
    format!(
        r#"
buffers {{ size_kb: 16384 fill_policy: RING_BUFFER }}
data_sources {{ config {{ name: "linux.ftrace" target_buffer: 0 ftrace_config {{
  ftrace_events: "sched/sched_switch" ftrace_events: "sched/sched_waking"
  ftrace_events: "task/task_newtask" ftrace_events: "task/task_rename"
  compact_sched {{ enabled: true }} drain_period_ms: 100 }} }} }}
data_sources {{ config {{ name: "linux.process_stats" target_buffer: 0
  process_stats_config {{ scan_all_processes_on_start: true }} }} }}
write_into_file: true file_write_period_ms: 200 duration_ms: {duration_ms}
"#
    )
}

pub fn fixtures() -> PathBuf {
    super::repo_root().join("tests/fixtures/ftrace")
}

pub fn raw(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join(name)).expect("fixture readable")
}

pub fn fixture_table(compact: bool) -> (PageLayout, EventTable) {
    let t = Tracefs::at(fixtures().join("tree")).expect("fixture tree");
    let mut evs = Vec::new();
    for g in t.groups() {
        evs.extend(resolve_event(&t, &format!("{g}/*")));
    }
    let (l, table, failed) = load_layouts(&t, &evs, compact).expect("layouts");
    assert!(failed.is_empty(), "{failed:?}");
    (l, table)
}

pub fn encode(
    pages: &[u8],
    compact: bool,
    filter: &PrintFilter,
) -> (Vec<TracePacket>, BundleEncoder) {
    let (l, table) = fixture_table(compact);
    let mut out = VecOutput::new();
    let mut enc = BundleEncoder::new(SEQ, 16 * 1024);
    let mut cur = CpuCursor {
        cpu: 3,
        ..Default::default()
    };
    enc.encode_pages(&mut out, &table, filter, &l, &mut cur, pages);
    (decode(&out.bytes), enc)
}

pub fn decode(bytes: &[u8]) -> Vec<TracePacket> {
    Trace::parse_from_bytes(bytes)
        .expect("independent decoder parses the trace")
        .packet
}

pub fn bundles(p: &[TracePacket]) -> Vec<&FtraceEventBundle> {
    p.iter()
        .filter(|p| p.has_ftrace_events())
        .map(|p| p.ftrace_events())
        .collect()
}

pub fn events(p: &[TracePacket]) -> Vec<FtraceEvent> {
    bundles(p)
        .iter()
        .flat_map(|b| b.event.iter().cloned())
        .collect()
}

/// The real-kernel tests compare tracefs before and after: one at a time.
pub static KERNEL: Mutex<()> = Mutex::new(());

/// Two threads bounce a byte over a pair of pipes; returns their tids.
pub fn ping_pong(rounds: usize) -> (i32, i32) {
    ping_pong_with(rounds, false)
}

/// Runs `work` on a thread of its own while this one hosts `src`'s reader
/// (its drains, its watermark), as the event loop does; `work`'s result.
pub fn while_driven<O, R>(src: &mut FtraceSource<O>, work: impl FnOnce() -> R + Send) -> R
where
    O: recorder::sources::ftrace::PacketOutput + 'static,
    R: Send,
{
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let w = s.spawn(|| {
            let r = work();
            done.store(true, std::sync::atomic::Ordering::Release);
            r
        });
        src.drive_until(&done, Duration::from_millis(10));
        w.join().expect("work")
    })
}

/// [`ping_pong`]; with `wake_sleeper`, each ping waits until the other
/// thread sleeps in its read, so that every ping wakes it (on a loaded
/// machine a preempted thread is still runnable, and waking it is no
/// wake-up the kernel reports).
pub fn ping_pong_with(rounds: usize, wake_sleeper: bool) -> (i32, i32) {
    let (r1, w1) = rustix::pipe::pipe().expect("pipe");
    let (r2, w2) = rustix::pipe::pipe().expect("pipe");
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        let _ = tx.send(tid);
        let mut b = [0u8; 1];
        for _ in 0..rounds {
            rustix::io::read(&r1, &mut b).expect("read");
            rustix::io::write(&w2, &b).expect("write");
        }
        tid
    });
    let pong = rx.recv().expect("pong thread's tid");
    let stat = format!("/proc/self/task/{pong}/stat");
    let asleep = || {
        std::fs::read_to_string(&stat)
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('S')))
            .unwrap_or(true)
    };
    let me = rustix::thread::gettid().as_raw_nonzero().get();
    let mut b = [1u8; 1];
    for _ in 0..rounds {
        if wake_sleeper {
            let t0 = std::time::Instant::now();
            while !asleep() && t0.elapsed() < Duration::from_millis(200) {
                std::thread::yield_now();
            }
        }
        rustix::io::write(&w1, &b).expect("write");
        rustix::io::read(&r2, &mut b).expect("read");
    }
    (me, t.join().expect("pong thread"))
}

/// Why this kernel refuses `buffer_subbuf_size_kb` writes, if it does
/// (asked once, on an instance of the probe's own: some kernels refuse it
/// with EPERM even on a new instance and for the size it already has).
/// Then the recorder's own choice falls back to the kernel's size; tests
/// that need the write skip, saying so — the kernel's policy, not a missing
/// feature, so not a failure under RECORDER_REQUIRE_KERNEL.
pub fn subbuf_refused(top: &Tracefs) -> Option<String> {
    static ANSWER: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ANSWER
        .get_or_init(|| match subbuf::probe(top) {
            Some(subbuf::Settable::Refused(why)) => {
                Some(format!("this kernel refuses buffer_subbuf_size_kb ({why})"))
            }
            _ => None,
        })
        .clone()
}
