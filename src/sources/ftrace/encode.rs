//! Raw pages → `TracePacket { ftrace_events: FtraceEventBundle }`, encoded in
//! place into the space a [`PacketOutput`] lends, with no allocation per
//! event (the compact_sched columns live in scratch buffers reused across
//! bundles).
//!
//! ```text
//!  TracePacket
//!   ├ 10 trusted_packet_sequence_id
//!   └ 1 ftrace_events (FtraceEventBundle)
//!        ├ 1 cpu
//!        ├ 10 previous_bundle_end_timestamp
//!        ├ 2 event*  (FtraceEvent: 1 timestamp, 2 pid, N typed | 327 generic)
//!        ├ 4 compact_sched (packed columns + intern_table)
//!        └ 3 lost_events
//! ```

use super::event_table::{
    CompactPlan, EventEntry, EventTable, IntAt, TextAt, TypedOp, TypedPlan, WakeupPlan, comm16,
};
use super::format::{FieldKind, PageLayout, read_int, read_str, read_uint};
use super::page::{EventIter, PageError, PageHeader, RawEvent, parse_header};
use super::watch::Watch;
use crate::sources::output::PacketOutput;
use crate::trace::encoder::{
    ProtoEncoder, Short, ShortWriter, WINDOW_MAX_LEN, WINDOW_SPAN, Window,
};
use crate::wire::{
    compact_sched as cs, ftrace_event, ftrace_event_bundle as feb, generic_field,
    generic_ftrace_event as gfe, trace_packet, varint,
};

/// The most a typed event's header takes before its message: the event's
/// key and one-byte length, the timestamp and the pid (keys and varints).
const EVENT_HEAD_MAX: usize = 2 + (1 + 10) + (1 + 10);

/// Room kept free in a bundle for its trailer (compact header, lost flag,
/// nested lengths).
const TRAILER_BYTES: usize = 64;
/// Worst case one compact event adds: five 10-byte varints and a new
/// interned comm.
const COMPACT_EVENT_MAX: usize = 5 * 10 + 2 + 16;
/// Smallest bundle started in what is left of the output's current region
/// (see [`PacketOutput::begin`]): a region is left once less than this is
/// free, so this bounds the padding at its end. Roomy enough for the trailer
/// reserves and dozens of events; an event that still does not fit an empty
/// bundle this short is retried in a full-size one.
pub const MIN_BUNDLE_BYTES: usize = 4 * 1024;
/// Interned comms per bundle before it is closed.
const MAX_INTERNED: usize = 256;
/// Slots of the intern index: a power of two, at most half full.
const INTERN_SLOTS: usize = 2 * MAX_INTERNED;
/// A comm length no comm has (at most 16): an empty place of the recent pair.
const NO_COMM: u8 = u8::MAX;

pub use crate::config::spec::{PrintFilter, PrintMatch, PrintRule};

/// Counters of the encoder, summed over the recording.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EncodeStats {
    /// Pages walked.
    pub pages: u64,
    /// Events written, in any form.
    pub events: u64,
    /// Events written as their Perfetto typed message.
    pub typed_events: u64,
    /// sched_switch and sched_waking events written into compact_sched.
    pub compact_events: u64,
    /// Events written as generic events (no typed message in Perfetto).
    pub generic_events: u64,
    /// Records whose id is not in the table (not enabled by us).
    pub unknown_ids: u64,
    /// Prints the print filter dropped.
    pub filtered_prints: u64,
    /// Events of other threads dropped by the user-space tid filter.
    pub filtered_tids: u64,
    /// Events larger than a whole packet, dropped.
    pub oversized_events: u64,
    /// FtraceEventBundle packets committed.
    pub bundles: u64,
    /// Bundles lost because the output had no space.
    pub dropped_bundles: u64,
    /// Pages with the kernel's RB_MISSED_EVENTS flag.
    pub lost_pages: u64,
    /// Events the kernel reported missing (when it stored the count).
    pub lost_events: u64,
    /// Per Perfetto `FtraceParseStatus` value.
    pub parse_errors: [u64; 18],
}

/// Per-CPU state carried from one bundle to the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCursor {
    /// The CPU whose pages this follows.
    pub cpu: u32,
    /// Timestamp of the last event of the previous bundle on this CPU.
    pub prev_bundle_end_ts: u64,
    /// Last timestamp seen on this CPU (monotonicity check).
    pub last_ts: u64,
}

/// One packed column: varints appended into a buffer that is only ever
/// grown, each written through a window with room for the longest varint.
#[derive(Default)]
struct Column {
    buf: Vec<u8>,
    len: usize,
}

impl Column {
    /// Appends `v`; the bytes it took.
    #[inline(always)]
    fn push(&mut self, v: u64) -> usize {
        if let Some(w) = self.buf[self.len..].first_chunk_mut::<{ varint::MAX_LEN }>() {
            let n = varint::put_max(w, v);
            self.len += n;
            return n;
        }
        self.grow_and_push(v)
    }

    #[cold]
    fn grow_and_push(&mut self, v: u64) -> usize {
        self.buf.resize((2 * self.buf.len()).max(1024), 0);
        self.push(v)
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn clear(&mut self) {
        self.len = 0;
    }
}

/// Packed compact_sched columns of the bundle being written.
#[derive(Default)]
struct CompactCols {
    switch_ts: Column,
    switch_prev_state: Column,
    switch_next_pid: Column,
    switch_next_prio: Column,
    switch_comm: Column,
    waking_ts: Column,
    waking_pid: Column,
    waking_target_cpu: Column,
    waking_prio: Column,
    waking_comm: Column,
    waking_flags: Column,
    last_switch_ts: u64,
    last_waking_ts: u64,
    /// Interned comms (NUL-padded to 16 bytes, compared as one u128).
    intern: Vec<(u128, u8)>,
    /// Open-addressed index into `intern` (slot = index + 1, 0 = free):
    /// a bundle's few hundred comms are found in one or two probes.
    intern_slots: Vec<u16>,
    intern_bytes: usize,
    /// The last two comms interned, with their indices (a length of
    /// `NO_COMM` marks an empty place): a CPU's switches alternate between
    /// few threads, so most lookups end here without hashing.
    recent: [(u128, u8, u32); 2],
    /// Bytes in all the columns (kept as they grow: checked on every event).
    col_bytes: usize,
}

impl CompactCols {
    fn new() -> Self {
        Self {
            intern_slots: vec![0; INTERN_SLOTS],
            recent: [(0, NO_COMM, 0); 2],
            ..Default::default()
        }
    }

