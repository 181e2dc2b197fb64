//! A Perfetto SDK app, as users write them, for the integration tests: the
//! system backend (it finds the tracing service by the producer socket path,
//! `PERFETTO_PRODUCER_SOCK_NAME` or the default), a custom data source whose
//! packets carry a sequence number (`for_testing.counter`), and `track_event`
//! slices and a counter with the same number.
//!
//! `sdk_producer [--ds NAME] [--packets N] [--payload BYTES] [--forever]
//!               [--trigger NAME] [--wait-secs S] [--shmem-kb KB] [--on-flush]
//!               [--no-commit] [--interval-ms MS] [--linger-secs S] [--mark]`
//!
//! With `--on-flush` the data source handles flushes (so the service sends it
//! Flush requests) and prints `flushed` for each.
//!
//! With `--no-commit` the app never flushes its writers: what it wrote stays
//! in its open chunks until they fill (the service sees it only by scraping
//! them). `--interval-ms` paces the loop; `--linger-secs` keeps the app alive
//! that long after its data source stopped, without tracing, so its writers
//! are not destroyed (which would commit their chunks) while the service
//! finishes.
//!
//! With `--mark`, each packet's `for_testing.str` names the instance it was
//! written for, from the config that instance was set up with:
//! `session <tracing_session_id> buffer <target_buffer>` (a service that
//! runs several sessions sets up one instance for each).
//!
//! Prints `started` when the data source starts, `config <hex>` with the
//! config bytes it was set up with, `audio_config …` when they carry the
//! example custom field (configs/custom/acme/audio.proto), `wrote N` after the
//! last packet, and exits when the data source stops (or after `--wait-secs`).
//!
//! `sdk_producer bench …` is the benchmark mode (see [`bench`]).

mod bench;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use perfetto_sdk::{
    data_source::{DataSource, DataSourceArgsBuilder, TraceContext},
    producer::{Backends, Producer, ProducerInitArgsBuilder},
    protos::trace::{test_event::TestEvent, trace_packet::TracePacket},
    track_event::{
        EventContext, TrackEvent, TrackEventCounter, TrackEventDebugArg, TrackEventTrack,
    },
    track_event_begin, track_event_categories, track_event_counter, track_event_end,
};

track_event_categories! {
    pub mod sdk_producer_te {
        ( "recorder_test", "Slices of the recorder's SDK producer test", [] ),
    }
}
use sdk_producer_te as perfetto_te_ns;

/// This app's own config fields, as prost generates them from
/// configs/custom/acme/audio.proto (the fields it reads).
#[derive(Clone, PartialEq, prost::Message)]
struct AudioConfig {
    #[prost(uint32, optional, tag = "1")]
    sample_rate_hz: Option<u32>,
    #[prost(int32, repeated, packed = "false", tag = "4")]
    taps: Vec<i32>,
}

/// The service's fields of a DataSourceConfig that `--mark` writes.
#[derive(Clone, PartialEq, prost::Message)]
struct ServiceFields {
    #[prost(uint32, optional, tag = "2")]
    target_buffer: Option<u32>,
    #[prost(uint64, optional, tag = "4")]
    tracing_session_id: Option<u64>,
}

/// The DataSourceConfig as this app sees it: only its own extension.
#[derive(Clone, PartialEq, prost::Message)]
struct OwnConfig {
    #[prost(message, optional, tag = "10000001")]
    audio_config: Option<AudioConfig>,
}

struct Args {
    ds: String,
    packets: u64,
    payload: usize,
    forever: bool,
    trigger: Option<String>,
    wait: Duration,
    shmem_kb: u32,
    on_flush: bool,
    no_commit: bool,
    interval: Duration,
    linger: Duration,
    mark: bool,
}

