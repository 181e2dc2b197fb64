//! linux.ftrace: formats and raw pages captured on a real kernel
//! (`tests/fixtures/ftrace/`), bundles decoded with the independent decoder
//! (`perfetto_protos`) and compared field by field, and a real-kernel
//! recording of a pipe ping-pong.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use perfetto_protos::ftrace_event::FtraceEvent;
use perfetto_protos::ftrace_event_bundle::FtraceEventBundle;
use perfetto_protos::trace::Trace;
use perfetto_protos::trace_packet::TracePacket;
use protobuf::Message;

use recorder::config::spec::{ByteSize, FtraceSpec};
use recorder::sources::ftrace::encode::{BundleEncoder, CpuCursor};
use recorder::sources::ftrace::event_table::EventTable;
use recorder::sources::ftrace::format::PageLayout;
use recorder::sources::ftrace::page::build::PageBuilder;
use recorder::sources::ftrace::page::{EventIter, parse_header};
use recorder::sources::ftrace::stats::{CpuStats, Phase, StatsReport, encode_stats_packet};
use recorder::sources::ftrace::tracefs::Tracefs;
use recorder::sources::ftrace::{
    FtraceOptions, FtraceSource, PacketOutput, PrintFilter, PrintMatch, PrintRule, ReadMode,
    SubbufSize, VecOutput, load_layouts, resolve_event, subbuf,
};

use crate::common;

const SEQ: u32 = 7;

fn fixtures() -> PathBuf {
    common::repo_root().join("tests/fixtures/ftrace")
}

fn raw(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join(name)).expect("fixture readable")
}

fn fixture_table(compact: bool) -> (PageLayout, EventTable) {
    let t = Tracefs::at(fixtures().join("tree")).expect("fixture tree");
    let mut evs = Vec::new();
    for g in t.groups() {
        evs.extend(resolve_event(&t, &format!("{g}/*")));
    }
    let (l, table, failed) = load_layouts(&t, &evs, compact).expect("layouts");
    assert!(failed.is_empty(), "{failed:?}");
    (l, table)
}

