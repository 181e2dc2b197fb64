//! `recorder bench` on a small sweep: the JSON parses, each configuration's
//! trace decodes with the independent decoder, and what the file holds
//! agrees with the retained / overwritten / discarded the JSON reports.

use crate::harness::*;
use std::process::Command;

#[test]
fn bench_sweep_json_agrees_with_the_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("bench.pftrace");
    let plot = dir.path().join("sweep.svg");
    let run = Command::new(recorder_bin())
        .args([
            "bench",
            "-q",
            "--json",
            "--policy",
            "ring,discard",
            "--buffer-kb",
            "64,1024",
            "--packet-size",
            "64",
            "--writers",
            "2",
            "--packets",
            "60000",
            "--write-period-ms",
            "100",
        ])
        .arg("--output")
        .arg(&out)
        .arg("--plot")
        .arg(&plot)
        .output()
        .expect("recorder runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench failed: {stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is a JSON object"))
        .collect();
    assert_eq!(lines.len(), 4, "2 policies x 2 sizes");
    let svg = std::fs::read_to_string(&plot).expect("plot written");
    assert!(svg.starts_with("<svg") && svg.contains("retained %"));

    for r in &lines {
        let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
        assert!(r["verify"]["ok"].as_bool().expect("verify.ok"), "{r}");
        assert!(["io_uring", "pwritev"].contains(&r["sink"].as_str().expect("sink")));
        let path = r["output"].as_str().expect("output kept");
        let data = std::fs::read(path).expect("trace file");
        let packets = decode(&data);
        let counters = test_counters(&packets);
        assert!(
            counters.keys().all(|k| [2, 3].contains(k)),
            "only the two writers' sequences: {:?}",
            counters.keys()
        );
        let offered = n("offered_packets");
        assert_eq!(offered, 60_000);
        let found: u64 = counters.values().map(|c| c.len() as u64).sum();
        assert_eq!(found, n("packets_retained"), "{r}");
        let mut missing = 0;
        for seq in [2u32, 3] {
            // A writer may lose everything to a tiny DISCARD buffer.
            let Some(c) = counters.get(&seq) else {
                missing += 30_000;
                continue;
            };
            // gaps() also checks order and uniqueness (R2).
            let (inside, before) = gaps(c);
            let last = c.last().copied().unwrap_or(0);
            missing += inside + before + (30_000 - 1 - last);
        }
        let lost = n("packets_overwritten") + n("packets_discarded") + n("packets_refused");
        assert_eq!(missing, lost, "{r}");
        assert_eq!(found + lost, offered, "{r}");
        match r["policy"].as_str() {
            Some("ring") => assert_eq!(n("bytes_discarded") == 0, n("packets_discarded") == 0),
            Some("discard") => assert_eq!(n("packets_overwritten"), 0, "{r}"),
            other => panic!("policy {other:?}"),
        }
        let b = &r["buffers"][0];
        assert!(b["balanced"].as_bool().expect("balanced"));
        assert!(b["min_size_kb"].as_u64().expect("min_size_kb") > 0);
    }
    // The smallest buffer under a 60k-packet burst loses data; the sweep
    // shows it (the loss itself is checked exactly above).
    let retained: Vec<f64> = lines
        .iter()
        .map(|r| r["retained_pct"].as_f64().expect("retained_pct"))
        .collect();
    assert!(retained.iter().all(|p| (0.0..=100.0).contains(p)));
}

#[test]
fn bench_table_and_config_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("bench.cfg");
    std::fs::write(
        &cfg,
        "buffers { size_kb: 512 fill_policy: DISCARD }\n\
         data_sources { config { name: \"for_testing\" target_buffer: 0 \
         for_testing { message_count: 5000 message_size: 100 seed: 7 } } }\n\
         write_into_file: true\nfile_write_period_ms: 200\n",
    )
    .expect("config written");
    let run = Command::new(recorder_bin())
        .args(["bench", "-q", "--config"])
        .arg(&cfg)
        .output()
        .expect("recorder runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let mut lines = stdout.lines();
    assert!(lines.next().expect("sink line").starts_with("sink: "));
    let header = lines.next().expect("header");
    assert!(header.starts_with("#  policy") && header.contains("retained%"));
    let row = lines.next().expect("one row");
    assert!(row.contains("discard") && row.contains("yes"), "{row}");
    assert!(
        row.split_whitespace().any(|c| c == "200"),
        "write period from the config: {row}"
    );
}