    fn clear(&mut self) {
        for c in self.cols_mut() {
            c.clear();
        }
        self.intern.clear();
        self.intern_slots.fill(0);
        self.intern_bytes = 0;
        self.recent = [(0, NO_COMM, 0); 2];
        self.col_bytes = 0;
        self.last_switch_ts = 0;
        self.last_waking_ts = 0;
    }

    fn cols_mut(&mut self) -> [&mut Column; 11] {
        [
            &mut self.switch_ts,
            &mut self.switch_prev_state,
            &mut self.switch_next_pid,
            &mut self.switch_next_prio,
            &mut self.switch_comm,
            &mut self.waking_ts,
            &mut self.waking_pid,
            &mut self.waking_target_cpu,
            &mut self.waking_prio,
            &mut self.waking_comm,
            &mut self.waking_flags,
        ]
    }

    fn is_empty(&self) -> bool {
        self.switch_ts.is_empty() && self.waking_ts.is_empty()
    }

    /// Upper bound of the encoded compact_sched field.
    fn encoded_len(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        // Each column present has a tag and a 4-byte length.
        let switch = if self.switch_ts.is_empty() { 0 } else { 5 * 6 };
        let waking = if self.waking_ts.is_empty() { 0 } else { 6 * 6 };
        6 + switch + waking + self.col_bytes + self.intern_bytes
    }

    /// The index of comm `k` (`n` bytes, NUL-padded into a u128) in this
    /// bundle's intern table, added if new.
    #[inline(always)]
    fn intern(&mut self, k: u128, n: usize) -> u32 {
        for &(rk, rn, i) in &self.recent {
            if rk == k && rn as usize == n {
                return i;
            }
        }
        let i = self.intern_indexed(k, n);
        self.recent = [(k, n as u8, i), self.recent[0]];
        i
    }

    fn intern_indexed(&mut self, k: u128, n: usize) -> u32 {
        let mask = INTERN_SLOTS - 1;
        let h = ((k as u64) ^ ((k >> 64) as u64) ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut slot = (h >> 54) as usize & mask;
        loop {
            match self.intern_slots[slot] {
                0 => break,
                i if self.intern[i as usize - 1] == (k, n as u8) => return i as u32 - 1,
                _ => slot = (slot + 1) & mask,
            }
        }
        self.intern.push((k, n as u8));
        self.intern_slots[slot] = self.intern.len() as u16;
        self.intern_bytes += 2 + n;
        (self.intern.len() - 1) as u32
    }

    fn write(&self, enc: &mut ProtoEncoder<'_>) {
        if self.is_empty() {
            return;
        }
        let nested = enc.begin_nested(feb::COMPACT_SCHED);
        for (field, col) in [
            (cs::SWITCH_TIMESTAMP, &self.switch_ts),
            (cs::SWITCH_PREV_STATE, &self.switch_prev_state),
            (cs::SWITCH_NEXT_PID, &self.switch_next_pid),
            (cs::SWITCH_NEXT_PRIO, &self.switch_next_prio),
        ] {
            if !col.is_empty() {
                enc.bytes(field, col.bytes());
            }
        }
        for (k, n) in &self.intern {
            let b = k.to_le_bytes();
            enc.bytes(cs::INTERN_TABLE, utf8_or_placeholder(&b[..*n as usize]));
        }
        for (field, col) in [
            (cs::SWITCH_NEXT_COMM_INDEX, &self.switch_comm),
            (cs::WAKING_TIMESTAMP, &self.waking_ts),
            (cs::WAKING_PID, &self.waking_pid),
            (cs::WAKING_TARGET_CPU, &self.waking_target_cpu),
            (cs::WAKING_PRIO, &self.waking_prio),
            (cs::WAKING_COMM_INDEX, &self.waking_comm),
            (cs::WAKING_COMMON_FLAGS, &self.waking_flags),
        ] {
            if !col.is_empty() {
                enc.bytes(field, col.bytes());
            }
        }
        enc.end_nested(nested);
    }
}

/// A comm field as an intern key: its bytes up to the first NUL, zero
/// padded into a u128, and their count. The kernel's 16-byte `char[]` comms
/// are read as one word.
#[inline]
fn comm_key(rec: &[u8], t: TextAt) -> (u128, usize) {
    if let TextAt::Comm16(at) = t
        && let Some(k) = comm16(rec, at)
    {
        return k;
    }
    let s = t.read(rec).unwrap_or_default();
    let n = s.len().min(16);
    let mut key = [0u8; 16];
    key[..n].copy_from_slice(&s[..n]);
    (u128::from_le_bytes(key), n)
}

/// Protobuf strings must be UTF-8; kernel text almost always is. Bytes that
/// are not are replaced by a fixed marker rather than copied and repaired.
#[inline]
fn utf8_or_placeholder(b: &[u8]) -> &[u8] {
    // ASCII (comms, nearly every kernel string) is checked a word at a time.
    if b.is_ascii() || std::str::from_utf8(b).is_ok() {
        b
    } else {
        b"<invalid utf-8>"
    }
}

/// The top bit of every byte of a word: clear when all 16 bytes are ASCII.
const ASCII_HIGH_BITS: u128 = u128::from_le_bytes([0x80; 16]);

/// `TracePacket.sequence_flags`: SEQ_INCREMENTAL_STATE_CLEARED.
const SEQ_INCREMENTAL_STATE_CLEARED: u64 = 1;

/// Encodes pages into bundles. One per recording; reused across drains.
///
/// Every bundle is self-contained: its compact_sched columns and intern
/// table start afresh, so the only incremental state a reader keeps for the
/// sequence is what a clear announces ([`BundleEncoder::clear_incremental_state`]).
pub struct BundleEncoder {
    seq_id: u32,
    max_packet_bytes: usize,
    /// `FtraceEventBundle.ftrace_clock` when the trace clock is not `boot`.
    ftrace_clock: Option<u32>,
    /// Only events of these threads (sorted), when the kernel cannot filter.
    tids: Option<Vec<i32>>,
    /// The next bundle says the sequence's incremental state was cleared.
    clear_pending: bool,
    compact: CompactCols,
    /// Thread ids seen since the last [`BundleEncoder::take_pids`].
    pids: Vec<i32>,
    pid_cache: Box<[i32; PID_CACHE]>,
    /// Common events go through [`BundleEncoder::run`] (off only to test it
    /// against the general path).
    fast: bool,
    /// The rules evaluated on the events (`super::watch`).
    watch: Option<Watch>,
    /// Counters summed over the recording.
    pub stats: EncodeStats,
}

/// Slots of the recent-pid cache (a power of two).
const PID_CACHE: usize = 1024;

/// One run of a page's events handed to the encoder by a [`PageFeed`]:
/// offsets into [`PageFeed::bytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Offset of the span's first record in the feed's bytes.
    pub pos: usize,
    /// Offset just past the span's last record.
    pub end: usize,
    /// The running timestamp at `pos`.
    pub ts: u64,
    /// Set when the span starts a page: its header (loss is noted once per page).
    pub header: Option<PageHeader>,
}

impl Span {
    /// The whole of a page that starts at `start` in a feed's bytes, or
    /// `None` (counted by its parse status) when its header is bad.
    #[inline]
    pub(crate) fn of_page(
        page: &[u8],
        start: usize,
        layout: &PageLayout,
        stats: &mut EncodeStats,
    ) -> Option<Span> {
        match parse_header(page, layout) {
            Ok(h) => {
                let pos = start + layout.data_offset;
                Some(Span {
                    pos,
                    end: pos + h.data_len,
                    ts: h.timestamp,
                    header: Some(h),
                })
            }
            Err(e) => {
                stats.parse_errors[e.parse_status() as usize] += 1;
                None
            }
        }
    }
}

/// Where the encoder takes pages from, one span at a time. A feed may
/// reuse the memory behind [`PageFeed::bytes`] once asked for the next
/// span, so the encoder keeps offsets, never slices, across that call.
pub trait PageFeed {
    /// The next span, or `None` when there is nothing more now. `prev_ts`
    /// is the running timestamp where the previous span's walk ended.
    fn next_span(&mut self, prev_ts: u64, stats: &mut EncodeStats) -> Option<Span>;
    /// The bytes the current span indexes.
    fn bytes(&self) -> &[u8];
}

/// Whole pages back to back in one buffer (what read(2) fills).
pub(crate) struct PagesFeed<'a> {
    pages: &'a [u8],
    layout: PageLayout,
    next: usize,
}