fn encode(pages: &[u8], compact: bool, filter: &PrintFilter) -> (Vec<TracePacket>, BundleEncoder) {
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

pub(crate) fn decode(bytes: &[u8]) -> Vec<TracePacket> {
    Trace::parse_from_bytes(bytes)
        .expect("independent decoder parses the trace")
        .packet
}

pub(crate) fn bundles(p: &[TracePacket]) -> Vec<&FtraceEventBundle> {
    p.iter()
        .filter(|p| p.has_ftrace_events())
        .map(|p| p.ftrace_events())
        .collect()
}

pub(crate) fn events(p: &[TracePacket]) -> Vec<FtraceEvent> {
    bundles(p)
        .iter()
        .flat_map(|b| b.event.iter().cloned())
        .collect()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

#[test]
fn fixture_formats_parse_with_kernel_offsets() {
    let t = Tracefs::at(fixtures().join("tree")).expect("fixture tree");
    let (l, table) = fixture_table(false);
    assert_eq!(
        (l.data_offset, l.data_size, l.commit_size, l.page_size()),
        (16, 4080, 8, 4096)
    );
    let sw = table.get(372).expect("sched_switch is id 372 here");
    assert_eq!(sw.format.name, "sched_switch");
    let f = |n: &str| {
        sw.format
            .field(n)
            .map(|f| (f.offset, f.size, f.signed))
            .expect("field")
    };
    assert_eq!(f("prev_comm"), (8, 16, false));
    assert_eq!(f("prev_state"), (32, 8, true));
    assert_eq!(f("next_pid"), (56, 4, true));
    assert_eq!(
        resolve_event(&t, "sched_switch"),
        [("sched".to_string(), "sched_switch".to_string())]
    );
    assert!(resolve_event(&t, "sched/nope").is_empty());
    assert!(resolve_event(&t, "sched/*").len() >= 8);
}

#[test]
fn fixture_pages_decode_exactly() {
    let (l, table) = fixture_table(false);
    let page = raw("cpu0.raw");
    let page = &page[..4096];
    let h = parse_header(page, &l).expect("header");
    // Known bytes: page ts at 0, commit 0x0ff0 at 8, first event a cpu_idle
    // (type_len 4, delta 0) with state u32::MAX on cpu 0.
    assert_eq!(
        h.timestamp,
        u64::from_le_bytes(page[0..8].try_into().expect("8"))
    );
    assert_eq!(h.data_len, 0xff0);
    assert!(!h.missed_events);
    let evs: Vec<_> = EventIter::new(page, &l, &h)
        .collect::<Result<_, _>>()
        .expect("clean page");
    assert_eq!(evs[0].timestamp, h.timestamp);
    assert_eq!(evs[0].offset, 20);
    assert_eq!(table.event_id(evs[0].payload), Some(568));
    assert_eq!(u32_at(evs[0].payload, 8), u32::MAX);
    // Timestamps never go back within a page; events stay inside the data.
    for w in evs.windows(2) {
        assert!(w[0].timestamp <= w[1].timestamp);
    }
    for e in &evs {
        assert!(e.offset >= 16 && e.offset + e.payload.len() <= 16 + h.data_len);
    }
}

#[test]
fn time_extend_from_a_real_gap() {
    let page = raw("gap_cpu0.raw");
    let ts0 = u64::from_le_bytes(page[0..8].try_into().expect("8"));
    // Bytes 0x30..0x38 are a time extend (type 30) the kernel wrote for the 300 ms gap.
    let ext = u32_at(&page, 0x30);
    assert_eq!(ext & 0x1f, 30);
    let delta = ((u32_at(&page, 0x34) as u64) << 27) | (ext >> 5) as u64;
    assert!(delta > 300_000_000, "{delta}");
    let (p, _) = encode(&page, true, &PrintFilter::default());
    let ev = events(&p);
    assert_eq!(ev.len(), 2);
    assert_eq!(ev[0].timestamp(), ts0);
    assert_eq!(ev[1].timestamp(), ts0 + delta);
    assert_eq!(ev[0].print().buf(), "before gap\n");
    assert_eq!(ev[1].print().buf(), "after gap\n");
    assert_eq!(ev[0].print().ip(), 0xffff_ffff_814a_a7c1);
    assert_eq!(ev[0].pid(), 0x4b69);
}

#[test]
fn lost_events_from_an_overwritten_buffer() {
    let pages = raw("lossy_cpu0.raw");
    let (p, enc) = encode(&pages, false, &PrintFilter::default());
    let b = bundles(&p);
    assert!(b[0].lost_events(), "first page carries RB_MISSED_EVENTS");
    assert!(b.iter().skip(1).all(|b| !b.lost_events()));
    assert_eq!(enc.stats.lost_pages, 1);
    assert!(events(&p).iter().all(|e| e.has_sched_switch()));
}

#[test]
fn typed_events_match_the_raw_records_field_by_field() {
    let (l, table) = fixture_table(false);
    let mut pages = raw("cpu0.raw");
    pages.extend(raw("cpu1.raw"));
    let (p, enc) = encode(&pages, false, &PrintFilter::default());
    assert_eq!(enc.stats.unknown_ids, 0);
    assert_eq!(enc.stats.oversized_events, 0);
    for pk in &p {
        assert_eq!(pk.trusted_packet_sequence_id(), SEQ);
    }
    let ev = events(&p);
    // Every raw record, in order, against its decoded event.
    let mut raws = Vec::new();
    for page in pages.chunks_exact(l.page_size()) {
        let h = parse_header(page, &l).expect("header");
        raws.extend(EventIter::new(page, &l, &h).map(|e| e.expect("clean")));
    }
    assert_eq!(raws.len(), ev.len());
    let comm = |b: &[u8]| {
        String::from_utf8(b.split(|&c| c == 0).next().unwrap_or_default().to_vec()).expect("utf8")
    };
    let i32_at = |b: &[u8], at: usize| u32_at(b, at) as i32;
    let mut seen = BTreeSet::new();
    for (r, e) in raws.iter().zip(&ev) {
        let rec = r.payload;
        assert_eq!(e.timestamp(), r.timestamp);
        assert_eq!(e.pid(), u32_at(rec, 4));
        let id = table.event_id(rec).expect("id");
        let name = table.get(id).expect("known").format.name.as_str();
        seen.insert(name.to_string());
        match name {
            "sched_switch" => {
                let s = e.sched_switch();
                assert_eq!(s.prev_comm(), comm(&rec[8..24]));
                assert_eq!(s.prev_pid(), i32_at(rec, 24));
                assert_eq!(s.prev_prio(), i32_at(rec, 28));
                assert_eq!(
                    s.prev_state(),
                    i64::from_le_bytes(rec[32..40].try_into().expect("8"))
                );
                assert_eq!(s.next_comm(), comm(&rec[40..56]));
                assert_eq!(s.next_pid(), i32_at(rec, 56));
                assert_eq!(s.next_prio(), i32_at(rec, 60));
            }
            "sched_wakeup" | "sched_waking" | "sched_wakeup_new" => {
                let (c, pid, prio, cpu) = match name {
                    "sched_wakeup" => {
                        let w = e.sched_wakeup();
                        (w.comm().to_string(), w.pid(), w.prio(), w.target_cpu())
                    }
                    "sched_waking" => {
                        let w = e.sched_waking();
                        (w.comm().to_string(), w.pid(), w.prio(), w.target_cpu())
                    }
                    _ => {
                        let w = e.sched_wakeup_new();
                        (w.comm().to_string(), w.pid(), w.prio(), w.target_cpu())
                    }
                };
                assert_eq!(c, comm(&rec[8..24]));
                assert_eq!(pid, i32_at(rec, 24));
                assert_eq!(prio, i32_at(rec, 28));
                assert_eq!(cpu, i32_at(rec, 32));
            }
            "cpu_idle" => {
                assert_eq!(e.cpu_idle().state(), u32_at(rec, 8));
                assert_eq!(e.cpu_idle().cpu_id(), u32_at(rec, 12));
            }
            "softirq_entry" => assert_eq!(e.softirq_entry().vec(), u32_at(rec, 8)),
            "sched_process_exec" => {
                let loc = u32_at(rec, 8);
                let (off, len) = ((loc & 0xffff) as usize, (loc >> 16) as usize);
                assert_eq!(
                    e.sched_process_exec().filename(),
                    comm(&rec[off..off + len])
                );
                assert_eq!(e.sched_process_exec().pid(), i32_at(rec, 12));
            }
            "sched_process_fork" => {
                let f = e.sched_process_fork();
                assert_eq!(f.parent_pid(), i32_at(rec, 12));
                assert_eq!(f.child_pid(), i32_at(rec, 20));
                assert!(!f.child_comm().is_empty());
            }
            "sched_process_exit" | "sched_process_wait" | "sched_process_free" => {
                let pid = match name {
                    "sched_process_exit" => e.sched_process_exit().pid(),
                    "sched_process_wait" => e.sched_process_wait().pid(),
                    _ => e.sched_process_free().pid(),
                };
                // exit has a fixed comm here, wait and free a __data_loc one.
                let at = if name == "sched_process_exit" { 24 } else { 12 };
                assert_eq!(pid, i32_at(rec, at));
            }
            "task_newtask" => {
                assert_eq!(e.task_newtask().pid(), i32_at(rec, 8));
                assert_eq!(e.task_newtask().comm(), comm(&rec[12..28]));
            }
            "print" => assert!(e.print().buf().starts_with("hello marker")),
            other => panic!("unexpected event {other}"),
        }
    }
    for must in [
        "sched_switch",
        "sched_wakeup",
        "sched_waking",
        "sched_process_exec",
        "task_newtask",
        "print",
    ] {
        assert!(seen.contains(must), "{must} not in the fixture: {seen:?}");
    }
    // previous_bundle_end_timestamp: 0 first, then the last event of the previous bundle.
    let b = bundles(&p);
    assert_eq!(b[0].previous_bundle_end_timestamp(), 0);
    for w in b.windows(2) {
        assert_eq!(
            w[1].previous_bundle_end_timestamp(),
            w[0].event.last().expect("nonempty").timestamp()
        );
    }
    assert!(b.iter().all(|b| b.cpu() == 3 && !b.has_ftrace_clock()));
}

#[test]
fn compact_sched_matches_the_typed_encoding() {
    let mut pages = raw("cpu0.raw");
    pages.extend(raw("cpu1.raw"));
    let (typed, _) = encode(&pages, false, &PrintFilter::default());
    let (compact, enc) = encode(&pages, true, &PrintFilter::default());
    assert!(enc.stats.compact_events > 0);
    let mut switches = Vec::new();
    let mut wakings = Vec::new();
    for b in bundles(&compact) {
        assert!(
            b.event
                .iter()
                .all(|e| !e.has_sched_switch() && !e.has_sched_waking())
        );
        let Some(c) = b.compact_sched.as_ref() else {
            continue;
        };
        let mut ts = 0u64;
        for i in 0..c.switch_timestamp.len() {
            ts += c.switch_timestamp[i];
            let comm = &c.intern_table[c.switch_next_comm_index[i] as usize];
            switches.push((
                ts,
                c.switch_prev_state[i],
                c.switch_next_pid[i],
                c.switch_next_prio[i],
                comm.clone(),
            ));
        }
        let mut ts = 0u64;
        for i in 0..c.waking_timestamp.len() {
            ts += c.waking_timestamp[i];
            let comm = &c.intern_table[c.waking_comm_index[i] as usize];
            wakings.push((
                ts,
                c.waking_pid[i],
                c.waking_target_cpu[i],
                c.waking_prio[i],
                comm.clone(),
            ));
        }
    }
    let ev = events(&typed);
    let want_sw: Vec<_> = ev
        .iter()
        .filter(|e| e.has_sched_switch())
        .map(|e| {
            let s = e.sched_switch();
            (
                e.timestamp(),
                s.prev_state(),
                s.next_pid(),
                s.next_prio(),
                s.next_comm().to_string(),
            )
        })
        .collect();
    let want_wk: Vec<_> = ev
        .iter()
        .filter(|e| e.has_sched_waking())
        .map(|e| {
            let s = e.sched_waking();
            (
                e.timestamp(),
                s.pid(),
                s.target_cpu(),
                s.prio(),
                s.comm().to_string(),
            )
        })
        .collect();
    assert_eq!(switches, want_sw);
    assert_eq!(wakings, want_wk);
    // The other events are unchanged.
    let rest = |p: &[TracePacket]| {
        events(p)
            .into_iter()
            .filter(|e| !e.has_sched_switch() && !e.has_sched_waking())
            .count()
    };
    assert_eq!(rest(&typed), rest(&compact));
}

#[test]
fn print_filter_drops_matching_prints() {
    let filter = PrintFilter {
        rules: vec![
            PrintRule {
                matches: PrintMatch::Prefix("hello marker 1".into()),
                allow: true,
            },
            PrintRule {
                matches: PrintMatch::Prefix("hello".into()),
                allow: false,
            },
        ],
    };
    let mut pages = raw("cpu0.raw");
    pages.extend(raw("cpu1.raw"));
    let (p, enc) = encode(&pages, true, &filter);
    let prints: Vec<_> = events(&p)
        .iter()
        .filter(|e| e.has_print())
        .map(|e| e.print().buf().to_string())
        .collect();
    // The kernel ends trace_marker text with a newline.
    assert_eq!(prints, ["hello marker 1\n"]);
    assert_eq!(enc.stats.filtered_prints, 2);
}

/// A table of one made-up event `mine/NAME` (id `id`): the common fields,
/// then `fields` (format-file lines).
fn synthetic_table(name: &str, id: u16, fields: &str) -> EventTable {
    let text = format!(
        "name: {name}\nID: {id}\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n{fields}"
    );
    let mut t = EventTable::new();
    t.insert(
        recorder::sources::ftrace::format::parse_event_format("mine", &text).expect("format"),
        true,
    );
    t
}

#[test]
fn synthetic_padding_extend_and_generic_events() {
    let (l, table) = fixture_table(false);
    // An event the table has no typed message for is encoded generically.
    let t2 = synthetic_table(
        "my_ev",
        900,
        "\tfield:int v;\toffset:8;\tsize:4;\tsigned:1;\n\tfield:unsigned long u;\toffset:16;\tsize:8;\tsigned:0;\n\tfield:char s[8];\toffset:24;\tsize:8;\tsigned:0;\n",
    );
    let mut rec = vec![0u8; 32];
    rec[0..2].copy_from_slice(&900u16.to_le_bytes());
    rec[4..8].copy_from_slice(&77i32.to_le_bytes());
    rec[8..12].copy_from_slice(&(-3i32).to_le_bytes());
    rec[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    rec[24..27].copy_from_slice(b"abc");
    let page = PageBuilder::new(100, 4096)
        .event(1, &rec)
        .padding(16)
        .time_extend(1 << 33)
        .event(2, &rec)
        .finish(Some(None));
    let mut out = VecOutput::new();
    let mut enc = BundleEncoder::new(SEQ, 16 * 1024);
    let mut cur = CpuCursor::default();
    enc.encode_pages(&mut out, &t2, &PrintFilter::default(), &l, &mut cur, &page);
    let p = decode(&out.bytes);
    let b = bundles(&p);
    assert_eq!(b.len(), 1);
    assert!(b[0].lost_events());
    let ev = &b[0].event;
    assert_eq!(
        ev.iter().map(|e| e.timestamp()).collect::<Vec<_>>(),
        [101, 101 + (1 << 33) + 2]
    );
    let g = ev[0].generic();
    assert_eq!(g.event_name(), "my_ev");
    let f: Vec<_> = g
        .field
        .iter()
        .map(|f| (f.name().to_string(), format!("{:?}", f.value)))
        .collect();
    assert_eq!(f.len(), 3);
    assert_eq!(g.field[0].int_value(), -3);
    assert_eq!(g.field[1].uint_value(), 1 << 40);
    assert_eq!(g.field[2].str_value(), "abc");
    assert_eq!(ev[0].pid(), 77);
    drop(table);
}

#[test]
fn bundles_split_when_a_packet_is_full_and_nothing_is_lost() {
    // Many pages into small packets: every event must come out once, in order.
    let mut pages = Vec::new();
    for _ in 0..6 {
        pages.extend(raw("cpu0.raw"));
    }
    let (l, table) = fixture_table(true);
    let mut out = VecOutput::new();
    let mut enc = BundleEncoder::new(SEQ, 16 * 1024);
    let mut cur = CpuCursor::default();
    enc.encode_pages(
        &mut out,
        &table,
        &PrintFilter::default(),
        &l,
        &mut cur,
        &pages,
    );
    let total: usize = pages
        .chunks_exact(l.page_size())
        .map(|p| recorder::sources::ftrace::encode::count_page_events(p, &l).expect("clean"))
        .sum();
    assert_eq!(enc.stats.events as usize, total);
    let p = decode(&out.bytes);
    let got: usize = bundles(&p)
        .iter()
        .map(|b| {
            b.event.len()
                + b.compact_sched
                    .as_ref()
                    .map_or(0, |c| c.switch_timestamp.len() + c.waking_timestamp.len())
        })
        .sum();
    assert_eq!(got, total);
    assert!(
        out.bytes.len() < pages.len(),
        "encoded {} vs raw {}",
        out.bytes.len(),
        pages.len()
    );
}

/// The ring writer reserving a full-size slot for every bundle, as it did
/// before `begin_packet_at_least`: the padding baseline.
struct FullSlots(recorder::ringbuf::Writer);

impl PacketOutput for FullSlots {
    fn write_packet(&mut self, packet: &[u8]) {
        let _ = self.0.write_packet(packet);
    }
    fn begin(
        &mut self,
        _min_len: usize,
        max_len: usize,
    ) -> Option<recorder::ringbuf::PacketSlot<'_>> {
        self.0.begin_packet(max_len).ok()
    }
}

/// Encodes 400 drains of 2 to 20 fixture pages (small drains and ones that
/// need several bundles) through `out` into `buffer`; returns the events
/// encoded and the buffer's counters before the last chunk is completed.
fn record_drains(
    buffer: &Arc<recorder::ringbuf::Buffer>,
    out: &mut dyn PacketOutput,
) -> (usize, BundleEncoder, recorder::ringbuf::BufferStats) {
    use recorder::sources::ftrace::encode::count_page_events;
    let (l, table) = fixture_table(false);
    let mut one = raw("cpu0.raw");
    one.extend(raw("cpu1.raw"));
    let per_copy: usize = one
        .chunks_exact(l.page_size())
        .map(|p| count_page_events(p, &l).expect("clean"))
        .sum();
    let mut enc = BundleEncoder::new(SEQ, recorder::sources::ftrace::DEFAULT_MAX_PACKET_BYTES);
    let mut cur = CpuCursor::default();
    let mut total = 0usize;
    let mut pages = Vec::new();
    for drain in 0..400usize {
        let copies = 1 + (drain * 7) % 10;
        pages.clear();
        for _ in 0..copies {
            pages.extend_from_slice(&one);
        }
        total += copies * per_copy;
        enc.encode_pages(out, &table, &PrintFilter::default(), &l, &mut cur, &pages);
    }
    // Completed chunks only: the one still being written has no padding yet.
    (total, enc, buffer.stats())
}

/// Ftrace bundles through a real ring buffer with the default 64 KiB
/// chunks: the chunk padding (the unused tail of each completed chunk) stays
/// under one short bundle per chunk, against about half of every chunk when
/// each bundle reserved the full 32 KiB; and what the file would get decodes
/// to every event.
#[test]
fn bundles_fill_the_ring_chunks_with_little_padding() {
    use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, FlushItem, WriterId};
    use recorder::sources::ftrace::encode::MIN_BUNDLE_BYTES;

    let params = BufferParams {
        size_bytes: 32 << 20,
        chunk_size: BufferParams::DEFAULT_REGION_BYTES,
        region_chunks: 1,
        policy: FillPolicy::Discard,
        prefault: false,
    };
    let report = |name: &str, s: &recorder::ringbuf::BufferStats, bundles: u64| {
        let chunk = BufferParams::DEFAULT_REGION_BYTES as u64;
        eprintln!(
            "{name}: {bundles} bundles, {} B in {} completed chunks, padding {} B \
             ({:.1}% of the chunks, {:.2} B per byte of data)",
            s.bytes_written,
            s.chunks_written,
            s.unused_chunk_bytes,
            100.0 * s.unused_chunk_bytes as f64 / (s.chunks_written * chunk) as f64,
            s.unused_chunk_bytes as f64 / s.bytes_written as f64,
        );
    };

    let full = Buffer::new(params).expect("buffer");
    let mut out = FullSlots(full.writer(WriterId(SEQ)));
    let (_, enc, before) = record_drains(&full, &mut out);
    report("full-size slots", &before, enc.stats.bundles);

    let buffer = Buffer::new(params).expect("buffer");
    let mut writer = buffer.writer(WriterId(SEQ));
    let (total, enc, s) = record_drains(&buffer, &mut writer);
    report("begin_packet_at_least", &s, enc.stats.bundles);

    assert_eq!((s.packets_discarded, s.packets_refused), (0, 0), "{s:#?}");
    assert!(s.chunks_written >= 20, "enough chunks to measure: {s:#?}");
    // A chunk is left only when less than a short bundle (and its slot
    // header) is free.
    assert!(
        s.unused_chunk_bytes < s.chunks_written * (MIN_BUNDLE_BYTES as u64 + 5),
        "padding {} B over {} chunks",
        s.unused_chunk_bytes,
        s.chunks_written
    );
    assert!(
        s.unused_chunk_bytes * 4 < before.unused_chunk_bytes,
        "padding {} B, {} B with full-size slots",
        s.unused_chunk_bytes,
        before.unused_chunk_bytes
    );
    drop(writer);
    let batch = buffer.take_flush();
    let mut file = Vec::new();
    for item in batch.items() {
        match item {
            FlushItem::Data(d) => file.extend_from_slice(d),
            FlushItem::Loss { .. } => panic!("nothing was lost"),
        }
    }
    batch.release();
    let p = decode(&file);
    assert_eq!(p.len() as u64, enc.stats.bundles);
    assert_eq!(events(&p).len(), total, "every event once");
    assert_eq!(enc.stats.events as usize, total);
    assert_eq!(enc.stats.oversized_events, 0);
}

/// An event too big for the short bundle that would use up a chunk's tail
/// is not dropped: it goes into a full-size bundle in a new chunk, with the
/// page's loss mark.
#[test]
fn an_event_too_big_for_a_short_bundle_gets_a_full_one() {
    use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, FlushItem, WriterId};
    use recorder::sources::ftrace::encode::MIN_BUNDLE_BYTES;

    let (l, _) = fixture_table(false);
    let t2 = synthetic_table(
        "my_big",
        901,
        "\tfield:char s[4040];\toffset:8;\tsize:4040;\tsigned:0;\n",
    );
    let mut rec = vec![b's'; 8 + 4040];
    rec[0..2].copy_from_slice(&901u16.to_le_bytes());
    rec[2..8].fill(0);
    *rec.last_mut().expect("non-empty") = 0;
    let page = PageBuilder::new(100, 4096)
        .event(1, &rec)
        .finish(Some(None));

    let chunk = BufferParams::DEFAULT_REGION_BYTES;
    let buffer = Buffer::new(BufferParams {
        size_bytes: 4 * chunk,
        chunk_size: chunk,
        region_chunks: 1,
        policy: FillPolicy::Discard,
        prefault: false,
    })
    .expect("buffer");
    let mut writer = buffer.writer(WriterId(SEQ));
    // Leave 4099 B of the chunk: a short bundle of exactly MIN_BUNDLE_BYTES
    // behind its 3-byte slot header.
    let filler_framed = chunk - (MIN_BUNDLE_BYTES + 3);
    writer
        .write_packet(&vec![0u8; filler_framed - 4])
        .expect("fits");
    let mut enc = BundleEncoder::new(SEQ, recorder::sources::ftrace::DEFAULT_MAX_PACKET_BYTES);
    enc.encode_pages(
        &mut writer,
        &t2,
        &PrintFilter::default(),
        &l,
        &mut CpuCursor::default(),
        &page,
    );
    assert_eq!(enc.stats.oversized_events, 0);
    assert_eq!((enc.stats.bundles, enc.stats.events), (1, 1));
    drop(writer);
    let s = buffer.stats();
    assert_eq!(s.chunks_written, 2, "the bundle went to a chunk of its own");
    let batch = buffer.take_flush();
    let mut file = Vec::new();
    for item in batch.items() {
        match item {
            FlushItem::Data(d) => file.extend_from_slice(d),
            FlushItem::Loss { .. } => panic!("nothing was lost"),
        }
    }
    batch.release();
    let p = decode(&file[filler_framed..]);
    let b = bundles(&p);
    assert_eq!(b.len(), 1);
    assert!(
        b[0].lost_events(),
        "the page's loss mark moved to the full bundle"
    );
    let g = b[0].event[0].generic();
    assert_eq!(g.event_name(), "my_big");
    assert_eq!(g.field[0].str_value().len(), 4039);
}