/// One sequence as the independent decoder sees it: its `for_testing`
/// counters in file order, whether a `previous_packet_dropped` marker of the
/// sequence came right before each, and whether one follows the last.
struct SequenceView {
    counters: Vec<u64>,
    marked: Vec<bool>,
    trailing_marker: bool,
}

fn sequence_view(packets: &[perfetto_protos::trace_packet::TracePacket], seq: u32) -> SequenceView {
    let mut v = SequenceView {
        counters: Vec::new(),
        marked: Vec::new(),
        trailing_marker: false,
    };
    let mut pending = false;
    for p in packets
        .iter()
        .filter(|p| p.trusted_packet_sequence_id() == seq)
    {
        pending |= p.previous_packet_dropped();
        if p.has_for_testing() {
            v.counters.push(p.for_testing().counter());
            v.marked.push(std::mem::take(&mut pending));
        }
    }
    v.trailing_marker = pending;
    v
}

impl SequenceView {
    /// Every place counters are missing (before the first, between two)
    /// has a loss marker; returns the number of contiguous runs.
    fn runs_all_marked(&self) -> u64 {
        gaps(&self.counters);
        let mut runs = 0;
        // The counter that would continue the stream without loss.
        let mut expect = 0;
        for (i, (c, m)) in self.counters.iter().zip(&self.marked).enumerate() {
            if *c != expect {
                assert!(*m, "gap before counter {c} has no loss marker");
            }
            if i == 0 || *c != expect {
                runs += 1;
            }
            expect = c + 1;
        }
        runs
    }
}

/// [`bench_json`] with RING_BUFFER then DISCARD, each in a 64 KiB buffer.
fn both_policies_in_64k(args: &[&str], out: &std::path::Path) -> Vec<serde_json::Value> {
    let policies = ["--policy", "ring,discard", "--buffer-kb", "64"];
    bench_json(&[&policies[..], args].concat(), out)
}

fn bench_json(args: &[&str], out: &std::path::Path) -> Vec<serde_json::Value> {
    let run = Command::new(recorder_bin())
        .args(["-q", "bench", "--json"])
        .args(args)
        .arg("--output")
        .arg(out)
        .output()
        .expect("recorder runs");
    assert!(
        run.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is a JSON object"))
        .collect()
}

/// With no pass during the writes the file is what the buffer held at the
/// end: RING_BUFFER keeps the newest packets as one run ending at the last
/// one, DISCARD the oldest as one run from counter 0.
#[test]
fn ring_keeps_the_newest_and_discard_the_oldest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lines = both_policies_in_64k(
        &[
            "--packet-size",
            "64",
            "--packets",
            "50000",
            // Longer than the run: only the pass after the writers stop.
            "--write-period-ms",
            "600000",
        ],
        &dir.path().join("kept.pftrace"),
    );
    assert_eq!(lines.len(), 2);
    for r in &lines {
        let v = &r["verify"];
        assert!(v["ok"].as_bool().expect("verify.ok"), "{r}");
        assert_eq!(v["streaming_passes"], 0, "{r}");
        let ret = &v["retention"][0];
        assert_eq!(ret["sequence"], 2);
        let data = std::fs::read(r["output"].as_str().expect("output")).expect("trace");
        let seq = sequence_view(&decode(&data), 2);
        let c = &seq.counters;
        let (first, last) = (c[0], c[c.len() - 1]);
        assert_eq!(seq.runs_all_marked(), 1, "one contiguous run");
        assert!(c.len() < 50_000, "a 64 KiB buffer overflows: {r}");
        assert_eq!(ret["kept"], c.len() as u64);
        assert_eq!(
            (ret["first_kept"].as_u64(), ret["last_kept"].as_u64()),
            (Some(first), Some(last))
        );
        assert_eq!(ret["runs"], 1);
        match r["policy"].as_str() {
            Some("ring") => {
                assert_eq!(last, 49_999, "the newest packet is kept");
                assert!(first > 0 && seq.marked[0], "older ones lost, marked");
                assert_eq!(ret["shape"], "newest");
                assert_eq!(r["packets_overwritten"], first, "{r}");
            }
            Some("discard") => {
                assert_eq!(first, 0, "the oldest packet is kept");
                assert!(
                    last < 49_999 && seq.trailing_marker,
                    "newer ones lost, marked"
                );
                assert_eq!(ret["last_accepted"].as_u64(), Some(last));
                assert_eq!(ret["shape"], "oldest");
                assert_eq!(r["packets_discarded"], 49_999 - last, "{r}");
            }
            other => panic!("policy {other:?}"),
        }
    }
}

