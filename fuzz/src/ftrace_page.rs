//! Oracle for the raw ftrace page walker and bundle encoder: no panic; every
//! event the walker yields lies inside the page's committed data; and the
//! number of events agrees between a bare walk and a full encoding walk
//! (typed, compact_sched and generic decoding), whatever the bytes.

use recorder::sources::ftrace::VecOutput;
use recorder::sources::ftrace::encode::{BundleEncoder, CpuCursor, PrintFilter};
use recorder::sources::ftrace::event_table::EventTable;
use recorder::sources::ftrace::format::{PageLayout, parse_event_format, parse_header_page};
use recorder::sources::ftrace::page::{EventIter, parse_header};

const FORMATS: &[(&str, &str)] = &[
    (
        "sched",
        include_str!("../../tests/fixtures/ftrace/tree/events/sched/sched_switch/format"),
    ),
    (
        "sched",
        include_str!("../../tests/fixtures/ftrace/tree/events/sched/sched_wakeup/format"),
    ),
    (
        "sched",
        include_str!("../../tests/fixtures/ftrace/tree/events/sched/sched_waking/format"),
    ),
    (
        "sched",
        include_str!("../../tests/fixtures/ftrace/tree/events/sched/sched_process_exec/format"),
    ),
    (
        "sched",
        include_str!("../../tests/fixtures/ftrace/tree/events/sched/sched_process_fork/format"),
    ),
    (
        "sched",
        include_str!("../../tests/fixtures/ftrace/tree/events/sched/sched_process_wait/format"),
    ),
    (
        "ftrace",
        include_str!("../../tests/fixtures/ftrace/tree/events/ftrace/print/format"),
    ),
    (
        "power",
        include_str!("../../tests/fixtures/ftrace/tree/events/power/cpu_idle/format"),
    ),
    // Not typed under this group name: exercises the generic encoding.
    (
        "other",
        include_str!("../../tests/fixtures/ftrace/tree/events/irq/softirq_entry/format"),
    ),
];
const HEADER_PAGE: &str = include_str!("../../tests/fixtures/ftrace/tree/events/header_page");
const MAX_PAGES: usize = 4;

fn table(compact: bool) -> EventTable {
    let mut t = EventTable::new();
    for (g, f) in FORMATS {
        t.insert(
            parse_event_format(g, f).expect("fixture formats parse"),
            compact,
        );
    }
    t
}

fn layout() -> PageLayout {
    parse_header_page(HEADER_PAGE).expect("fixture header_page parses")
}

/// Panics when the oracle is violated.
pub fn check(data: &[u8]) {
    let l = layout();
    let ps = l.page_size();
    let n_pages = data.len().div_ceil(ps).clamp(1, MAX_PAGES);
    let mut pages = data[..data.len().min(n_pages * ps)].to_vec();
    pages.resize(n_pages * ps, 0);

    // Walk 1: the bare walker, bounds checked against the header.
    let mut total = 0usize;
    for page in pages.chunks_exact(ps) {
        let Ok(h) = parse_header(page, &l) else {
            continue;
        };
        assert!(h.data_len <= l.data_size);
        for e in EventIter::new(page, &l, &h) {
            let Ok(e) = e else { break };
            let end = e.offset + e.payload.len();
            assert!(
                e.offset >= l.data_offset && end <= l.data_offset + h.data_len,
                "event outside the data"
            );
            assert_eq!(&page[e.offset..end], e.payload);
            total += 1;
        }
    }

    // Walk 2: full decoding and encoding, with and without compact_sched.
    for compact in [false, true] {
        let t = table(compact);
        let mut out = VecOutput::new();
        let mut enc = BundleEncoder::new(2, 16 * 1024);
        let mut cur = CpuCursor::default();
        enc.encode_pages(&mut out, &t, &PrintFilter::default(), &l, &mut cur, &pages);
        let s = &enc.stats;
        let seen = s.events + s.unknown_ids + s.filtered_prints + s.oversized_events;
        assert_eq!(seen as usize, total, "compact={compact}: {s:?}");
        // Output framing is whole packets: tag 0x0a, varint length, bytes.
        let mut p = 0;
        let b = &out.bytes;
        while p < b.len() {
            assert_eq!(b[p], 0x0a);
            p += 1;
            let mut len = 0usize;
            let mut shift = 0;
            loop {
                let c = b[p];
                p += 1;
                len |= ((c & 0x7f) as usize) << shift;
                shift += 7;
                if c & 0x80 == 0 {
                    break;
                }
            }
            assert!(len <= 16 * 1024);
            p += len;
        }
        assert_eq!(p, b.len());
    }
}
