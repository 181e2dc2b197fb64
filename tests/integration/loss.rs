//! Loss agrees: on lossy runs (RING_BUFFER overwrite while streaming, a full
//! DISCARD buffer, DISCARD while streaming) the summary on stderr, `recorder
//! inspect`, the trace's own `trace_stats` and Perfetto's trace processor
//! report the same loss. (Kernel overruns: `ftrace::kernel_loss_is_reported_in_the_summary`.)

use crate::harness::*;
use std::collections::BTreeMap;

/// One lossy run and every view of it.
struct Lossy {
    run: Run,
    summary: String,
    inspect: serde_json::Value,
    packets: Vec<perfetto_protos::trace_packet::TracePacket>,
}

fn record(config: &str) -> Lossy {
    let run = Run::new(config);
    let out = run.run("auto");
    let summary = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{summary}");
    let inspect = std::process::Command::new(recorder_bin())
        .args(["inspect", "--json"])
        .arg(&run.out)
        .output()
        .expect("inspect runs");
    assert!(inspect.status.success());
    let inspect = serde_json::from_slice(&inspect.stdout).expect("json");
    let packets = decode(&run.trace());
    Lossy {
        run,
        summary,
        inspect,
        packets,
    }
}

impl Lossy {
    fn last_stats(&self) -> perfetto_protos::trace_stats::TraceStats {
        self.packets
            .iter()
            .rev()
            .find(|p| p.has_trace_stats())
            .expect("trace_stats")
            .trace_stats()
            .clone()
    }

    /// The summary's lines about buffer `i` (its header and the loss lines).
    fn summary_of(&self, i: usize) -> String {
        let head = format!("  buffer {i} (");
        let mut lines = self.summary.lines().skip_while(|l| !l.starts_with(&head));
        let mut out = lines.next().expect("the buffer's line").to_string();
        for l in lines.take_while(|l| l.starts_with("    ")) {
            out.push('\n');
            out.push_str(l);
        }
        out
    }

    /// The packets the summary says buffer `i` lost (overwritten plus
    /// discarded), and its lines.
    fn summary_lost_packets(&self, i: usize) -> (u64, String) {
        let s = self.summary_of(i);
        let n = s
            .lines()
            .filter_map(|l| {
                let (_, rest) = l.split_once(" (")?;
                let (n, kind) = rest.split_once(" packets, ")?;
                (kind.starts_with("RING_BUFFER") || kind.starts_with("DISCARD"))
                    .then(|| n.parse::<u64>().expect("a count"))
            })
            .sum();
        (n, s)
    }

    /// Packets each test sequence is missing of `sent`, by the independent
    /// decoder.
    fn missing(&self, sent: u64) -> BTreeMap<u32, u64> {
        test_counters(&self.packets)
            .into_iter()
            .map(|(seq, c)| {
                gaps(&c);
                (seq, sent - c.len() as u64)
            })
            .collect()
    }

    /// The same stats in the trace (independent decoder), in inspect and in
    /// trace processor, for buffer `i`; returns the trace's BufferStats.
    fn stats_agree(&self, i: usize) -> perfetto_protos::trace_stats::trace_stats::BufferStats {
        let b = self.last_stats().buffer_stats[i].clone();
        let ins = &self.inspect["last_trace_stats"]["buffers"][i];
        for (name, v) in [
            ("bytes_written", b.bytes_written()),
            ("bytes_overwritten", b.bytes_overwritten()),
            ("chunks_overwritten", b.chunks_overwritten()),
            ("chunks_discarded", b.chunks_discarded()),
            ("trace_writer_packet_loss", b.trace_writer_packet_loss()),
        ] {
            assert_eq!(ins[name].as_u64(), Some(v), "inspect: buffer {i} {name}");
        }
        if let Some(tp) = trace_processor::check(&self.run.out) {
            for (name, v) in [
                ("traced_buf_bytes_overwritten", b.bytes_overwritten()),
                ("traced_buf_chunks_overwritten", b.chunks_overwritten()),
                ("traced_buf_chunks_discarded", b.chunks_discarded()),
            ] {
                assert_eq!(
                    tp.stat(name, Some(i as i64)),
                    v as i64,
                    "trace processor: {name}[{i}]"
                );
            }
        }
        b
    }

    /// Loss markers per sequence, as inspect counts them.
    fn inspect_losses(&self) -> BTreeMap<u32, u64> {
        self.inspect["by_sequence"]
            .as_object()
            .expect("sequences")
            .iter()
            .map(|(k, v)| (k.parse().expect("id"), v["losses"].as_u64().expect("n")))
            .collect()
    }
}

const SENT: u64 = 20_000;

fn lossy_config(policy: &str, extra: &str) -> String {
    test_config(
        256,
        policy,
        extra,
        // 20 000 packets of 200 B over a second: 4 MB/s against 256 KiB.
        &format!("message_count: {SENT} message_size: 200 max_messages_per_second: 20000"),
    )
}

