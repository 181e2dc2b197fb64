//! `recorder bench` on a small sweep: the JSON parses, each configuration's
//! trace decodes with the independent decoder, and what the file holds
//! agrees with the retained / overwritten / discarded the JSON reports.

use std::process::Command;

use crate::common::{decode, gaps, recorder_bin, test_counters};

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