fn args() -> Args {
    let mut a = Args {
        ds: "recorder.test.sequence".into(),
        packets: 1000,
        payload: 16,
        forever: false,
        trigger: None,
        wait: Duration::from_secs(60),
        shmem_kb: 0,
        on_flush: false,
        no_commit: false,
        interval: Duration::ZERO,
        linger: Duration::ZERO,
        mark: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().expect("a value after the flag");
        match k.as_str() {
            "--ds" => a.ds = v(),
            "--packets" => a.packets = v().parse().expect("--packets N"),
            "--payload" => a.payload = v().parse().expect("--payload BYTES"),
            "--forever" => a.forever = true,
            "--on-flush" => a.on_flush = true,
            "--no-commit" => a.no_commit = true,
            "--mark" => a.mark = true,
            "--interval-ms" => {
                a.interval = Duration::from_millis(v().parse().expect("--interval-ms MS"))
            }
            "--linger-secs" => {
                a.linger = Duration::from_secs(v().parse().expect("--linger-secs S"))
            }
            "--trigger" => a.trigger = Some(v()),
            "--shmem-kb" => a.shmem_kb = v().parse().expect("--shmem-kb KB"),
            "--wait-secs" => a.wait = Duration::from_secs(v().parse().expect("--wait-secs S")),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn say(s: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}");
    let _ = out.flush();
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("bench") {
        return bench::main(std::env::args().skip(2));
    }
    let a = args();
    Producer::init(
        ProducerInitArgsBuilder::new()
            .backends(Backends::SYSTEM)
            .shmem_size_hint_kb(a.shmem_kb)
            .build(),
    );
    TrackEvent::init();
    perfetto_te_ns::register().expect("track_event categories");

    let started = Arc::new(AtomicBool::new(false));
    let stopped = Arc::new(AtomicBool::new(false));
    let config: Arc<Mutex<Vec<u8>>> = Arc::default();
    let mut ds = DataSource::new();
    // The marker of each instance, by its index (`--mark`).
    let marks: Arc<Mutex<HashMap<u32, String>>> = Arc::default();
    let (s1, s2, c1, m1) = (
        started.clone(),
        stopped.clone(),
        config.clone(),
        marks.clone(),
    );
    let mut ds_args = DataSourceArgsBuilder::new()
        .on_setup(move |inst, cfg, _| {
            *c1.lock().expect("config lock") = cfg.to_vec();
            let f = <ServiceFields as prost::Message>::decode(cfg).unwrap_or_default();
            let mark = format!(
                "session {} buffer {}",
                f.tracing_session_id.unwrap_or(0),
                f.target_buffer.unwrap_or(0)
            );
            m1.lock().expect("marks lock").insert(inst, mark);
        })
        .on_start(move |_, _| s1.store(true, Ordering::SeqCst))
        .on_stop(move |_, _| s2.store(true, Ordering::SeqCst));
    if a.on_flush {
        ds_args = ds_args.on_flush(|_, _| say("flushed"));
    }
    ds.register(&a.ds, ds_args.build())
        .expect("register the data source");

    let t0 = Instant::now();
    while !started.load(Ordering::SeqCst) {
        if t0.elapsed() > a.wait {
            say("never started");
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let hex: String = config
        .lock()
        .expect("config lock")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    say("started");
    say(&format!("config {hex}"));
    let own = <OwnConfig as prost::Message>::decode(config.lock().expect("config lock").as_slice());
    if let Ok(OwnConfig {
        audio_config: Some(audio),
    }) = own
    {
        say(&format!(
            "audio_config sample_rate_hz={} taps={:?}",
            audio.sample_rate_hz.unwrap_or_default(),
            audio.taps
        ));
    }

    let counter = TrackEventTrack::register_counter_track(
        "recorder_test_counter",
        TrackEventTrack::process_track_uuid(),
    )
    .expect("counter track");
    let filler = "x".repeat(a.payload);
    let mut seq: u64 = 0;
    loop {
        if !a.forever && seq >= a.packets {
            break;
        }
        ds.trace(|ctx: &mut TraceContext| {
            let text = if a.mark {
                let marks = marks.lock().expect("marks lock");
                marks.get(&ctx.instance_index()).cloned().unwrap_or_default()
            } else {
                filler.clone()
            };
            ctx.add_packet(|p: &mut TracePacket| {
                p.set_timestamp(1).set_for_testing(|t: &mut TestEvent| {
                    t.set_counter(seq);
                    t.set_str(text.as_str());
                });
            });
        });
        track_event_begin!("recorder_test", "work", |ctx: &mut EventContext| {
            ctx.add_debug_arg("seq", TrackEventDebugArg::Uint64(seq));
        });
        track_event_end!("recorder_test");
        track_event_counter!("recorder_test", |ctx: &mut EventContext| {
            ctx.set_track(&counter);
            ctx.set_counter(TrackEventCounter::Int64(seq as i64));
        });
        seq += 1;
        if a.forever && !a.no_commit {
            ds.trace(|ctx: &mut TraceContext| ctx.flush(|| {}));
            std::thread::sleep(Duration::from_millis(2));
        }
        if !a.interval.is_zero() {
            std::thread::sleep(a.interval);
        }
    }
    if !a.no_commit {
        // Commit what this thread holds: open chunks reach the service at a
        // flush, when full, or when the writer goes.
        ds.trace(|ctx: &mut TraceContext| ctx.flush(|| {}));
        track_event_begin!("recorder_test", "flush", |ctx: &mut EventContext| {
            ctx.set_flush();
        });
        track_event_end!("recorder_test", |ctx: &mut EventContext| {
            ctx.set_flush();
        });
    }
    say(&format!("wrote {seq}"));
    if let Some(t) = &a.trigger {
        Producer::activate_trigger(t, Duration::from_secs(10)).expect("trigger");
        say("triggered");
    }
    let t1 = Instant::now();
    while !stopped.load(Ordering::SeqCst) && t1.elapsed() < a.wait {
        std::thread::sleep(Duration::from_millis(5));
    }
    say(if stopped.load(Ordering::SeqCst) {
        "stopped"
    } else {
        "timed out"
    });
    std::thread::sleep(a.linger);
}