impl<'a> PagesFeed<'a> {
    pub(crate) fn new(pages: &'a [u8], layout: &PageLayout) -> Self {
        Self {
            pages,
            layout: *layout,
            next: 0,
        }
    }
}

impl PageFeed for PagesFeed<'_> {
    fn next_span(&mut self, _prev_ts: u64, stats: &mut EncodeStats) -> Option<Span> {
        let size = self.layout.page_size();
        loop {
            let start = self.next;
            let page = self.pages.get(start..start.checked_add(size)?)?;
            self.next += size;
            stats.pages += 1;
            if let Some(span) = Span::of_page(page, start, &self.layout, stats) {
                return Some(span);
            }
        }
    }

    fn bytes(&self) -> &[u8] {
        self.pages
    }
}

/// An event by its place in the feed's bytes.
#[derive(Clone, Copy)]
struct EventAt {
    timestamp: u64,
    start: usize,
    end: usize,
}

impl EventAt {
    fn raw<'b>(&self, bytes: &'b [u8]) -> RawEvent<'b> {
        RawEvent {
            timestamp: self.timestamp,
            offset: self.start,
            payload: bytes.get(self.start..self.end).unwrap_or_default(),
        }
    }
}

enum Step {
    Event(EventAt),
    Done,
}

/// Walks the events of a feed's spans, noting page-level loss.
#[derive(Default)]
struct PageCursor {
    /// (position, end, running timestamp) in the current span.
    walk: Option<(usize, usize, u64)>,
    /// The running timestamp where the last span ended.
    last_ts: u64,
    /// A page flagged RB_MISSED_EVENTS was entered and not yet reported.
    lost: bool,
}

impl PageCursor {
    fn next<F: PageFeed + ?Sized>(&mut self, feed: &mut F, stats: &mut EncodeStats) -> Step {
        loop {
            if let Some((pos, end, ts)) = self.walk {
                let mut it = EventIter::span(feed.bytes(), pos, end, ts);
                match it.step() {
                    Ok(Some(e)) => {
                        let (p, t) = it.position();
                        self.walk = Some((p, end, t));
                        return Step::Event(EventAt {
                            timestamp: e.timestamp,
                            start: e.offset,
                            end: e.offset + e.payload.len(),
                        });
                    }
                    Ok(None) => self.last_ts = it.position().1,
                    Err(e) => {
                        stats.parse_errors[e.parse_status() as usize] += 1;
                        self.last_ts = ts;
                    }
                }
                self.walk = None;
            }
            let Some(span) = feed.next_span(self.last_ts, stats) else {
                return Step::Done;
            };
            if let Some(h) = span.header
                && h.missed_events
            {
                self.lost = true;
                stats.lost_pages += 1;
                stats.lost_events += h.missed_count.unwrap_or(0);
            }
            self.walk = Some((span.pos, span.end, span.ts));
        }
    }
}

/// What happened to one event offered to a bundle.
enum Fit {
    Written,
    Skipped,
    NoRoom,
}

impl BundleEncoder {
    /// `seq_id` is the packets' trusted_packet_sequence_id; bundles are at
    /// most `max_packet_bytes` long (a whole page must fit: ≥ 16 KiB).
    pub fn new(seq_id: u32, max_packet_bytes: usize) -> Self {
        Self {
            seq_id,
            max_packet_bytes: max_packet_bytes.max(16 * 1024),
            ftrace_clock: None,
            tids: None,
            clear_pending: false,
            compact: CompactCols::new(),
            pids: Vec::new(),
            pid_cache: Box::new([0; PID_CACHE]),
            fast: true,
            watch: None,
            stats: EncodeStats::default(),
        }
    }

    /// Evaluates `watch`'s rules on the events it encodes from now on.
    pub fn set_watch(&mut self, watch: Watch) {
        self.watch = Some(watch);
    }

    /// The rules evaluated, if any.
    pub fn watch(&self) -> Option<&Watch> {
        self.watch.as_ref()
    }

    /// Where a drain starting now cuts the latency rules' events (see
    /// [`Watch::settle`]); `None` without rules.
    pub(crate) fn watch_cutoff(&self) -> Option<u64> {
        self.watch.as_ref().map(|w| w.now())
    }

    /// The end of a drain begun at `cutoff` (`u64::MAX`: the last).
    pub fn settle_watch(&mut self, cutoff: u64) {
        if let Some(w) = &mut self.watch {
            w.settle(cutoff);
        }
    }

