//! Config loading latency (start-up cost): our long_trace.cfg and Perfetto's
//! ftrace.cfg (235 events), as text and as binary, each loaded and validated.
//!
//! `cargo bench --bench config`. Perfetto's configs are read from
//! `$RECORDER_PERFETTO_TEST_CONFIGS` (a directory of Perfetto's own test
//! configs); without it only long_trace is measured.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use recorder::config::{self, LoadOptions};

fn perfetto_configs() -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var_os("RECORDER_PERFETTO_TEST_CONFIGS")?);
    p.is_dir().then_some(p)
}

fn bench(c: &mut Criterion) {
    let mut inputs = vec![(
        "long_trace",
        std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("configs/long_trace.cfg"))
            .expect("configs/long_trace.cfg"),
    )];
    match perfetto_configs() {
        Some(dir) => inputs.push((
            "perfetto_ftrace",
            std::fs::read(dir.join("ftrace.cfg")).expect("ftrace.cfg"),
        )),
        None => eprintln!("Perfetto test configs not found: benchmarking long_trace only"),
    }
    let mut g = c.benchmark_group("config_load");
    for (name, text) in &inputs {
        let binary = config::load_bytes(text, name, LoadOptions::default())
            .expect("loads")
            .bytes;
        g.bench_function(format!("{name}/text"), |b| {
            b.iter(|| {
                let l = config::load_bytes(black_box(text), name, LoadOptions::default())
                    .expect("loads");
                black_box(l.validate().expect("valid"))
            })
        });
        g.bench_function(format!("{name}/binary"), |b| {
            b.iter(|| {
                let l = config::load_bytes(black_box(&binary), name, LoadOptions::default())
                    .expect("loads");
                black_box(l.validate().expect("valid"))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