#[test]
fn ftrace_stats_packet_decodes() {
    let cpus = [CpuStats::parse(
        0,
        "entries: 5\noverrun: 2\ncommit overrun: 1\nbytes: 100\noldest event ts: 1.5\nnow ts: 2.25\ndropped events: 3\nread events: 9\n",
    )];
    let unknown = vec!["sched/nope".to_string()];
    let report = StatsReport {
        cpus: &cpus,
        unknown_events: &unknown,
        failed_events: &[],
        parse_errors: &[13],
        cpu_buffer_size_pages: 2048,
        preserve_ftrace_buffer: true,
    };
    let mut buf = vec![0u8; 1024];
    let n = encode_stats_packet(&mut buf, SEQ, 1234, Phase::EndOfTrace, &report).expect("fits");
    let p = TracePacket::parse_from_bytes(&buf[..n]).expect("decodes");
    assert_eq!((p.timestamp(), p.trusted_packet_sequence_id()), (1234, SEQ));
    let s = p.ftrace_stats();
    assert_eq!(
        s.phase(),
        perfetto_protos::ftrace_stats::ftrace_stats::Phase::END_OF_TRACE
    );
    let c = &s.cpu_stats[0];
    assert_eq!(
        (
            c.cpu(),
            c.entries(),
            c.overrun(),
            c.commit_overrun(),
            c.bytes_read(),
            c.dropped_events(),
            c.read_events()
        ),
        (0, 5, 2, 1, 100, 3, 9)
    );
    assert_eq!((c.oldest_event_ts(), c.now_ts()), (1.5, 2.25));
    assert_eq!(s.unknown_ftrace_events, ["sched/nope"]);
    assert_eq!(s.ftrace_parse_errors.len(), 1);
    assert!(s.preserve_ftrace_buffer());
}

pub(crate) fn kernel_missing() -> Option<String> {
    common::need_root().or_else(|| {
        Tracefs::discover()
            .err()
            .map(|e| format!("no tracefs: {e}"))
            .or_else(|| {
                let t = Tracefs::discover().ok()?;
                (!t.path("instances").is_dir()).then(|| "tracefs has no instances".to_string())
            })
    })
}

/// Two threads bounce a byte over a pair of pipes; returns their tids.
pub(crate) fn ping_pong(rounds: usize) -> (i32, i32) {
    ping_pong_with(rounds, false)
}