    /// An event the general path consumed, shown to the rules that watch it
    /// (not one the thread filter leaves out, as the kernel's would).
    #[inline]
    fn watch_event(&mut self, table: &EventTable, cpu: u32, raw: &RawEvent<'_>) {
        let Some(w) = &mut self.watch else {
            return;
        };
        let Some(entry) = table.event_id(raw.payload).and_then(|id| table.get(id)) else {
            return;
        };
        if entry.watch == 0
            || self
                .tids
                .as_ref()
                .is_some_and(|t| !Self::tid_kept(t, entry, raw.payload))
        {
            return;
        }
        w.on_event(entry.watch, cpu, raw.timestamp, raw.payload);
    }

    /// Bundles carry `ftrace_clock` (the FtraceClock value) from now on.
    pub fn set_ftrace_clock(&mut self, clock: u32) {
        self.ftrace_clock = Some(clock);
    }

    /// Keeps only events of these threads, as the kernel's `set_event_pid`
    /// would: the current thread, or a thread the event is about
    /// (sched_switch's prev or next, a wakeup's target).
    pub fn set_tid_filter(&mut self, tids: &[u32]) {
        let mut v: Vec<i32> = tids.iter().map(|t| *t as i32).collect();
        v.sort_unstable();
        v.dedup();
        self.tids = Some(v);
    }

    /// The sequence's incremental state is cleared: the next bundle says so
    /// (`sequence_flags` SEQ_INCREMENTAL_STATE_CLEARED). Bundles carry no
    /// state across each other, so nothing else has to be re-sent.
    pub fn clear_incremental_state(&mut self) {
        self.clear_pending = true;
    }

    fn tid_kept(tids: &[i32], entry: &EventEntry, rec: &[u8]) -> bool {
        let has = |f: &IntAt| {
            f.int(rec)
                .is_some_and(|p| tids.binary_search(&(p as i32)).is_ok())
        };
        entry.pid.as_ref().is_some_and(has) || entry.pid_fields.iter().any(has)
    }

    /// Thread ids seen since the last call, sorted, without duplicates.
    pub fn take_pids(&mut self, out: &mut Vec<i32>) {
        // Each drain reports its pids afresh.
        self.pid_cache.fill(0);
        self.pids.sort_unstable();
        self.pids.dedup();
        out.clear();
        out.append(&mut self.pids);
    }

    /// Encodes `pages` (whole pages of one CPU, in read order) as bundles,
    /// then flushes `out` (free for a ring writer; an in-memory output
    /// collects the last bundle).
    pub fn encode_pages(
        &mut self,
        out: &mut dyn PacketOutput,
        table: &EventTable,
        filter: &PrintFilter,
        layout: &PageLayout,
        cursor: &mut CpuCursor,
        pages: &[u8],
    ) {
        self.encode_feed(
            out,
            table,
            filter,
            cursor,
            &mut PagesFeed::new(pages, layout),
        );
    }

    /// Encodes every span `feed` gives (one CPU, in read order) as
    /// bundles, then flushes `out`.
    pub(crate) fn encode_feed<F: PageFeed + ?Sized>(
        &mut self,
        out: &mut dyn PacketOutput,
        table: &EventTable,
        filter: &PrintFilter,
        cursor: &mut CpuCursor,
        feed: &mut F,
    ) {
        self.encode_bundles(out, table, filter, cursor, feed);
        out.flush();
    }

    fn encode_bundles<F: PageFeed + ?Sized>(
        &mut self,
        out: &mut dyn PacketOutput,
        table: &EventTable,
        filter: &PrintFilter,
        cursor: &mut CpuCursor,
        feed: &mut F,
    ) {
        let mut pc = PageCursor::default();
        // The event in hand, by offsets: the feed may move on only once it
        // is written (`pc.next` is called with nothing pending).
        let mut pending: Option<EventAt> = None;
        let mut done = false;
        // The shortest bundle accepted: MIN_BUNDLE_BYTES, or a full one to
        // retry an event too big for a short one.
        let mut min_len = MIN_BUNDLE_BYTES.min(self.max_packet_bytes);
        while !done || pending.is_some() || pc.lost {
            if pending.is_none() && !done {
                match pc.next(feed, &mut self.stats) {
                    Step::Event(e) => pending = Some(e),
                    Step::Done => done = true,
                }
            }
            if pending.is_none() && !pc.lost {
                break;
            }
            let Some(mut slot) = out.begin(min_len, self.max_packet_bytes) else {
                self.stats.dropped_bundles += 1;
                // Nothing can be written now; the rest of these pages is lost.
                return;
            };
            // A short bundle, not already the retry of a full-size one.
            let short = slot.max_len() < self.max_packet_bytes && min_len < self.max_packet_bytes;
            min_len = MIN_BUNDLE_BYTES.min(self.max_packet_bytes);
            let mut retry = false;
            let mut enc = ProtoEncoder::new(slot.buf());
            enc.uint(trace_packet::TRUSTED_PACKET_SEQUENCE_ID, self.seq_id as u64);
            if self.clear_pending {
                enc.uint(trace_packet::SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED);
            }
            let bundle = enc.begin_nested(trace_packet::FTRACE_EVENTS);
            enc.uint(feb::CPU, cursor.cpu as u64);
            if let Some(clock) = self.ftrace_clock {
                enc.uint(feb::FTRACE_CLOCK, u64::from(clock));
            }
            // Ahead of the events, as Perfetto writes it: zstd's fastest
            // levels compress the bundles 5-10% smaller with this timestamp
            // before the events than after the compact columns.
            enc.uint(
                feb::PREVIOUS_BUNDLE_END_TIMESTAMP,
                cursor.prev_bundle_end_ts,
            );
            self.compact.clear();
            let mut bundle_lost = std::mem::take(&mut pc.lost);
            let mut wrote = 0usize;
            let mut last_ts = None;
            loop {
                if self.fast && pending.is_none() && !pc.lost {
                    // The common events in one tight walk; whatever it does not
                    // take is left where it stands for the general path below.
                    if let Some((n, ts)) =
                        self.run(&mut enc, table, &mut pc, feed.bytes(), cursor.cpu)
                    {
                        wrote += n;
                        last_ts = Some(ts);
                        cursor.last_ts = ts;
                    }
                }
                let ev = match pending.take() {
                    Some(e) => e,
                    None if done => break,
                    None => match pc.next(feed, &mut self.stats) {
                        Step::Event(e) => {
                            if pc.lost {
                                if wrote > 0 {
                                    // Loss starts a new bundle so it is marked where it happened.
                                    pending = Some(e);
                                    break;
                                }
                                bundle_lost = true;
                                pc.lost = false;
                            }
                            e
                        }
                        Step::Done => {
                            done = true;
                            break;
                        }
                    },
                };
                let raw = ev.raw(feed.bytes());
                match self.encode_event(&mut enc, table, filter, &raw) {
                    Fit::Written => {
                        self.watch_event(table, cursor.cpu, &raw);
                        wrote += 1;
                        last_ts = Some(ev.timestamp);
                        cursor.last_ts = ev.timestamp;
                    }
                    Fit::Skipped => self.watch_event(table, cursor.cpu, &raw),
                    Fit::NoRoom if wrote == 0 && short => {
                        // Retry in a full-size bundle, not drop it.
                        pending = Some(ev);
                        min_len = self.max_packet_bytes;
                        retry = true;
                        break;
                    }
                    Fit::NoRoom if wrote == 0 => {
                        self.watch_event(table, cursor.cpu, &raw);
                        self.stats.oversized_events += 1;
                    }
                    Fit::NoRoom => {
                        pending = Some(ev);
                        break;
                    }
                }
            }
            if retry {
                // Nothing in this short bundle: store none (the slot is
                // dropped uncommitted), keep the loss mark for the full-size one.
                pc.lost |= bundle_lost;
                continue;
            }
            self.compact.write(&mut enc);
            if bundle_lost {
                enc.bool(feb::LOST_EVENTS, true);
            }
            enc.end_nested(bundle);
            match enc.finish() {
                Ok(len) => {
                    slot.commit(len);
                    self.stats.bundles += 1;
                    self.clear_pending = false;
                }
                Err(_) => {
                    // Unreachable by the reserve kept; drop rather than write a torn packet.
                    self.stats.dropped_bundles += 1;
                }
            }
            if let Some(ts) = last_ts {
                cursor.prev_bundle_end_ts = ts;
            }
        }
    }