#[test]
fn ring_overwrite_while_streaming_agrees_everywhere() {
    let l = record(&lossy_config(
        "RING_BUFFER",
        "duration_ms: 2000 write_into_file: true file_write_period_ms: 500",
    ));
    let b = l.stats_agree(0);
    assert!(b.bytes_overwritten() > 0, "a 256 KiB ring overflows");
    let (lost, s) = l.summary_lost_packets(0);
    let missing: u64 = l.missing(SENT).values().sum();
    assert_eq!(
        lost, missing,
        "summary vs the packets missing from the file:\n{s}"
    );
    assert!(
        s.contains(&format!(
            "{} overwritten (",
            recorder::bytes::HumanBytes(b.bytes_overwritten())
        )),
        "summary vs trace_stats:\n{s}"
    );
    // Every gap in a sequence carries a loss marker, as inspect counts them.
    let losses = l.inspect_losses();
    for (seq, c) in test_counters(&l.packets) {
        let (inner, before) = gaps(&c);
        if inner + before > 0 {
            assert!(losses[&seq] > 0, "sequence {seq} lost data unmarked");
        }
    }
}

#[test]
fn a_full_discard_buffer_agrees_everywhere() {
    let l = record(&lossy_config("DISCARD", "duration_ms: 2000"));
    let b = l.stats_agree(0);
    assert!(b.chunks_discarded() > 0, "a 256 KiB DISCARD buffer fills");
    let (lost, s) = l.summary_lost_packets(0);
    let missing: u64 = l.missing(SENT).values().sum();
    assert_eq!(
        lost, missing,
        "summary vs the packets missing from the file:\n{s}"
    );
    assert!(s.contains("DISCARD: the buffer was full"), "{s}");
    // DISCARD keeps the oldest: every sequence starts at 0.
    for c in test_counters(&l.packets).values() {
        assert_eq!(gaps(c).1, 0);
    }
}

#[test]
fn discard_while_streaming_agrees_everywhere() {
    let l = record(&lossy_config(
        "DISCARD",
        "duration_ms: 2000 write_into_file: true file_write_period_ms: 200",
    ));
    let b = l.stats_agree(0);
    assert!(b.chunks_discarded() > 0);
    let (lost, s) = l.summary_lost_packets(0);
    let missing: u64 = l.missing(SENT).values().sum();
    assert_eq!(
        lost, missing,
        "summary vs the packets missing from the file:\n{s}"
    );
    // Trace processor warns about write_into_file with DISCARD (data_loss,
    // not an error): `check` expects exactly that row.
    if let Some(tp) = trace_processor::open(&l.run.out) {
        assert_eq!(tp.stat("config_write_into_file_discard", Some(0)), 1);
    }
}

/// Trace processor's own loss figure, `traced_buf_sequence_packet_loss`
/// (data_loss): one per gap inside a sequence, attributed to the buffer the
/// sequence writes into through the trace_stats WriterStats. It agrees with
/// inspect's loss markers, and is there whenever the summary reports loss
/// inside a sequence.
#[test]
fn buffer_loss_is_a_data_loss_row_in_trace_processor() {
    for config in [
        lossy_config(
            "RING_BUFFER",
            "duration_ms: 2000 write_into_file: true file_write_period_ms: 500",
        ),
        lossy_config("DISCARD", "duration_ms: 2000"),
        lossy_config(
            "DISCARD",
            "duration_ms: 2000 write_into_file: true file_write_period_ms: 200",
        ),
    ] {
        let l = record(&config);
        let want = trace_processor::Expected::of(&l.run.trace());
        assert!(
            !want.writer_buffers.is_empty(),
            "trace_stats names each sequence's buffer"
        );
        // Loss markers after each sequence's first packet: inspect's count,
        // less a marker that opens a sequence.
        let mut firsts: BTreeMap<u32, bool> = BTreeMap::new();
        for p in &l.packets {
            if p.has_trusted_packet_sequence_id() {
                firsts
                    .entry(p.trusted_packet_sequence_id())
                    .or_insert(p.previous_packet_dropped());
            }
        }
        let inner: u64 = l
            .inspect_losses()
            .iter()
            .map(|(seq, n)| n - u64::from(firsts.get(seq).copied().unwrap_or(false)))
            .sum();
        assert!(inner > 0, "loss inside the sequences");
        let Some(tp) = trace_processor::check(&l.run.out) else {
            return;
        };
        assert_eq!(
            tp.stat("traced_buf_sequence_packet_loss", Some(0)) as u64,
            inner,
            "trace processor vs inspect"
        );
    }
}

/// 40 data sources, one packet each, into a 1 MiB buffer (fewer 64 KiB
/// regions than sources): every packet is kept, under both policies, and
/// the trace, inspect, trace processor and the summary say nothing was lost.
fn forty_sources_one_packet_each(policy: &str) {
    const SOURCES: usize = 40;
    let source = r#"
data_sources {
  config {
    name: "for_testing"
    target_buffer: 0
    for_testing { message_count: 1 message_size: 200 }
  }
}"#;
    let config = format!(
        "buffers {{ size_kb: 1024 fill_policy: {policy} }}\n{}\nduration_ms: 500\n",
        source.repeat(SOURCES)
    );
    let l = record(&config);
    let b = l.stats_agree(0);
    assert_eq!(b.chunks_discarded(), 0, "{}", l.summary);
    let counters = test_counters(&l.packets);
    assert_eq!(counters.len(), SOURCES, "a sequence per source");
    assert!(
        counters.values().all(|c| c.len() == 1),
        "one packet from each source"
    );
    assert!(l.summary_of(0).contains("nothing lost"), "{}", l.summary);
}

#[test]
fn forty_sources_into_a_small_ring_buffer_keep_every_packet() {
    forty_sources_one_packet_each("RING_BUFFER");
}

#[test]
fn forty_sources_into_a_small_discard_buffer_keep_every_packet() {
    forty_sources_one_packet_each("DISCARD");
}