/// [`ping_pong`]; with `wake_sleeper`, each ping waits until the other
/// thread sleeps in its read, so that every ping wakes it (on a loaded
/// machine a preempted thread is still runnable, and waking it is no
/// wake-up the kernel reports).
pub(crate) fn ping_pong_with(rounds: usize, wake_sleeper: bool) -> (i32, i32) {
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

#[test]
fn real_kernel_ping_pong_recording() {
    ping_pong_recording(ReadMode::Read, SubbufSize::Auto);
}

#[test]
fn real_kernel_ping_pong_recording_splice() {
    ping_pong_recording(ReadMode::Splice, SubbufSize::Auto);
}

/// The kernel's own one-page sub-buffers, as before the recorder chose
/// larger ones.
#[test]
fn real_kernel_ping_pong_recording_in_one_page_sub_buffers() {
    ping_pong_recording(ReadMode::Read, SubbufSize::Kb(4));
}

/// The real-kernel tests compare tracefs before and after: one at a time.
pub(crate) static KERNEL: Mutex<()> = Mutex::new(());

pub(crate) fn ping_pong_recording(read_mode: ReadMode, subbuf: SubbufSize) {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let top = Tracefs::discover().expect("tracefs");
    // Instances of crashed runs are cleaned at start; take them out of "before".
    top.remove_stale_instances(std::path::Path::new("/proc"));
    // Only this process's instances: other tests' recorders come and go.
    let ours = |top: &Tracefs| -> BTreeSet<String> {
        let pid = format!("recorder-{}", std::process::id());
        std::fs::read_dir(top.path("instances"))
            .expect("instances")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| {
                n.strip_prefix(&pid)
                    .is_some_and(|r| r.is_empty() || r.starts_with('-'))
            })
            .collect()
    };
    let instances_before = ours(&top);
    let enable_before = top
        .read("events/sched/sched_switch/enable")
        .expect("enable");
    let opts = FtraceOptions {
        spec: FtraceSpec {
            events: vec![
                "sched/sched_switch".into(),
                "sched_wakeup".into(),
                "sched/no_such_event".into(),
            ],
            // Every CPU's switches are recorded, the machine's other load
            // included: room for a reader kept off the CPU for a while.
            buffer_size: Some(ByteSize::from_kb(8192)),
            drain_period: Duration::from_millis(20),
            compact_sched: false,
            ..Default::default()
        },
        sequence_id: SEQ,
        read_mode,
        subbuf,
        ..Default::default()
    };
    let subbuf_before = top.read("buffer_subbuf_size_kb").ok();
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let mut src = FtraceSource::new(opts, VecOutput::new()).expect("source");
    let s2 = seen.clone();
    src.on_pids(Box::new(move |p: &[i32]| {
        s2.lock().expect("lock").extend(p.iter().copied())
    }));
    src.start().expect("start");
    let inst = src.tracefs_dir().expect("dir").clone();
    assert!(inst.read("trace_clock").expect("clock").contains("[boot]"));
    // 8 MiB per CPU: room for 64 sub-buffers of 16 KiB, the recorder's
    // choice where the kernel lets it choose (Linux 6.8+).
    if subbuf_before.is_some() {
        let want = match subbuf {
            SubbufSize::Auto => subbuf::DEFAULT_SUBBUF_KB,
            SubbufSize::Kb(k) => k,
        };
        assert_eq!(
            inst.read("buffer_subbuf_size_kb").expect("subbuf").trim(),
            want.to_string()
        );
        assert!(
            inst.read("events/header_page")
                .expect("header_page")
                .contains(&format!("size:{};", want * 1024 - 16)),
            "the page layout follows the sub-buffer size"
        );
    }
    let (a, b) = ping_pong(2000);
    src.flush().expect("flush");
    let summary = src.stop().expect("stop");
    let out = src.take_output().expect("output");
    let p = decode(&out.bytes);

    // Both threads switch in and out.
    let ev = events(&p);
    let prev: BTreeSet<i32> = ev
        .iter()
        .filter(|e| e.has_sched_switch())
        .map(|e| e.sched_switch().prev_pid())
        .collect();
    let next: BTreeSet<i32> = ev
        .iter()
        .filter(|e| e.has_sched_switch())
        .map(|e| e.sched_switch().next_pid())
        .collect();
    for t in [a, b] {
        assert!(
            prev.contains(&t) && next.contains(&t),
            "tid {t} missing from sched_switch"
        );
        assert!(
            seen.lock().expect("lock").contains(&t),
            "tid {t} not reported"
        );
    }
    assert!(
        ev.iter()
            .any(|e| e.has_sched_wakeup() && [a, b].contains(&e.sched_wakeup().pid()))
    );
    // Timestamps increase per CPU.
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for bd in bundles(&p) {
        for e in &bd.event {
            let l = last.entry(bd.cpu()).or_default();
            assert!(e.timestamp() >= *l, "cpu {} went back", bd.cpu());
            *l = e.timestamp();
        }
    }
    let stats: Vec<_> = p
        .iter()
        .filter(|p| p.has_ftrace_stats())
        .map(|p| p.ftrace_stats())
        .collect();
    assert_eq!(stats.len(), 2);
    assert_eq!(stats[1].unknown_ftrace_events, ["sched/no_such_event"]);
    // The only loss is the kernel's: events another load wrote over
    // before they were read (its overrun counter). The bundles say so on
    // exactly the CPUs where it happened, and the reader itself lost no
    // page. On a quiet machine nothing is lost at all.
    let overran: BTreeSet<u64> = stats[1]
        .cpu_stats
        .iter()
        .filter(|c| {
            let before = stats[0].cpu_stats.iter().find(|b| b.cpu() == c.cpu());
            c.overrun() > before.map_or(0, |b| b.overrun())
        })
        .map(|c| c.cpu())
        .collect();
    let flagged: BTreeSet<u64> = bundles(&p)
        .into_iter()
        .filter(|b| b.lost_events())
        .map(|b| u64::from(b.cpu()))
        .collect();
    assert_eq!(
        flagged, overran,
        "bundles flagged lost on the CPUs the kernel overran on"
    );
    if !overran.is_empty() {
        eprintln!("the kernel overran on cpus {overran:?} at this load");
    }
    // Pages the kernel flagged as following a loss, counted as such; no
    // bundle dropped on the recorder's side.
    assert_eq!(summary.encode.lost_pages > 0, !overran.is_empty());
    assert_eq!(summary.encode.dropped_bundles, 0);
    assert_eq!(summary.encode.unknown_ids, 0);
    assert_eq!(summary.non_monotonic, 0);
    match read_mode {
        ReadMode::Mmap => assert_eq!(summary.mapped_cpus, summary.cpu_stats.len()),
        ReadMode::Read | ReadMode::Splice => assert_eq!(summary.mapped_cpus, 0),
        ReadMode::Auto => {}
    }
    // tracefs left as found.
    assert_eq!(instances_before, ours(&top));
    assert!(!inst.root().exists());
    assert_eq!(top.read("buffer_subbuf_size_kb").ok(), subbuf_before);
    assert_eq!(
        top.read("events/sched/sched_switch/enable")
            .expect("enable"),
        enable_before
    );
}

/// With a long drain period and a small buffer, only the watermark wake-up
/// can read more than the buffers hold before the last drain; without it
/// (percent 0) the same load overruns them.
#[test]
fn real_kernel_watermark_drains_before_the_period() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let run = |percent: u32| {
        let opts = FtraceOptions {
            spec: FtraceSpec {
                events: vec!["sched/sched_switch".into(), "sched/sched_wakeup".into()],
                buffer_size: Some(ByteSize::from_kb(128)),
                drain_period: Duration::from_secs(30),
                drain_buffer_percent: percent,
                ..Default::default()
            },
            sequence_id: SEQ,
            ..Default::default()
        };
        let mut src = FtraceSource::new(opts, VecOutput::new()).expect("source");
        src.start().expect("start");
        let cpus = src.tracefs_dir().expect("dir").cpus().len() as u64;
        ping_pong(100_000);
        let s = src.stop().expect("stop");
        let overrun: u64 = s.cpu_stats.iter().map(|c| c.overrun).sum();
        let capacity = cpus * 128 * 1024;
        (s.watermark_drains, s.bytes_read, capacity, overrun)
    };
    let (drains, read, capacity, _) = run(25);
    assert!(drains > 0, "no watermark drain");
    assert!(
        read > 2 * capacity,
        "read {read} B, not more than the {capacity} B the buffers hold"
    );
    let (drains, read, capacity, overrun) = run(0);
    assert_eq!(drains, 0);
    assert!(read <= capacity + 64 * 1024, "period-only read {read} B");
    assert!(
        overrun > 0,
        "the load should overrun 128 KiB without the watermark"
    );
}

/// `print_filter` from a text config, on the binary: the first matching
/// rule decides, prefix and atrace rules, unmatched prints kept.
#[test]
fn print_filter_from_the_config_on_the_binary() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tmp");
    let (mut rec, out) = Started::on_text(
        dir.path(),
        "print",
        r#"
buffers { size_kb: 4096 }
data_sources { config { name: "linux.ftrace" ftrace_config {
  ftrace_events: "ftrace/print"
  drain_period_ms: 50
  print_filter {
    rules { prefix: "drop" allow: false }
    rules { atrace_msg { type: "B" prefix: "noisy" } allow: false }
    rules { prefix: "B|" allow: true }
  }
} } }
duration_ms: 60000
"#,
    );
    let marker = rec.marker();
    for m in [
        "keep 1",
        "drop me",
        "B|123|noisy slice",
        "B|123|quiet slice",
        "keep 2",
    ] {
        std::fs::write(&marker, m).expect("trace_marker");
    }
    std::thread::sleep(Duration::from_millis(200));
    rec.interrupt_and_wait();
    let p = decode(&std::fs::read(&out).expect("trace"));
    let prints: Vec<String> = events(&p)
        .iter()
        .filter(|e| e.has_print())
        .map(|e| e.print().buf().to_string())
        .collect();
    assert_eq!(prints, ["keep 1\n", "B|123|quiet slice\n", "keep 2\n"]);
}

/// A recorder started on a config, once its ftrace source records (a new
/// instance starts with tracing_on = 1 before the recorder has set it up, so
/// its own log line is the signal).
struct Started {
    child: std::process::Child,
    log: String,
    rest: Option<std::thread::JoinHandle<String>>,
}

impl Started {
    fn spawn(cfg: &std::path::Path, out: &std::path::Path) -> Started {
        match Self::try_spawn(cfg, out) {
            Ok(s) => s,
            Err(log) => panic!("{}: recorder ended before recording: {log}", cfg.display()),
        }
    }

    /// Like [`Started::spawn`]; a recorder that exits before its ftrace
    /// source records gives its exit status and log instead.
    fn try_spawn(cfg: &std::path::Path, out: &std::path::Path) -> Result<Started, String> {
        let mut child = std::process::Command::new(common::recorder_bin())
            .arg("--config")
            .arg(cfg)
            .arg("-o")
            .arg(out)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("recorder runs");
        let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
        let mut log = String::new();
        loop {
            let mut line = String::new();
            let n = std::io::BufRead::read_line(&mut stderr, &mut line).expect("stderr");
            if n == 0 {
                let status = child.wait().expect("exits");
                return Err(format!("{status}\n{log}"));
            }
            log.push_str(&line);
            if line.contains("ftrace: recording") {
                break;
            }
        }
        let rest = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
            s
        });
        Ok(Started {
            child,
            log,
            rest: Some(rest),
        })
    }

    /// Writes `text` as `NAME.cfg` in `dir` and starts a recorder on it
    /// writing `NAME.pftrace` there; returns it and the output path.
    fn on_text(dir: &std::path::Path, name: &str, text: &str) -> (Started, PathBuf) {
        let cfg = dir.join(format!("{name}.cfg"));
        std::fs::write(&cfg, text).expect("cfg");
        let out = dir.join(format!("{name}.pftrace"));
        (Started::spawn(&cfg, &out), out)
    }

    /// The trace_marker of the recorder's own tracefs instance.
    fn marker(&self) -> PathBuf {
        Tracefs::discover().expect("tracefs").path(&format!(
            "instances/recorder-{}/trace_marker",
            self.child.id()
        ))
    }

    /// SIGINT (the session may have ended by itself), then the exit status
    /// must be success; returns the whole log.
    fn interrupt_and_wait(&mut self) -> String {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        }
        let status = self.child.wait().expect("exits");
        if let Some(r) = self.rest.take() {
            self.log.push_str(&r.join().expect("stderr reader"));
        }
        assert!(status.success(), "{}", self.log);
        self.log.clone()
    }
}