    /// Writes the events of the current span that are compact or bounded
    /// typed ones and fit, one walk for them all; stops before the first
    /// other event (anything the general path must decide: unknown ids, the
    /// thread filter, prints, a full bundle), a malformed record or the
    /// span's end, leaving `pc` there. The same bytes and counts as
    /// [`Self::encode_event`] give for those events. How many were written
    /// and the timestamp of the last, if any.
    #[inline(never)]
    fn run(
        &mut self,
        enc: &mut ProtoEncoder<'_>,
        table: &EventTable,
        pc: &mut PageCursor,
        bytes: &[u8],
        cpu: u32,
    ) -> Option<(usize, u64)> {
        let (pos, end, ts) = pc.walk?;
        if self.tids.is_some() {
            return None;
        }
        let mut it = EventIter::span(bytes, pos, end, ts);
        let mut at = (pos, ts);
        let mut n = 0;
        let mut last = 0;
        while let Ok(Some(ev)) = it.step() {
            let rec = ev.payload;
            let Some(entry) = table.event_id(rec).and_then(|id| table.get(id)) else {
                break;
            };
            let reserve = self.compact.encoded_len() + TRAILER_BYTES;
            if let Some(plan) = &entry.compact {
                let prev = match plan {
                    CompactPlan::Switch(_) => self.compact.last_switch_ts,
                    CompactPlan::Waking(_) => self.compact.last_waking_ts,
                };
                if enc.remaining() < reserve + COMPACT_EVENT_MAX
                    || self.compact.intern.len() >= MAX_INTERNED
                    || ev.timestamp < prev
                {
                    break;
                }
                self.compact_event(plan, &ev);
                self.note_pids(entry, rec);
                self.stats.events += 1;
                self.stats.compact_events += 1;
            } else if let Some(plan) = &entry.wakeup
                && enc.remaining() >= reserve + WINDOW_SPAN
                && let Some(w) = enc.window()
                && let Some(pid) = wakeup_in_window(w, plan, entry.pid, &ev)
            {
                // Its one pid field, read once for the event and the pid list.
                self.note_pid(pid);
                self.stats.events += 1;
                self.stats.typed_events += 1;
            } else if let Some(plan) = &entry.typed
                && entry.print_buf.is_none()
                && plan
                    .max_len
                    .is_some_and(|m| m + EVENT_HEAD_MAX <= WINDOW_MAX_LEN)
                && enc.remaining() >= reserve + WINDOW_SPAN
                && let Some(w) = enc.window()
                && typed_in_window(w, entry, plan, &ev)
            {
                self.written(entry, rec);
            } else {
                break;
            }
            if entry.watch != 0
                && let Some(w) = &mut self.watch
            {
                w.saw(entry.watch, ev.timestamp, ev.offset, rec.len());
            }
            at = it.position();
            n += 1;
            last = ev.timestamp;
        }
        if let Some(w) = &mut self.watch {
            w.on_walk(bytes, cpu);
        }
        pc.walk = Some((at.0, end, at.1));
        (n > 0).then_some((n, last))
    }

    fn encode_event(
        &mut self,
        enc: &mut ProtoEncoder<'_>,
        table: &EventTable,
        filter: &PrintFilter,
        ev: &RawEvent<'_>,
    ) -> Fit {
        let rec = ev.payload;
        let Some(entry) = table.event_id(rec).and_then(|id| table.get(id)) else {
            self.stats.unknown_ids += 1;
            return Fit::Skipped;
        };
        if let Some(tids) = &self.tids
            && !Self::tid_kept(tids, entry, rec)
        {
            self.stats.filtered_tids += 1;
            return Fit::Skipped;
        }
        let reserve = self.compact.encoded_len() + TRAILER_BYTES;
        // Compact events first: the most frequent, and never prints.
        if let Some(plan) = &entry.compact {
            let last = match plan {
                CompactPlan::Switch(_) => self.compact.last_switch_ts,
                CompactPlan::Waking(_) => self.compact.last_waking_ts,
            };
            // Columns are delta-coded: a step back in time starts a new bundle.
            if enc.remaining() < reserve + COMPACT_EVENT_MAX
                || self.compact.intern.len() >= MAX_INTERNED
                || ev.timestamp < last
            {
                return Fit::NoRoom;
            }
            self.compact_event(plan, ev);
            self.note_pids(entry, rec);
            self.stats.events += 1;
            self.stats.compact_events += 1;
            return Fit::Written;
        }
        if let Some(buf) = entry.print_buf.and_then(|t| t.read(rec))
            && !filter.allows(buf)
        {
            self.stats.filtered_prints += 1;
            return Fit::Skipped;
        }
        if let Some(plan) = &entry.typed
            && plan
                .max_len
                .is_some_and(|m| m + EVENT_HEAD_MAX <= WINDOW_MAX_LEN)
            && enc.remaining() >= reserve + WINDOW_SPAN
            && let Some(w) = enc.window()
            && typed_in_window(w, entry, plan, ev)
        {
            return self.written(entry, rec);
        }
        let mark = enc.len();
        match &entry.typed {
            Some(plan) => {
                write_typed(enc, entry, plan, ev);
            }
            None => {
                let e = event_head(enc, entry, ev);
                Self::generic_event(enc, entry, rec);
                enc.end_short(e);
            }
        }
        if enc.overflowed() || enc.remaining() < reserve {
            enc.truncate(mark);
            return Fit::NoRoom;
        }
        self.written(entry, rec)
    }

