//! linux.ftrace encoding without a kernel: formats and raw pages captured on
//! a real kernel (`tests/fixtures/ftrace/`), bundles decoded with the
//! independent decoder (`perfetto_protos`) and compared field by field,
//! synthetic pages, bundle sizes, the stats packet, and byte-identical
//! golden files.

use std::collections::BTreeSet;
use std::sync::Arc;

use perfetto_protos::trace_packet::TracePacket;
use protobuf::Message;

use recorder::sources::ftrace::encode::{BundleEncoder, CpuCursor};
use recorder::sources::ftrace::event_table::EventTable;
use recorder::sources::ftrace::page::build::PageBuilder;
use recorder::sources::ftrace::page::{EventIter, parse_header};
use recorder::sources::ftrace::stats::{CpuStats, Phase, StatsReport, encode_stats_packet};
use recorder::sources::ftrace::tracefs::Tracefs;
use recorder::sources::ftrace::{
    PacketOutput, PrintFilter, PrintMatch, PrintRule, VecOutput, resolve_event,
};

use crate::harness::ftrace::{SEQ, bundles, decode, encode, events, fixture_table, fixtures, raw};

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// What one flush of `buffer` hands the file, which must have lost
/// nothing.
fn flushed_without_loss(buffer: &Arc<recorder::ringbuf::Buffer>) -> Vec<u8> {
    use recorder::ringbuf::FlushItem;
    let batch = buffer.take_flush();
    let mut file = Vec::new();
    for item in batch.items() {
        match item {
            FlushItem::Data(d) => file.extend_from_slice(d),
            FlushItem::Loss { .. } => panic!("nothing was lost"),
        }
    }
    batch.release();
    file
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
    let no_filter = PrintFilter::default();
    enc.encode_pages(&mut out, &table, &no_filter, &l, &mut cur, &pages);
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
    use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, WriterId};
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
    let file = flushed_without_loss(&buffer);
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
    use recorder::ringbuf::{Buffer, BufferParams, FillPolicy, WriterId};
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
    let file = flushed_without_loss(&buffer);
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