/// The tests' own configs and (where present) Perfetto's test configs whose
/// data sources are all built in here
/// (linux.ftrace, linux.process_stats, linux.sys_stats, linux.system_info)
/// and that start without a trigger run as given: each records for a
/// second, stops on SIGINT, and its file holds ftrace bundles (nothing lost
/// at this load), the start and end FtraceStats, and the process tree where
/// the config scans processes at start — read by the independent decoder.
#[test]
fn test_configs_with_linux_sources_record() {
    use recorder::config::spec::SourceKind;
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let mut dirs = vec![common::own_test_configs()];
    let mut must = vec!["periodic_file.cfg", "scheduling.cfg", "fast_polls.cfg"];
    if let Some(dir) = common::perfetto_test_configs() {
        dirs.push(dir);
        must.extend(["long_trace.cfg", "sys_stats.cfg"]);
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let mut files = Vec::new();
    for dir in &dirs {
        let mut in_dir: Vec<_> = std::fs::read_dir(dir)
            .expect("configs")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "cfg"))
            .collect();
        in_dir.sort();
        files.extend(in_dir);
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let mut ran = Vec::new();
    let mut refused = Vec::new();
    for path in files {
        let Ok(spec) = recorder::config::load_spec(&path, Default::default()) else {
            continue;
        };
        let builtin = spec.data_sources.iter().all(|d| {
            matches!(
                d.kind,
                SourceKind::Ftrace(_)
                    | SourceKind::ProcessStats(_)
                    | SourceKind::SysStats(_)
                    | SourceKind::SystemInfo
            )
        });
        let ftrace = spec
            .data_sources
            .iter()
            .any(|d| matches!(d.kind, SourceKind::Ftrace(_)));
        if !builtin || !ftrace || spec.trigger.is_some() {
            continue;
        }
        let scans = spec.data_sources.iter().any(
            |d| matches!(&d.kind, SourceKind::ProcessStats(p) if p.scan_all_processes_on_start),
        );
        // Userspace atrace (any atrace category) and print come through trace_marker.
        let prints = spec.data_sources.iter().any(|d| {
            matches!(&d.kind, SourceKind::Ftrace(f) if !f.atrace_categories.is_empty()
                || !f.atrace_apps.is_empty()
                || f.events.iter().any(|e| e == "ftrace/print" || e == "print"))
        });
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        let out = tmp
            .path()
            .join(format!("{}.pftrace", ran.len() + refused.len()));
        let mut rec = match Started::try_spawn(&path, &out) {
            Ok(r) => r,
            Err(log) => {
                // Only a kernel without any of the config's events may refuse it, by name.
                assert!(
                    log.contains("exit status: 1")
                        && log.contains("none of the requested ftrace events exist"),
                    "{name}: {log}"
                );
                refused.push(name);
                continue;
            }
        };
        // An atrace slice (trace processor parses prints as atrace; plain
        // text would be a systrace_parse_failure).
        let me = std::process::id();
        std::fs::write(rec.marker(), format!("B|{me}|running {name}")).expect("trace_marker");
        std::fs::write(rec.marker(), format!("E|{me}")).expect("trace_marker");
        std::thread::sleep(Duration::from_millis(1000));
        let log = rec.interrupt_and_wait();
        let p = decode(&std::fs::read(&out).expect("trace"));
        let b = bundles(&p);
        assert!(!b.is_empty(), "{name}: no ftrace bundles");
        if prints {
            let want = format!("B|{me}|running {name}\n");
            assert!(
                events(&p)
                    .iter()
                    .any(|e| e.has_print() && e.print().buf() == want),
                "{name}: the trace_marker line is missing"
            );
        }
        // Some of these configs give ftrace a few pages per CPU; on a loaded
        // machine the kernel may overrun them before the reader runs. That
        // is the kernel's loss, and then the summary must say so.
        if b.iter().any(|b| b.lost_events()) {
            assert!(
                log.contains("linux.ftrace: the kernel lost"),
                "{name}: bundles flag lost events the summary does not report\n{log}"
            );
        }
        let phases: Vec<_> = p
            .iter()
            .filter(|p| p.has_ftrace_stats())
            .map(|p| p.ftrace_stats().phase())
            .collect();
        // A full DISCARD buffer (rss_stat.cfg: 512 KiB) has no room for the
        // end stats, and the summary says so.
        let full = log.contains("no room for the FtraceStats");
        // A ring that wrapped (a loaded machine fills bugreport.cfg's 32 MiB
        // in seconds) may have overwritten the start stats; never the end's.
        let wrapped = log.contains("overwritten");
        let want = if full { 1 } else { 2 };
        assert!(
            phases.len() == want || (wrapped && phases.len() == 1),
            "{name}: start and end FtraceStats ({phases:?})\n{log}"
        );
        if wrapped && !full {
            assert_eq!(
                phases.last(),
                Some(&perfetto_protos::ftrace_stats::ftrace_stats::Phase::END_OF_TRACE),
                "{name}: the end stats survive a wrapped ring\n{log}"
            );
        }
        if scans {
            assert!(
                p.iter().any(|p| p.has_process_tree()),
                "{name}: no process tree"
            );
        }
        // Trace processor reads it with no error stat and the loss the trace
        // holds (none here), and sees the scheduling the bundles carry.
        if let Some(tp) = crate::trace_processor::check(&out) {
            assert_ftrace_events_agree(&tp, &out);
            if prints {
                let slices = tp.query(&format!(
                    "select count(*) from slice where name = 'running {name}'"
                ));
                assert_eq!(slices.scalar().int(), 1, "{name}: the marker's slice");
            }
        }
        ran.push(name);
    }
    for must in must {
        assert!(ran.iter().any(|r| r == must), "{must} not run: {ran:?}");
    }
    eprintln!("ran: {ran:?}; refused (no such events here): {refused:?}");
}

/// Events the kernel drops before they are read are reported on screen, per
/// CPU and with advice, and agree with the end FtraceStats in the file.
#[test]
fn kernel_loss_is_reported_in_the_summary() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tmp");
    // A few pages per CPU, read only when full: a pipe ping-pong overruns them.
    let (mut rec, out) = Started::on_text(
        dir.path(),
        "tiny",
        r#"
buffers { size_kb: 8192 }
data_sources { config { name: "linux.ftrace" ftrace_config {
  ftrace_events: "sched/sched_switch"
  ftrace_events: "sched/sched_wakeup"
  buffer_size_kb: 16
  drain_period_ms: 30000
  drain_buffer_percent: 100
} } }
duration_ms: 60000
"#,
    );
    ping_pong(50_000);
    let log = rec.interrupt_and_wait();
    let p = decode(&std::fs::read(&out).expect("trace"));
    let end = p
        .iter()
        .filter(|p| p.has_ftrace_stats())
        .map(|p| p.ftrace_stats())
        .last()
        .expect("end FtraceStats");
    let lost: u64 = end
        .cpu_stats
        .iter()
        .map(|c| c.overrun() + c.dropped_events())
        .sum();
    assert!(lost > 0, "the load should overrun 16 KiB per CPU\n{log}");
    assert!(
        log.contains(&format!(
            "linux.ftrace: the kernel lost {lost} events before they were read"
        )),
        "{log}"
    );
    assert!(log.contains("raise buffer_size_kb"), "{log}");
    // `recorder inspect --json` reports the same loss and every event.
    let inspect = std::process::Command::new(common::recorder_bin())
        .args(["inspect", "--json"])
        .arg(&out)
        .output()
        .expect("inspect runs");
    assert!(inspect.status.success());
    let j: serde_json::Value = serde_json::from_slice(&inspect.stdout).expect("json");
    let ft = &j["ftrace"];
    let per_cpu: u64 = ft["end_lost_per_cpu"]
        .as_array()
        .expect("end stats")
        .iter()
        .map(|c| c[1].as_u64().expect("count"))
        .sum();
    assert_eq!(per_cpu, lost);
    let compact: usize = bundles(&p)
        .iter()
        .map(|b| b.compact_sched.switch_timestamp.len() + b.compact_sched.waking_timestamp.len())
        .sum();
    assert_eq!(
        ft["events"].as_u64(),
        Some((events(&p).len() + compact) as u64)
    );
    let flagged = bundles(&p).iter().filter(|b| b.lost_events()).count() as u64;
    assert_eq!(ft["bundles_after_loss"].as_u64(), Some(flagged));
    assert!(flagged > 0);
    // Trace processor, independently: a data_loss row for each CPU whose
    // bundles say events were lost, and per-CPU kernel losses adding up to
    // the figure of the summary and of inspect.
    if let Some(tp) = crate::trace_processor::open(&out) {
        let lost_cpus: BTreeSet<i64> = bundles(&p)
            .iter()
            .filter(|b| b.lost_events())
            .map(|b| i64::from(b.cpu()))
            .collect();
        let rows: BTreeSet<i64> = tp
            .stats("data_loss")
            .into_iter()
            .filter(|(n, _, _)| n == "ftrace_cpu_has_data_loss")
            .filter_map(|(_, idx, _)| idx)
            .collect();
        assert_eq!(rows, lost_cpus, "CPUs trace processor marks as lossy");
        let tp_lost: i64 = tp
            .query(
                "select coalesce(sum(value), 0) from stats where name in \
                 ('ftrace_cpu_overrun_delta', 'ftrace_cpu_dropped_events_delta')",
            )
            .scalar()
            .int();
        assert_eq!(
            tp_lost as u64, lost,
            "kernel losses: trace processor vs summary"
        );
        assert_eq!(
            tp_lost as u64, per_cpu,
            "kernel losses: trace processor vs inspect"
        );
    }
}

/// Trace processor's `ftrace_event` table holds every event the trace's
/// bundles carry, as `recorder inspect` counts them, except the ones it
/// drops by design (each CPU's first compact sched_switch, which has no
/// previous task, and events from before tracing started), which it counts.
fn assert_ftrace_events_agree(tp: &crate::trace_processor::Tp, trace: &std::path::Path) {
    let inspect = std::process::Command::new(common::recorder_bin())
        .args(["inspect", "--json"])
        .arg(trace)
        .output()
        .expect("inspect runs");
    assert!(inspect.status.success());
    let j: serde_json::Value = serde_json::from_slice(&inspect.stdout).expect("json");
    let ours = j["ftrace"]["events"].as_i64().expect("ftrace events");
    let shown = tp.query("select count(*) from ftrace_event").scalar().int();
    let skipped = tp.stat("compact_sched_switch_skipped", None)
        + tp.stat("compact_sched_waking_skipped", None)
        + tp.stat("ftrace_packet_before_tracing_start", None);
    assert_eq!(
        shown + skipped,
        ours,
        "{}: ftrace_event rows ({shown}) + skipped ({skipped}) vs inspect",
        trace.display()
    );
}