    /// Counts a typed or generic event written.
    #[inline(always)]
    fn written(&mut self, entry: &EventEntry, rec: &[u8]) -> Fit {
        self.note_pids(entry, rec);
        self.stats.events += 1;
        if entry.typed.is_some() {
            self.stats.typed_events += 1;
        } else {
            self.stats.generic_events += 1;
        }
        Fit::Written
    }

    #[inline(always)]
    fn note_pids(&mut self, entry: &EventEntry, rec: &[u8]) {
        for f in &entry.pid_fields {
            if let Some(p) = f.int(rec) {
                self.note_pid(p);
            }
        }
    }

    #[inline(always)]
    fn note_pid(&mut self, p: i64) {
        if p > 0 {
            // A direct-mapped cache of recent pids keeps the list short:
            // the same few threads recur on every switch.
            let slot = &mut self.pid_cache[p as usize & (PID_CACHE - 1)];
            if *slot != p as i32 {
                *slot = p as i32;
                self.pids.push(p as i32);
            }
        }
    }

    fn generic_event(enc: &mut ProtoEncoder<'_>, entry: &EventEntry, rec: &[u8]) {
        let g = enc.begin_short(ftrace_event::GENERIC);
        enc.string(gfe::EVENT_NAME, &entry.format.name);
        for f in &entry.format.fields {
            match f.kind {
                FieldKind::Int => {
                    let fe = enc.begin_short(gfe::FIELD);
                    enc.string(generic_field::NAME, &f.name);
                    if f.signed {
                        if let Some(v) = read_int(rec, f) {
                            enc.int(generic_field::INT_VALUE, v);
                        }
                    } else if let Some(v) = read_uint(rec, f.offset, f.size) {
                        enc.uint(generic_field::UINT_VALUE, v);
                    }
                    enc.end_short(fe);
                }
                FieldKind::CharArray | FieldKind::DataLoc | FieldKind::TailString => {
                    let fe = enc.begin_short(gfe::FIELD);
                    enc.string(generic_field::NAME, &f.name);
                    enc.bytes(
                        generic_field::STR_VALUE,
                        utf8_or_placeholder(read_str(rec, f).unwrap_or_default()),
                    );
                    enc.end_short(fe);
                }
                FieldKind::Opaque => {}
            }
        }
        enc.end_short(g);
    }

    #[inline(always)]
    fn compact_event(&mut self, plan: &CompactPlan, ev: &RawEvent<'_>) {
        let rec = ev.payload;
        let c = &mut self.compact;
        let int = |f: IntAt| f.int(rec).unwrap_or(0) as u64;
        let n = match plan {
            CompactPlan::Switch(p) => {
                let (k, n) = comm_key(rec, p.next_comm);
                let idx = c.intern(k, n);
                let dt = ev.timestamp.wrapping_sub(c.last_switch_ts);
                c.last_switch_ts = ev.timestamp;
                c.switch_ts.push(dt)
                    + c.switch_prev_state.push(int(p.prev_state))
                    + c.switch_next_pid.push(int(p.next_pid))
                    + c.switch_next_prio.push(int(p.next_prio))
                    + c.switch_comm.push(idx as u64)
            }
            CompactPlan::Waking(p) => {
                let (k, n) = comm_key(rec, p.comm);
                let idx = c.intern(k, n);
                let dt = ev.timestamp.wrapping_sub(c.last_waking_ts);
                c.last_waking_ts = ev.timestamp;
                let flags = p.common_flags.and_then(|f| f.uint(rec)).unwrap_or(0);
                c.waking_ts.push(dt)
                    + c.waking_pid.push(int(p.pid))
                    + c.waking_target_cpu.push(int(p.target_cpu))
                    + c.waking_prio.push(int(p.prio))
                    + c.waking_comm.push(idx as u64)
                    + c.waking_flags.push(flags)
            }
        };
        c.col_bytes += n;
    }
}

/// Opens an `FtraceEvent`: its timestamp and pid.
#[inline(always)]
fn event_head<W: ShortWriter>(w: &mut W, entry: &EventEntry, ev: &RawEvent<'_>) -> Short {
    let e = w.begin(feb::EVENT);
    w.uint(ftrace_event::TIMESTAMP, ev.timestamp);
    if let Some(p) = entry.pid.and_then(|f| f.int(ev.payload)) {
        w.uint(ftrace_event::PID, p as u32 as u64);
    }
    e
}

/// A typed event. False, having written part of it, when a bounded writer
/// meets text the bound does not cover (the caller then drops the window).
#[inline(always)]
fn write_typed<W: ShortWriter>(
    w: &mut W,
    entry: &EventEntry,
    plan: &TypedPlan,
    ev: &RawEvent<'_>,
) -> bool {
    let rec = ev.payload;
    let e = event_head(w, entry, ev);
    let m = w.begin_at(&plan.key);
    // Matched by reference: a step is read in place, not copied out.
    for op in &plan.ops {
        match op {
            TypedOp::Int(k, f) => {
                if let Some(v) = f.int(rec) {
                    w.uint_at(k, v as u64);
                }
            }
            TypedOp::Uint(k, f) => {
                if let Some(v) = f.uint(rec) {
                    w.uint_at(k, v);
                }
            }
            TypedOp::Str(k, TextAt::Comm16(at)) => {
                if let Some((word, n)) = comm16(rec, *at) {
                    let b = word.to_le_bytes();
                    if word & ASCII_HIGH_BITS == 0 {
                        w.bytes16_at(k, &b, n);
                    } else {
                        w.bytes_at(k, utf8_or_placeholder(&b[..n]));
                    }
                }
            }
            TypedOp::Str(..) if W::BOUNDED => return false,
            TypedOp::Str(k, t) => {
                if let Some(s) = t.read(rec) {
                    w.bytes_at(k, utf8_or_placeholder(s));
                }
            }
        }
    }
    w.end(m);
    w.end(e);
    true
}