/// With passes streaming to the file during the writes, each policy keeps
/// what it promises across the passes: RING_BUFFER's last run ends at the
/// last packet written, DISCARD keeps every accepted packet from the first;
/// every gap is marked in place.
#[test]
fn streaming_passes_keep_marked_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lines = both_policies_in_64k(
        &[
            "--packet-size",
            "1024",
            "--max-rate",
            "--duration",
            "1",
            "--write-period-ms",
            "100",
        ],
        &dir.path().join("stream.pftrace"),
    );
    for r in &lines {
        let v = &r["verify"];
        assert!(v["ok"].as_bool().expect("verify.ok"), "{r}");
        assert!(v["streaming_passes"].as_u64() > Some(0), "{r}");
        let ret = &v["retention"][0];
        let data = std::fs::read(r["output"].as_str().expect("output")).expect("trace");
        let seq = sequence_view(&decode(&data), 2);
        let runs = seq.runs_all_marked();
        assert_eq!(ret["runs"], runs, "{r}");
        let (first, last) = (seq.counters[0], seq.counters[seq.counters.len() - 1]);
        assert!(r["retained_pct"].as_f64() < Some(100.0), "overflowed: {r}");
        match r["policy"].as_str() {
            Some("ring") => {
                assert_eq!(ret["last_accepted"].as_u64(), Some(last), "{r}");
                assert!(!seq.trailing_marker, "nothing lost after the last");
            }
            Some("discard") => {
                assert_eq!(ret["first_accepted"].as_u64(), Some(first), "{r}");
                assert_eq!(ret["accepted"], seq.counters.len() as u64, "{r}");
                assert_eq!(r["packets_overwritten"], 0);
            }
            other => panic!("policy {other:?}"),
        }
    }
}

/// Global flags (`-q`, `-v`) go before or after the subcommand; the main
/// job's own arguments are still refused beside one.
#[test]
fn global_flags_before_or_after_the_subcommand() {
    for args in [
        &["-q", "bench", "--no-output", "--packets", "1000"][..],
        &["bench", "--no-output", "--packets", "1000", "-q"],
        &["-v", "-q", "bench", "--no-output", "--packets", "1000"],
    ] {
        let run = Command::new(recorder_bin())
            .args(args)
            .output()
            .expect("recorder runs");
        assert!(
            run.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(String::from_utf8_lossy(&run.stdout).contains("verified"));
    }
    let run = Command::new(recorder_bin())
        .args(["--config", "x.cfg", "bench"])
        .output()
        .expect("recorder runs");
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("--config"));
}

/// Writers start together: with two writers and room for both, each keeps
/// packets in every run (a writer spawned late used to find the buffer
/// taken); a run this short says so in its warnings, and its rates are per
/// the writers' own time, not the last pass. Paced so that the buffer fills
/// in about 300 ms: unpaced it fills in a few, and a thread the scheduler
/// keeps waiting that long on a loaded machine finds it full, whatever the
/// buffer does.
#[test]
fn writers_start_together_and_short_runs_warn() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..5 {
        let lines = bench_json(
            &[
                "--rate",
                "50000",
                "--writers",
                "2",
                "--policy",
                "discard",
                "--buffer-kb",
                "1024",
                "--packet-size",
                "64",
                "--packets",
                "40000",
                "--write-period-ms",
                "600000",
            ],
            &dir.path().join(format!("short{i}.pftrace")),
        );
        let r = &lines[0];
        assert!(r["verify"]["ok"].as_bool().expect("verify.ok"), "{r}");
        for ret in r["verify"]["retention"].as_array().expect("per writer") {
            assert!(
                ret["kept"].as_u64() > Some(0),
                "run {i}: a writer kept nothing: {r}"
            );
        }
        let warnings = r["warnings"].as_array().expect("warnings");
        assert!(
            warnings
                .iter()
                .any(|w| w.as_str().is_some_and(|w| w.starts_with("short run"))),
            "{r}"
        );
        let (elapsed, wall) = (r["elapsed_s"].as_f64(), r["wall_s"].as_f64());
        assert!(elapsed <= wall, "{r}");
        assert!(r["passes"]["final_ms"].as_f64() > Some(0.0), "{r}");
    }
}