/// Scheduling recorded on the binary, as trace processor shows it: two named
/// threads of this process bounce a byte; `sched` has slices for both with
/// their names, `thread_state` has them running and sleeping, and the
/// process they belong to is this test with its command line (from
/// linux.process_stats). The `ftrace_event` rows agree with inspect.
#[test]
fn real_kernel_sched_in_trace_processor_has_thread_and_process_names() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (r1, w1) = rustix::pipe::pipe().expect("pipe");
    let (r2, w2) = rustix::pipe::pipe().expect("pipe");
    let rounds = 3000;
    let pong = std::thread::Builder::new()
        .name("tp-pong".into())
        .spawn(move || {
            let mut b = [0u8; 1];
            for _ in 0..rounds {
                rustix::io::read(&r1, &mut b).expect("read");
                rustix::io::write(&w2, &b).expect("write");
            }
            rustix::thread::gettid().as_raw_nonzero().get()
        })
        .expect("spawn");
    let ping = std::thread::Builder::new()
        .name("tp-ping".into())
        .spawn(move || {
            let mut b = [1u8; 1];
            // Named (and blocked) before the session starts, so its name is
            // already in the start's process scan: a scan racing a thread's
            // rename would otherwise keep the parent's name.
            go_rx.recv().expect("go");
            for _ in 0..rounds {
                rustix::io::write(&w1, &b).expect("write");
                rustix::io::read(&r2, &mut b).expect("read");
            }
            rustix::thread::gettid().as_raw_nonzero().get()
        })
        .expect("spawn");
    let dir = tempfile::tempdir().expect("tmp");
    let (mut rec, out) = Started::on_text(
        dir.path(),
        "sched",
        r#"
buffers { size_kb: 16384 }
data_sources { config { name: "linux.ftrace" ftrace_config {
  ftrace_events: "sched/sched_switch"
  ftrace_events: "sched/sched_waking"
  ftrace_events: "task/task_newtask"
  ftrace_events: "task/task_rename"
  drain_period_ms: 100
} } }
data_sources { config { name: "linux.process_stats" process_stats_config {
  scan_all_processes_on_start: true
  record_thread_names: true
} } }
duration_ms: 60000
"#,
    );
    go_tx.send(()).expect("go");
    let tids = [
        ("tp-ping", ping.join().expect("ping")),
        ("tp-pong", pong.join().expect("pong")),
    ];
    std::thread::sleep(Duration::from_millis(300));
    let log = rec.interrupt_and_wait();
    let Some(tp) = crate::trace_processor::check(&out) else {
        return;
    };
    assert_ftrace_events_agree(&tp, &out);
    let me = std::process::id();
    let cmdline: Vec<String> = std::env::args().collect();
    for (name, tid) in tids {
        let r = tp.query(&format!(
            "select t.name, p.pid, hex(p.cmdline) as c, count(*) as slices, sum(s.dur) as dur \
             from sched s join thread t using (utid) left join process p using (upid) \
             where t.tid = {tid} group by t.utid"
        ));
        let m = &r.maps()[0];
        assert_eq!(m["name"].text(), name, "tid {tid}");
        assert_eq!(
            m["pid"].int(),
            i64::from(me),
            "{name} belongs to this process"
        );
        assert_eq!(
            crate::trace_processor::unhex(m["c"].text()),
            cmdline.join(" "),
            "the process's command line"
        );
        // Every row of the tid is printed on failure: a thread split over
        // two utids would show here (seen once under a parallel full run:
        // 65 slices in the first row).
        // With the switches per CPU and the recorder's log (kernel losses,
        // drains): seen twice in full runs with 65 and 77 slices on one utid,
        // no trace processor error, the other thread passing.
        assert!(
            m["slices"].int() >= 100 && m["dur"].int() > 0,
            "{name}: {:?}\nsched_switch per cpu: {:?}\n{log}",
            r.maps(),
            tp.query("select cpu, count(*) as n from ftrace_event where name = 'sched_switch' group by cpu")
                .maps()
        );
        let states: BTreeSet<String> = tp
            .query(&format!(
                "select distinct state from thread_state join thread using (utid) where tid = {tid}"
            ))
            .column("state")
            .iter()
            .map(|v| v.text().to_string())
            .collect();
        assert!(
            states.contains("Running") && states.contains("S"),
            "{name} runs and sleeps: {states:?}"
        );
    }
}

/// The bundled configs that need root: long_trace (streamed, stopped with
/// SIGINT) and flight_recorder (stopped by its trigger) record traces trace
/// processor reads with no error stat, their scheduling events and process
/// data as recorded.
#[test]
fn bundled_root_configs_open_cleanly_in_trace_processor() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let configs = common::repo_root().join("configs");
    let tmp = tempfile::tempdir().expect("tmp");

    let out = tmp.path().join("long_trace.pftrace");
    let mut rec = Started::spawn(&configs.join("long_trace.cfg"), &out);
    ping_pong(2000);
    std::thread::sleep(Duration::from_millis(1200));
    rec.interrupt_and_wait();
    let p = decode(&std::fs::read(&out).expect("trace"));
    if let Some(tp) = crate::trace_processor::check(&out) {
        assert_ftrace_events_agree(&tp, &out);
        crate::trace_processor::assert_process_view(&tp, &p);
        assert!(tp.query("select count(*) from sched").scalar().int() > 0);
    }

    // The flight recorder, in a runtime directory of its own.
    let run_dir = tmp.path().join("run");
    let out = tmp.path().join("flight.pftrace");
    let recorder = |args: &[&str]| {
        std::process::Command::new(common::recorder_bin())
            .args(args)
            .env("RECORDER_RUNTIME_DIR", &run_dir)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("recorder runs")
    };
    let child = std::process::Command::new(common::recorder_bin())
        .arg("--config")
        .arg(configs.join("flight_recorder.cfg"))
        .arg("-o")
        .arg(&out)
        .env("RECORDER_RUNTIME_DIR", &run_dir)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("recorder starts");
    let sock = run_dir.join(format!("recorder-{}.trigger", child.id()));
    let t0 = std::time::Instant::now();
    while !sock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    ping_pong(2000);
    std::thread::sleep(Duration::from_millis(500));
    let t = recorder(&["trigger", "crash-detected"]);
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    let done = child.wait_with_output().expect("exits");
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let p = decode(&std::fs::read(&out).expect("trace"));
    if let Some(tp) = crate::trace_processor::check(&out) {
        assert_ftrace_events_agree(&tp, &out);
        crate::trace_processor::assert_process_view(&tp, &p);
        let trig = tp.triggers();
        assert_eq!(trig.len(), 1);
        assert_eq!(trig[0].0, "crash-detected");
    }
}

/// Records `spec` on the real kernel while `load` runs (given the instance
/// directory); returns the decoded packets and the summary.
pub(crate) fn record_spec(
    spec: FtraceSpec,
    load: impl FnOnce(&Tracefs),
) -> (Vec<TracePacket>, recorder::sources::ftrace::FtraceSummary) {
    let opts = FtraceOptions {
        spec,
        sequence_id: SEQ,
        ..Default::default()
    };
    let mut src = FtraceSource::new(opts, VecOutput::new()).expect("source");
    src.start().expect("start");
    let inst = src.tracefs_dir().expect("dir").clone();
    load(&inst);
    src.flush().expect("flush");
    let summary = src.stop().expect("stop");
    let out = src.take_output().expect("output");
    (decode(&out.bytes), summary)
}

/// `syscall_events`: raw_syscalls filtered in the kernel to the named
/// syscalls' numbers on this architecture; only those reach the trace, as
/// typed sys_enter/sys_exit events.
#[test]
fn real_kernel_syscall_events_are_filtered_in_the_kernel() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let nr = recorder::config::validate::syscall_number("sys_getppid").expect("getppid");
    let spec = FtraceSpec {
        syscall_events: vec![recorder::config::spec::Syscall {
            name: "sys_getppid".into(),
            number: nr,
        }],
        drain_period: Duration::from_millis(20),
        ..Default::default()
    };
    let me = rustix::thread::gettid().as_raw_nonzero().get();
    let (p, summary) = record_spec(spec, |inst| {
        assert_eq!(
            inst.read("events/raw_syscalls/sys_enter/filter")
                .expect("filter")
                .trim(),
            format!("id == {nr}")
        );
        for _ in 0..50 {
            let _ = rustix::process::getppid();
            // Other syscalls in between must not show.
            let _ = rustix::process::getpid();
            std::thread::sleep(Duration::from_micros(100));
        }
    });
    assert!(summary.unknown_events.is_empty());
    let ev = events(&p);
    let enters: Vec<_> = ev.iter().filter(|e| e.has_sys_enter()).collect();
    let exits: Vec<_> = ev.iter().filter(|e| e.has_sys_exit()).collect();
    assert!(
        enters.iter().all(|e| e.sys_enter().id() == i64::from(nr))
            && exits.iter().all(|e| e.sys_exit().id() == i64::from(nr)),
        "only getppid passes the kernel filter"
    );
    let mine = enters.iter().filter(|e| e.pid() as i32 == me).count();
    assert!(mine >= 50, "{mine} getppid entries of this thread");
    assert!(exits.iter().filter(|e| e.pid() as i32 == me).count() >= 50);
    // A name this architecture does not know is refused, by name.
    let e = recorder::config::load_text(
        r#"buffers { size_kb: 64 } data_sources { config { name: "linux.ftrace" ftrace_config { syscall_events: "sys_nope" } } }"#,
        "t",
        false,
    )
    .and_then(|l| l.validate())
    .expect_err("unknown syscall")
    .to_string();
    assert!(
        e.contains(
            "data_sources[0].config.ftrace_config.syscall_events: unknown syscall \"sys_nope\""
        ),
        "{e}"
    );
}

/// `tids_to_trace` through the kernel's `set_event_pid` (Perfetto's
/// mechanism): only the listed thread's own events, sched_switch in or out
/// of it and wakeups of it reach the trace.
#[test]
fn real_kernel_tids_to_trace() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let me = rustix::thread::gettid().as_raw_nonzero().get();
    let spec = FtraceSpec {
        events: vec![
            "sched/sched_switch".into(),
            "sched/sched_waking".into(),
            "sched/sched_process_exit".into(),
        ],
        compact_sched: false,
        tids_to_trace: vec![me as u32],
        drain_period: Duration::from_millis(20),
        ..Default::default()
    };
    let mut other = 0;
    let (p, _) = record_spec(spec, |inst| {
        assert_eq!(
            inst.read("set_event_pid").expect("pids").trim(),
            me.to_string()
        );
        let (_, b) = ping_pong_with(500, true);
        other = b;
    });
    let ev = events(&p);
    assert!(!ev.is_empty());
    let mut saw_other_woken = false;
    for e in &ev {
        let about_me = e.pid() as i32 == me
            || (e.has_sched_switch()
                && (e.sched_switch().prev_pid() == me || e.sched_switch().next_pid() == me))
            || (e.has_sched_waking() && e.sched_waking().pid() == me);
        assert!(about_me, "an event of another thread: {e:?}");
        saw_other_woken |= e.has_sched_waking() && e.sched_waking().pid() == other;
    }
    // This thread woke the other one: its own event, kept.
    assert!(saw_other_woken, "the wakeups this thread caused");
    // A thread of another process, never about this one, is absent.
    assert!(
        ev.iter().all(|e| e.pid() as i32 != other
            || (e.has_sched_switch() && e.sched_switch().next_pid() == me)
            || (e.has_sched_waking() && e.sched_waking().pid() == me)),
        "events of the other thread about itself only"
    );
}