/// A typed event whose plan is bounded ([`TypedPlan::max_len`]), in a window
/// the caller sized for it: one room check for the whole event. False, with
/// nothing kept, for text the bound does not cover. Out of line: inlined, it
/// made the event loop too large for the compact path to stay inlined in it.
#[inline(never)]
fn typed_in_window(
    mut w: Window<'_>,
    entry: &EventEntry,
    plan: &TypedPlan,
    ev: &RawEvent<'_>,
) -> bool {
    let done = write_typed(&mut w, entry, plan, ev);
    if done {
        w.close();
    }
    done
}

/// sched_wakeup/sched_waking by their [`WakeupPlan`], in a window: the
/// bytes [`write_typed`] gives for them, in straight-line code; the pid
/// field's value. `None`, with nothing kept, for a record too short to hold
/// every field or a comm that is not ASCII (the typed plan then writes it).
#[inline(always)]
fn wakeup_in_window(
    mut w: Window<'_>,
    plan: &WakeupPlan,
    pid: Option<IntAt>,
    ev: &RawEvent<'_>,
) -> Option<i64> {
    let rec = ev.payload;
    if rec.len() < plan.min_len {
        return None;
    }
    let (comm, n) = comm16(rec, plan.comm.1)?;
    if comm & ASCII_HIGH_BITS != 0 {
        return None;
    }
    // Within `min_len` every read below finds its field.
    let int = |f: IntAt| f.int(rec).unwrap_or(0) as u64;
    let e = w.begin(feb::EVENT);
    w.uint(ftrace_event::TIMESTAMP, ev.timestamp);
    if let Some(p) = pid {
        w.uint(ftrace_event::PID, int(p) as u32 as u64);
    }
    let target = plan.pid.1.int(rec).unwrap_or(0);
    let m = w.begin_at(&plan.key);
    w.bytes16_at(&plan.comm.0, &comm.to_le_bytes(), n);
    w.uint_at(&plan.pid.0, target as u64);
    w.uint_at(&plan.prio.0, int(plan.prio.1));
    w.uint_at(&plan.target_cpu.0, int(plan.target_cpu.1));
    w.end(m);
    w.end(e);
    w.close();
    Some(target)
}