/// Where the kernel refuses `set_event_pid`, the encoder filters with the
/// same rule: the current thread, or a thread the event is about.
#[test]
fn tids_to_trace_in_user_space_keeps_what_the_kernel_would() {
    let (l, table) = fixture_table(false);
    let mut pages = raw("cpu0.raw");
    pages.extend(raw("cpu1.raw"));
    let (all, _) = encode(&pages, false, &PrintFilter::default());
    let all = events(&all);
    let tid = all
        .iter()
        .find(|e| e.has_sched_switch())
        .map(|e| e.sched_switch().next_pid())
        .expect("a switch");
    let mut out = VecOutput::new();
    let mut enc = BundleEncoder::new(SEQ, 16 * 1024);
    enc.set_tid_filter(&[tid as u32]);
    enc.encode_pages(
        &mut out,
        &table,
        &PrintFilter::default(),
        &l,
        &mut CpuCursor {
            cpu: 3,
            ..Default::default()
        },
        &pages,
    );
    let kept = events(&decode(&out.bytes));
    // The current thread, or a thread the event names.
    let about = |e: &FtraceEvent| {
        let named = [
            e.has_sched_switch().then(|| e.sched_switch().prev_pid()),
            e.has_sched_switch().then(|| e.sched_switch().next_pid()),
            e.has_sched_wakeup().then(|| e.sched_wakeup().pid()),
            e.has_sched_waking().then(|| e.sched_waking().pid()),
            e.has_sched_wakeup_new().then(|| e.sched_wakeup_new().pid()),
            e.has_sched_process_exit()
                .then(|| e.sched_process_exit().pid()),
            e.has_sched_process_free()
                .then(|| e.sched_process_free().pid()),
            e.has_sched_process_exec()
                .then(|| e.sched_process_exec().pid()),
            e.has_sched_process_fork()
                .then(|| e.sched_process_fork().parent_pid()),
            e.has_sched_process_fork()
                .then(|| e.sched_process_fork().child_pid()),
            e.has_task_newtask().then(|| e.task_newtask().pid()),
            e.has_task_rename().then(|| e.task_rename().pid()),
            e.has_sched_blocked_reason()
                .then(|| e.sched_blocked_reason().pid()),
            e.has_sched_process_wait()
                .then(|| e.sched_process_wait().pid()),
            e.has_sched_process_hang()
                .then(|| e.sched_process_hang().pid()),
            e.has_oom_score_adj_update()
                .then(|| e.oom_score_adj_update().pid()),
        ];
        e.pid() as i32 == tid || named.contains(&Some(tid))
    };
    let want: Vec<&FtraceEvent> = all.iter().filter(|e| about(e)).collect();
    assert!(!want.is_empty() && want.len() < all.len());
    assert_eq!(kept.len(), want.len());
    assert!(
        kept.iter()
            .zip(&want)
            .all(|(a, b)| a.to_string() == b.to_string())
    );
    assert_eq!(enc.stats.filtered_tids as usize, all.len() - want.len());
}

/// `use_monotonic_raw_clock`: the instance's trace_clock is mono_raw, every
/// bundle says so, and timestamps are CLOCK_MONOTONIC_RAW readings.
#[test]
fn real_kernel_monotonic_raw_clock() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let raw_now = || {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicRaw);
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    };
    let spec = FtraceSpec {
        events: vec!["sched/sched_switch".into()],
        compact_sched: false,
        use_monotonic_raw_clock: true,
        drain_period: Duration::from_millis(20),
        ..Default::default()
    };
    let mut window = (0, 0);
    let (p, _) = record_spec(spec, |inst| {
        assert!(
            inst.read("trace_clock")
                .expect("clock")
                .contains("[mono_raw]")
        );
        window.0 = raw_now();
        ping_pong(200);
        window.1 = raw_now();
    });
    let b = bundles(&p);
    assert!(!b.is_empty());
    assert!(b.iter().all(|b| b.ftrace_clock()
        == perfetto_protos::ftrace_event_bundle::FtraceClock::FTRACE_CLOCK_MONO_RAW));
    let ev = events(&p);
    let inside = ev
        .iter()
        .filter(|e| (window.0..=window.1).contains(&e.timestamp()))
        .count();

    assert!(
        inside >= 200,
        "{inside} switches inside the MONOTONIC_RAW window"
    );
}

/// `preserve_ftrace_buffer`: what an existing instance recorded before the
/// session starts is kept (and FtraceStats says so); by default it is
/// cleared.
#[test]
fn real_kernel_preserve_ftrace_buffer() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let top = Tracefs::discover().expect("tracefs");
    for preserve in [true, false] {
        let name = format!("recorder-preserve-test-{}", std::process::id());
        let inst = top.instance(&name);
        std::fs::create_dir(inst.root()).expect("instance");
        inst.write("trace_clock", "boot").expect("clock");
        inst.write("tracing_on", "1").expect("on");
        inst.write("trace_marker", "before the session")
            .expect("marker");
        let spec = FtraceSpec {
            events: vec!["ftrace/print".into()],
            instance_name: Some(name.clone()),
            preserve_ftrace_buffer: preserve,
            ..Default::default()
        };
        let (p, _) = record_spec(spec, |inst| {
            inst.write("trace_marker", "during the session")
                .expect("marker");
        });
        std::fs::remove_dir(inst.root()).expect("instance removed");
        let prints: Vec<String> = events(&p)
            .iter()
            .filter(|e| e.has_print())
            .map(|e| e.print().buf().to_string())
            .collect();
        assert!(
            prints.contains(&"during the session\n".to_string()),
            "{prints:?}"
        );
        assert_eq!(
            prints.contains(&"before the session\n".to_string()),
            preserve,
            "preserve {preserve}: {prints:?}"
        );
        let stats = p.iter().find(|p| p.has_ftrace_stats()).expect("stats");
        assert_eq!(stats.ftrace_stats().preserve_ftrace_buffer(), preserve);
    }
}

/// `throttle_rss_stat` records kmem/rss_stat where the kernel has no
/// throttled variant; `disable_generic_events` leaves events without a
/// typed message disabled; `tracefs_options` set for the session and put
/// back; `buffer_size_lower_bound` keeps the default size when larger.
#[test]
fn real_kernel_event_choice_options_and_buffer_bound() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let top = Tracefs::discover().expect("tracefs");
    let throttled = top.path("events/kmem/rss_stat_throttled").is_dir();
    let spec = FtraceSpec {
        events: vec![
            "kmem/rss_stat".into(),
            "sched/sched_switch".into(),
            "sched/sched_stat_runtime".into(),
        ],
        throttle_rss_stat: true,
        disable_generic_events: true,
        tracefs_options: vec![("event-fork".into(), true)],
        buffer_size: Some(ByteSize::from_kb(64)),
        buffer_size_lower_bound: true,
        ..Default::default()
    };
    let (p, _) = record_spec(spec, |inst| {
        let on = |e: &str| {
            inst.read(&format!("events/{e}/enable"))
                .expect("enable")
                .trim()
                == "1"
        };
        assert_eq!(on("kmem/rss_stat"), !throttled);
        assert!(on("sched/sched_switch"));
        assert!(!on("sched/sched_stat_runtime"), "generic events stay off");
        assert_eq!(inst.read("options/event-fork").expect("option").trim(), "1");
        let kb: u32 = inst
            .read("buffer_size_kb")
            .expect("size")
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .expect("kb");
        assert!(
            kb >= 4096,
            "the default size wins over a 64 KiB lower bound: {kb}"
        );
        let v: Vec<u8> = vec![7; 8 << 20];
        std::hint::black_box(v);
    });
    assert!(events(&p).iter().all(|e| !e.has_generic()));
    // A trace option the kernel lacks is refused by name.
    let mut src = FtraceSource::new(
        FtraceOptions {
            spec: FtraceSpec {
                events: vec!["sched/sched_switch".into()],
                tracefs_options: vec![("no-such-option".into(), true)],
                ..Default::default()
            },
            ..Default::default()
        },
        VecOutput::new(),
    )
    .expect("source");
    let e = src.start().expect_err("refused").to_string();
    assert!(e.contains("no trace option \"no-such-option\""), "{e}");
}

/// function_graph and kprobes: where the kernel has them they record; where
/// it does not (this machine: no function_graph tracer, no kprobe_events,
/// set_ftrace_filter refused) the source says exactly which part and why,
/// and tracefs is left as found.
#[test]
fn real_kernel_function_graph_and_kprobes_work_or_say_why() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let top = Tracefs::discover().expect("tracefs");
    let tracers = top.read("available_tracers").unwrap_or_default();
    let spec = FtraceSpec {
        enable_function_graph: true,
        function_filters: vec!["vfs_read".into()],
        ..Default::default()
    };
    let mut src = FtraceSource::new(
        FtraceOptions {
            spec,
            ..Default::default()
        },
        VecOutput::new(),
    )
    .expect("source");
    match src.start() {
        Ok(()) => {
            assert!(tracers.contains("function_graph"));
            let _ = std::fs::read("/proc/self/stat");
            let _ = src.stop();
        }
        Err(e) => {
            let e = e.to_string();
            if tracers.split_whitespace().any(|t| t == "function_graph") {
                assert!(e.starts_with("function_filters: "), "{e}");
            } else {
                assert!(
                    e.contains("enable_function_graph: this kernel has no function_graph tracer (available_tracers: "),
                    "{e}"
                );
            }
        }
    }
    drop(src);
    let spec = FtraceSpec {
        events: vec!["sched/sched_switch".into()],
        kprobe_events: vec![recorder::config::spec::KprobeSpec {
            function: "vfs_read".into(),
            kind: recorder::config::spec::KprobeKind::Kprobe,
        }],
        ..Default::default()
    };
    let (p, summary) = record_spec(spec, |_| {
        let _ = std::fs::read("/proc/self/stat");
    });
    let group = format!("recorder_{}", std::process::id());
    if top.path("kprobe_events").is_file() {
        assert!(
            summary.failed_events.is_empty(),
            "{:?}",
            summary.failed_events
        );
        assert!(events(&p).iter().any(|e| e.has_generic()), "kprobe hits");
        assert!(
            !top.read("kprobe_events")
                .unwrap_or_default()
                .contains(&group)
        );
    } else {
        assert_eq!(summary.failed_events, [format!("{group}/vfs_read")]);
        let end = p
            .iter()
            .rev()
            .find(|p| p.has_ftrace_stats())
            .expect("end stats");
        assert_eq!(
            end.ftrace_stats().failed_ftrace_events,
            [format!("{group}/vfs_read")]
        );
    }
}

/// clear_incremental_state on the running source: the next bundle (and
/// only it) carries SEQ_INCREMENTAL_STATE_CLEARED, and every bundle before
/// and after decodes whole, compact_sched intern tables resolving within
/// their own bundle.
#[test]
fn real_kernel_ftrace_clears_incremental_state() {
    if common::skip_unless(kernel_missing()) {
        return;
    }
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let opts = FtraceOptions {
        spec: FtraceSpec {
            events: vec!["sched/sched_switch".into(), "sched/sched_waking".into()],
            drain_period: Duration::from_secs(30),
            ..Default::default()
        },
        sequence_id: SEQ,
        ..Default::default()
    };
    let mut src = FtraceSource::new(opts, VecOutput::new()).expect("source");
    src.start().expect("start");
    ping_pong(300);
    src.flush().expect("flush");
    src.clear_incremental_state().expect("clear");
    ping_pong(300);
    src.flush().expect("flush");
    src.stop().expect("stop");
    let p = decode(&src.take_output().expect("output").bytes);
    let flagged: Vec<usize> = p
        .iter()
        .enumerate()
        .filter(|(_, p)| p.sequence_flags() & 1 != 0)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(flagged.len(), 1, "one bundle says the state was cleared");
    let first_bundle = p
        .iter()
        .position(|p| p.has_ftrace_events())
        .expect("bundles");
    assert!(
        flagged[0] > first_bundle,
        "after the bundles of the first drain"
    );
    assert!(p[flagged[0]].has_ftrace_events());
    for b in bundles(&p) {
        let cs = &b.compact_sched;
        let n = cs.intern_table.len() as u32;
        assert!(cs.switch_next_comm_index.iter().all(|i| *i < n));
        assert!(cs.waking_comm_index.iter().all(|i| *i < n));
    }
}

/// One encoding of captured pages whose exact bytes are kept in
/// `tests/fixtures/ftrace/golden/` (zstd): the encoder's output, byte for
/// byte, as the earlier field-by-field encoder wrote it, and the thread ids
/// it reported.
struct GoldenCase {
    name: &'static str,
    pages: &'static [&'static str],
    compact: bool,
    max_packet: usize,
    tids: &'static [u32],
    clock_and_clear: bool,
}

const GOLDEN: &[GoldenCase] = &[
    GoldenCase {
        name: "mixed_typed",
        pages: &["cpu0.raw", "cpu1.raw", "gap_cpu0.raw", "lossy_cpu0.raw"],
        compact: false,
        max_packet: 16 * 1024,
        tids: &[],
        clock_and_clear: false,
    },
    GoldenCase {
        name: "mixed_compact",
        pages: &["cpu0.raw", "cpu1.raw", "gap_cpu0.raw", "lossy_cpu0.raw"],
        compact: true,
        max_packet: 16 * 1024,
        tids: &[],
        clock_and_clear: false,
    },
    GoldenCase {
        name: "pingpong_typed",
        pages: &["pingpong_cpu0.raw", "pingpong_cpu1.raw"],
        compact: false,
        max_packet: 32 * 1024,
        tids: &[],
        clock_and_clear: true,
    },
    GoldenCase {
        name: "pingpong_compact",
        pages: &["pingpong_cpu0.raw", "pingpong_cpu1.raw"],
        compact: true,
        max_packet: 16 * 1024,
        tids: &[],
        clock_and_clear: true,
    },
    GoldenCase {
        name: "mixed_tids",
        pages: &["cpu0.raw", "cpu1.raw", "pingpong_cpu0.raw"],
        compact: true,
        max_packet: 16 * 1024,
        tids: &[72, 7824, 0x4b69],
        clock_and_clear: false,
    },
];

fn golden_encode(c: &GoldenCase) -> (Vec<u8>, Vec<i32>) {
    let (l, table) = fixture_table(c.compact);
    let pages: Vec<u8> = c.pages.iter().flat_map(|p| raw(p)).collect();
    let mut out = VecOutput::new();
    let mut enc = BundleEncoder::new(SEQ, c.max_packet);
    if !c.tids.is_empty() {
        enc.set_tid_filter(c.tids);
    }
    if c.clock_and_clear {
        enc.set_ftrace_clock(4);
        enc.clear_incremental_state();
    }
    let mut cur = CpuCursor {
        cpu: 3,
        ..Default::default()
    };
    // Two drains: bundles and the pid report continue across calls.
    let half = pages.len() / l.page_size() / 2 * l.page_size();
    let mut pids = Vec::new();
    for part in [&pages[..half], &pages[half..]] {
        enc.encode_pages(
            &mut out,
            &table,
            &PrintFilter::default(),
            &l,
            &mut cur,
            part,
        );
        let mut p = Vec::new();
        enc.take_pids(&mut p);
        pids.extend(p);
        pids.push(-1);
    }
    (out.bytes, pids)
}

/// Every golden case encodes to exactly the bytes kept, which the
/// independent decoder reads. `RECORDER_UPDATE_GOLDEN=1` rewrites them
/// (only after a deliberate change of the output).
#[test]
fn encoder_output_is_byte_identical_to_the_golden_files() {
    let dir = fixtures().join("golden");
    let update = std::env::var_os("RECORDER_UPDATE_GOLDEN").is_some_and(|v| v == "1");
    for c in GOLDEN {
        let (bytes, pids) = golden_encode(c);
        let pid_text: String = pids.iter().map(|p| format!("{p}\n")).collect();
        let bin = dir.join(format!("{}.pb.zst", c.name));
        let txt = dir.join(format!("{}.pids", c.name));
        if update {
            std::fs::create_dir_all(&dir).expect("golden dir");
            std::fs::write(&bin, zstd::encode_all(&bytes[..], 19).expect("zstd")).expect("write");
            std::fs::write(&txt, &pid_text).expect("write");
        }
        let want = zstd::decode_all(&std::fs::read(&bin).expect("golden file")[..]).expect("zstd");
        let p = decode(&want);
        assert!(
            !events(&p).is_empty() || !bundles(&p).is_empty(),
            "{}",
            c.name
        );
        if bytes != want {
            let at = bytes.iter().zip(&want).position(|(a, b)| a != b);
            panic!(
                "{}: {} bytes against the golden {}, first difference at {at:?}",
                c.name,
                bytes.len(),
                want.len()
            );
        }
        assert_eq!(
            pid_text,
            std::fs::read_to_string(&txt).expect("golden pids"),
            "{}",
            c.name
        );
    }
}

/// tracefs where the kernel has `buffer_subbuf_size_kb` (Linux 6.8+), or
/// `None` having said why the test skips.
fn subbuf_tracefs() -> Option<Tracefs> {
    if common::skip_unless(kernel_missing()) {
        return None;
    }
    let top = Tracefs::discover().expect("tracefs");
    let missing = top
        .read("buffer_subbuf_size_kb")
        .err()
        .map(|_| "this kernel has no buffer_subbuf_size_kb (Linux 6.8+)".to_string());
    (!common::skip_unless(missing)).then_some(top)
}

/// A sub-buffer size the kernel refuses (this one takes at most 512 KiB) is
/// an error naming the setting when it was asked for, and nothing is left
/// behind; the recorder's own choice never asks for more than 16 KiB.
#[test]
fn real_kernel_a_refused_sub_buffer_size_is_a_clear_error() {
    let Some(top) = subbuf_tracefs() else {
        return;
    };
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let before: BTreeSet<String> = std::fs::read_dir(top.path("instances"))
        .expect("instances")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let opts = FtraceOptions {
        spec: FtraceSpec {
            events: vec!["sched/sched_switch".into()],
            buffer_size: Some(ByteSize::from_kb(8192)),
            ..Default::default()
        },
        sequence_id: SEQ,
        subbuf: SubbufSize::Kb(subbuf::MAX_SUBBUF_KB),
        ..Default::default()
    };
    let mut src = FtraceSource::new(opts, VecOutput::new()).expect("source");
    let err = match src.start() {
        Ok(()) => {
            let _ = src.stop();
            // A kernel that takes it has nothing to refuse.
            assert!(
                !common::kernel_required(),
                "this kernel takes {} KiB sub-buffers: the test needs another size",
                subbuf::MAX_SUBBUF_KB
            );
            return;
        }
        Err(e) => e.to_string(),
    };
    assert!(err.contains("buffer_subbuf_size_kb"), "{err}");
    drop(src);
    let after: BTreeSet<String> = std::fs::read_dir(top.path("instances"))
        .expect("instances")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            before.contains(n) || n.starts_with(&format!("recorder-{}", std::process::id()))
        })
        .collect();
    assert!(after.is_subset(&before), "instances left: {after:?}");
}

/// A named instance that already existed keeps its own sub-buffer size: the
/// recording changes it and puts it back, and leaves the instance there.
#[test]
fn real_kernel_a_named_instance_gets_its_sub_buffer_size_back() {
    let Some(top) = subbuf_tracefs() else {
        return;
    };
    let _one_at_a_time = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let name = format!("named-subbuf-{}", std::process::id());
    let inst = top.instance(&name);
    std::fs::create_dir(inst.root()).expect("make the instance");
    inst.write("buffer_subbuf_size_kb", "8").expect("8 KiB");
    let opts = FtraceOptions {
        spec: FtraceSpec {
            events: vec!["sched/sched_switch".into()],
            buffer_size: Some(ByteSize::from_kb(4096)),
            instance_name: Some(name.clone()),
            compact_sched: false,
            ..Default::default()
        },
        sequence_id: SEQ,
        ..Default::default()
    };
    let mut src = FtraceSource::new(opts, VecOutput::new()).expect("source");
    src.start().expect("start");
    let during = inst.read("buffer_subbuf_size_kb").expect("during");
    let _ = ping_pong(200);
    src.stop().expect("stop");
    let events = events(&decode(&src.take_output().expect("output").bytes)).len();
    let after = inst.read("buffer_subbuf_size_kb").expect("after");
    let _ = std::fs::remove_dir(inst.root());
    assert_eq!(during.trim(), subbuf::DEFAULT_SUBBUF_KB.to_string());
    assert_eq!(after.trim(), "8", "the instance's own size is put back");
    assert!(events > 0, "recorded in the named instance");
}