/// Counts the events of one page with the walker alone (no decoding): the
/// second, independent walk the fuzz oracle compares against.
pub fn count_page_events(page: &[u8], layout: &PageLayout) -> Result<usize, PageError> {
    let h = parse_header(page, layout)?;
    let mut n = 0;
    for e in EventIter::new(page, layout, &h) {
        e?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::ftrace::format::Field;
    use proptest::prelude::*;

    fn comm_field(size: usize) -> Field {
        Field {
            name: "comm".into(),
            type_name: format!("char[{size}]"),
            offset: 2,
            size,
            signed: false,
            kind: FieldKind::CharArray,
        }
    }

    proptest! {
        /// The one-word comm key is the comm's bytes up to the first NUL,
        /// as the byte-wise reading gives them, for any 16 bytes.
        #[test]
        fn comm_key_matches_read_str(
            comm in proptest::collection::vec(prop_oneof![Just(0u8), Just(0x80u8), Just(0xffu8), any::<u8>()], 16),
        ) {
            let mut rec = vec![7u8, 7];
            rec.extend_from_slice(&comm);
            for size in [16, 12] {
                let f = comm_field(size);
                let s = read_str(&rec, &f).unwrap_or_default();
                let mut key = [0u8; 16];
                key[..s.len()].copy_from_slice(s);
                let t = TextAt::of(&f).expect("text");
                prop_assert_eq!(comm_key(&rec, t), (u128::from_le_bytes(key), s.len()));
            }
        }
    }

    proptest! {
        /// Interning (the recent pair, then the index) gives every comm the
        /// index a linear scan of first appearances gives it.
        #[test]
        fn intern_matches_a_linear_model(
            comms in proptest::collection::vec((0u128..6, 1usize..17), 0..400),
        ) {
            let mut c = CompactCols::new();
            let mut model: Vec<(u128, usize)> = Vec::new();
            for (k, n) in comms {
                let want = match model.iter().position(|&e| e == (k, n)) {
                    Some(i) => i,
                    None => {
                        model.push((k, n));
                        model.len() - 1
                    }
                };
                prop_assert_eq!(c.intern(k, n), want as u32);
            }
            prop_assert_eq!(c.intern.len(), model.len());
        }
    }

    /// The fixture pages, the table of every fixture event and its layout.
    fn fixture(compact: bool) -> (PageLayout, EventTable, Vec<u8>) {
        use crate::sources::ftrace::{load_layouts, resolve_event, tracefs::Tracefs};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ftrace");
        let t = Tracefs::at(dir.join("tree")).expect("fixture tree");
        let mut evs = Vec::new();
        for g in t.groups() {
            evs.extend(resolve_event(&t, &format!("{g}/*")));
        }
        let (l, table, _) = load_layouts(&t, &evs, compact).expect("layouts");
        let mut pages = Vec::new();
        for f in [
            "cpu0.raw",
            "cpu1.raw",
            "gap_cpu0.raw",
            "lossy_cpu0.raw",
            "pingpong_cpu0.raw",
        ] {
            pages.extend(std::fs::read(dir.join(f)).expect("fixture pages"));
        }
        (l, table, pages)
    }

    fn encode_with(
        fast: bool,
        l: &PageLayout,
        table: &EventTable,
        pages: &[u8],
        max_packet: usize,
        tids: Option<&[u32]>,
    ) -> (Vec<u8>, EncodeStats, Vec<i32>) {
        let mut out = crate::sources::output::VecOutput::new();
        let mut enc = BundleEncoder::new(3, max_packet);
        enc.fast = fast;
        if let Some(t) = tids {
            enc.set_tid_filter(t);
        }
        let mut cur = CpuCursor::default();
        // Two calls, as two drains of one CPU.
        let half = pages.len() / l.page_size() / 2 * l.page_size();
        for part in [&pages[..half], &pages[half..]] {
            enc.encode_pages(&mut out, table, &PrintFilter::default(), l, &mut cur, part);
        }
        let mut pids = Vec::new();
        enc.take_pids(&mut pids);
        (out.bytes, enc.stats, pids)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The one-walk run over common events writes the same bytes, counts
        /// and pids as the general path alone, on real pages picked in any
        /// order with bytes of them damaged, any bundle size, with and
        /// without compact_sched and the thread filter.
        #[test]
        fn the_fast_run_matches_the_general_path(
            compact in any::<bool>(),
            picks in proptest::collection::vec(0usize..64, 1..24),
            damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            max_packet in prop_oneof![Just(16 * 1024), Just(32 * 1024), Just(64 * 1024)],
            tids in proptest::option::of(proptest::collection::vec(0u32..40_000, 1..4)),
        ) {
            let (l, table, all) = fixture(compact);
            let size = l.page_size();
            let n = all.len() / size;
            let mut pages = Vec::new();
            for p in picks {
                let p = p % n;
                pages.extend_from_slice(&all[p * size..(p + 1) * size]);
            }
            for (at, b) in damage {
                let i = at.index(pages.len());
                pages[i] = b;
            }
            let general = encode_with(false, &l, &table, &pages, max_packet, tids.as_deref());
            let fast = encode_with(true, &l, &table, &pages, max_packet, tids.as_deref());
            prop_assert_eq!(&fast.1, &general.1);
            prop_assert_eq!(&fast.2, &general.2);
            prop_assert!(fast.0 == general.0, "bytes differ");
        }
    }

    /// The fixture's event table, without compact_sched, loaded once.
    fn typed_table() -> &'static EventTable {
        static TABLE: std::sync::OnceLock<EventTable> = std::sync::OnceLock::new();
        TABLE.get_or_init(|| fixture(false).1)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// The wakeup encoder writes what the typed plan writes, byte for
        /// byte, for any record of sched_wakeup or sched_waking; it declines
        /// (keeping nothing) exactly the records too short to hold every
        /// field and those whose comm is not ASCII.
        #[test]
        fn the_wakeup_encoder_matches_the_typed_plan(
            waking in any::<bool>(),
            bytes in proptest::collection::vec(
                prop_oneof![Just(0u8), Just(0x80u8), Just(0xffu8), Just(b'k'), any::<u8>()], 48),
            len in prop_oneof![3 => Just(48usize), 3 => 36usize..48, 1 => 0usize..36],
            ascii in any::<bool>(),
            ts in prop_oneof![Just(0u64), any::<u64>()],
        ) {
            let table = typed_table();
            let name = if waking { "sched_waking" } else { "sched_wakeup" };
            let entry = (0..=u16::MAX)
                .filter_map(|id| table.get(id))
                .find(|e| e.format.name == name)
                .expect("the fixture has the event");
            let plan = entry.wakeup.as_ref().expect("a wakeup plan");
            let typed = entry.typed.as_ref().expect("a typed plan");
            let mut rec = bytes;
            if ascii {
                // Most comms are ASCII: clear the top bits of the comm.
                for b in rec.iter_mut().skip(plan.comm.1).take(16) {
                    *b &= 0x7f;
                }
            }
            rec.truncate(len);
            let ev = RawEvent { timestamp: ts, offset: 0, payload: &rec };

            let mut a = vec![0u8; 1024];
            let mut enc = ProtoEncoder::new(&mut a);
            let took = wakeup_in_window(enc.window().expect("room"), plan, entry.pid, &ev);
            if let Some(pid) = took {
                prop_assert_eq!(Some(pid), plan.pid.1.int(&rec));
            }
            let took = took.is_some();
            let a_len = enc.finish().expect("no overflow");

            let mut b = vec![0u8; 1024];
            let mut enc = ProtoEncoder::new(&mut b);
            write_typed(&mut enc, entry, typed, &ev);
            let b_len = enc.finish().expect("no overflow");

            let comm_ascii = TextAt::Comm16(plan.comm.1).read(&rec).is_some_and(|c| c.is_ascii());
            prop_assert_eq!(took, rec.len() >= plan.min_len && comm_ascii);
            if took {
                prop_assert_eq!(&a[..a_len], &b[..b_len]);
            } else {
                prop_assert_eq!(a_len, 0);
            }
        }
    }

    /// Both wakeup events of a real kernel's formats get the wakeup plan,
    /// and the record length they all have holds every field.
    /// Every bundle opens with cpu then previous_bundle_end_timestamp, ahead
    /// of its events and compact columns: the place zstd's fastest levels
    /// compress best (and where Perfetto writes it).
    #[test]
    fn bundles_open_with_cpu_then_the_previous_end() {
        use crate::wire::fields::{Value, fields};
        for compact in [false, true] {
            let (l, table, pages) = fixture(compact);
            let (bytes, _, _) = encode_with(true, &l, &table, &pages, 16 * 1024, None);
            let mut bundles = 0;
            for rec in crate::wire::framing::frames(&bytes) {
                for f in fields(rec.packet) {
                    let f = f.expect("packet field");
                    let (trace_packet::FTRACE_EVENTS, Value::Len(b)) = (f.number, f.value) else {
                        continue;
                    };
                    let order: Vec<u32> =
                        fields(b).map(|g| g.expect("bundle field").number).collect();
                    assert_eq!(
                        order[..2],
                        [feb::CPU, feb::PREVIOUS_BUNDLE_END_TIMESTAMP],
                        "compact {compact}"
                    );
                    assert!(!order[2..].contains(&feb::PREVIOUS_BUNDLE_END_TIMESTAMP));
                    bundles += 1;
                }
            }
            assert!(bundles > 2, "compact {compact}: {bundles} bundles");
        }
    }

    #[test]
    fn real_wakeup_formats_get_the_wakeup_plan() {
        let table = typed_table();
        for name in ["sched_wakeup", "sched_waking"] {
            let entry = (0..=u16::MAX)
                .filter_map(|id| table.get(id))
                .find(|e| e.format.name == name)
                .expect("the fixture has the event");
            let plan = entry.wakeup.as_ref().expect("a wakeup plan");
            let size = entry
                .format
                .fields
                .iter()
                .map(|f| f.offset + f.size)
                .max()
                .unwrap_or(0);
            assert!(
                plan.min_len <= size.max(8),
                "{name}: {} > {size}",
                plan.min_len
            );
        }
        let other = (0..=u16::MAX)
            .filter_map(|id| table.get(id))
            .find(|e| e.format.name == "sched_switch")
            .expect("sched_switch");
        assert!(other.wakeup.is_none());
    }

    #[test]
    fn intern_finds_every_comm_again() {
        let mut c = CompactCols::new();
        let keys: Vec<(u128, usize)> = (0..MAX_INTERNED as u128)
            .map(|i| (i * 0x1_0000_0001 + 1, (i % 16) as usize + 1))
            .collect();
        for (i, &(k, n)) in keys.iter().enumerate() {
            assert_eq!(c.intern(k, n), i as u32);
        }
        for (i, &(k, n)) in keys.iter().enumerate().rev() {
            assert_eq!(c.intern(k, n), i as u32, "second lookup");
        }
        // Same bytes, other length: another entry.
        assert_eq!(c.intern(keys[0].0, keys[0].1 + 1), MAX_INTERNED as u32);
        c.clear();
        assert_eq!(c.intern(keys[5].0, keys[5].1), 0, "cleared per bundle");
    }
}
