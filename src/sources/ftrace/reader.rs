//! The reader: every drain period it reads every CPU's
//! `per_cpu/cpuN/trace_pipe_raw` (non-blocking `read(2)`, a page per call)
//! until the kernel has nothing more, and encodes the pages as bundles: each
//! page as it is read, so a bundle runs on across the pages of a drain.
//! It runs on no thread of its own: whoever hosts the source (the event
//! loop) calls [`ReaderState::on_due`] when [`ReaderState::next_due`] comes
//! or a CPU's pipe is readable.
//!
//! Between periodic drains the host waits in poll(2) on every CPU's pipe
//! ([`ReaderState::watched`]): with the instance's `buffer_percent` set, the
//! kernel wakes it as soon as one CPU's buffer is that full, so a burst is
//! drained before it overruns the buffer instead of at the next period.
//!
//! Three ways out of the kernel ([`ReadMode`]): the ring buffer mapped into
//! the process (Linux 6.10+; events are encoded where the kernel wrote
//! them, one `ioctl` per sub-buffer), `read(2)` (a page per call; with a
//! periodic drain only the last page of each CPU per period is partial) and
//! `splice(2)` into a pipe then `read(2)` out of it (full pages only).
//! [`ReadMode::Auto`] maps where the kernel can and reads otherwise.
//!
//! **F2** (ARCHITECTURE §5.7): a periodic `read(2)` drain may stop a CPU at
//! a page less than half full other than its first (see `ReadFeed`); a flush and the
//! last drain (`final_pass`) read every CPU until the kernel has nothing
//! more, so a flush delivers everything written before it.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::encode::{BundleEncoder, CpuCursor, EncodeStats, PageFeed, PrintFilter, Span};
use super::event_table::EventTable;
use super::format::PageLayout;
use super::page::header_from_words;
use crate::sources::output::PacketOutput;
use crate::sys::trace_map::{SUBBUF_DATA_OFFSET, TraceMap, TraceMapError};

/// Pages taken from one CPU before they are encoded, through the mapping or
/// splice (bounds the staging buffer). read(2) encodes each page as it comes.
pub(crate) const BATCH_PAGES: usize = 64;

/// Shortest time between two watermark-driven drains: if a kernel reports
/// the pipes readable at any fill level, the reader still does not spin.
pub(crate) const MIN_WAKE_INTERVAL: Duration = Duration::from_millis(5);

/// Pages one splice moves (the pipe is sized to hold them).
pub(crate) const SPLICE_PIPE_PAGES: usize = 16;

/// How pages leave the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReadMode {
    /// The mapping where the kernel offers it, else read(2).
    Auto,
    /// The ring buffer mapped (`TRACE_MMAP_IOCTL_GET_READER`); an error
    /// where the kernel cannot map it.
    Mmap,
    /// read(2), one page per call; partial pages too. The default: under a
    /// sustained load this kernel (6.18) overwrites more unread sub-buffers
    /// while a reader maps the buffer than with read(2) (docs/ftrace.md).
    #[default]
    Read,
    /// splice(2) into a pipe, then read(2) from it; full pages only.
    Splice,
}

/// [`READ_MODE_ENV`] names no [`ReadMode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{READ_MODE_ENV}={0:?}: expected auto, mmap, read or splice")]
pub struct UnknownReadMode(pub String);

/// The environment variable that picks the [`ReadMode`].
pub(crate) const READ_MODE_ENV: &str = "RECORDER_FTRACE_READ";

impl ReadMode {
    /// `auto`, `mmap`, `read` or `splice`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "auto" => Some(Self::Auto),
            "" => Some(Self::default()),
            "mmap" => Some(Self::Mmap),
            "read" => Some(Self::Read),
            "splice" => Some(Self::Splice),
            _ => None,
        }
    }

    /// The mode [`READ_MODE_ENV`] names (`Read` when unset); a value it
    /// does not know is an error naming the ones it does.
    pub(crate) fn from_env() -> Result<Self, UnknownReadMode> {
        match std::env::var(READ_MODE_ENV) {
            Err(_) => Ok(Self::default()),
            Ok(v) => Self::parse(&v).ok_or(UnknownReadMode(v)),
        }
    }
}

/// One CPU's mapped ring buffer and where its reader sub-buffer was left.
pub struct MappedCpu {
    map: TraceMap,
    /// The reader sub-buffer last walked.
    id: Option<u32>,
    /// Its data bytes already encoded.
    consumed: usize,
    /// The running timestamp at `consumed`; unknown when a walk was cut
    /// short (the rest of that sub-buffer is then skipped).
    ts: Option<u64>,
    pub(crate) ioctl_errors: u64,
}

impl MappedCpu {
    /// The kernel's counters on the CPU's meta page (entries, overrun, read).
    pub fn counters(&self) -> crate::sys::trace_map::MetaCounters {
        self.map.counters()
    }
}

/// Maps `file` (cpu `cpu`'s trace_pipe_raw) as `mode` asks: `None` for
/// read(2) (asked for, or `Auto` where the kernel cannot map it).
pub fn open_map(
    file: &File,
    cpu: u32,
    layout: &PageLayout,
    mode: ReadMode,
) -> Result<Option<MappedCpu>, TraceMapError> {
    if !matches!(mode, ReadMode::Auto | ReadMode::Mmap) {
        return Ok(None);
    }
    let mapped = TraceMap::new(file).and_then(|map| {
        // The walker reads the layout header_page gave; it must be the mapped one.
        if layout.data_offset != SUBBUF_DATA_OFFSET || layout.page_size() != map.subbuf_size() {
            return Err(TraceMapError::Layout {
                mapped: map.subbuf_size(),
                data_at: SUBBUF_DATA_OFFSET,
                page: layout.page_size(),
                data_offset: layout.data_offset,
            });
        }
        Ok(map)
    });
    match (mapped, mode) {
        (Ok(map), _) => Ok(Some(MappedCpu {
            map,
            id: None,
            consumed: 0,
            ts: None,
            ioctl_errors: 0,
        })),
        (Err(e), ReadMode::Auto) => {
            log::info!("ftrace cpu{cpu}: reading with read(2): {e}");
            Ok(None)
        }
        (Err(e), _) => Err(e),
    }
}

/// The spans of one mapped CPU, at most `budget` sub-buffers per encode.
struct MappedFeed<'m> {
    m: &'m mut MappedCpu,
    layout: PageLayout,
    budget: usize,
    /// A span was handed out and its end timestamp not yet received.
    in_span: bool,
    /// The budget ran out before the kernel had nothing more.
    more: bool,
    /// A span resumed the sub-buffer the writer is on: the drain of this
    /// CPU ends with it rather than chase the writer event by event.
    caught_up: bool,
    /// Sub-buffer bytes taken (whole sub-buffers, as read(2) counts).
    bytes: u64,
}

impl PageFeed for MappedFeed<'_> {
    fn next_span(&mut self, prev_ts: u64, stats: &mut EncodeStats) -> Option<Span> {
        if std::mem::take(&mut self.in_span) {
            self.m.ts = Some(prev_ts);
        }
        loop {
            if self.caught_up {
                return None;
            }
            if self.budget == 0 {
                self.more = true;
                return None;
            }
            let r = match self.m.map.get_reader() {
                Ok(r) => r,
                Err(e) => {
                    self.m.ioctl_errors += 1;
                    log::debug!("ftrace mapped buffer: {e}");
                    return None;
                }
            };
            if self.m.id != Some(r.id) {
                self.m.id = Some(r.id);
                self.m.consumed = 0;
                self.m.ts = None;
            }
            if r.read <= self.m.consumed {
                return None;
            }
            let from = std::mem::replace(&mut self.m.consumed, r.read);
            if from > 0 {
                // More written on the sub-buffer since: resume the walk.
                self.caught_up = true;
                // Unknown after a cut-short walk: the rest of it is skipped.
                let ts = self.m.ts?;
                self.in_span = true;
                return Some(Span {
                    pos: from,
                    end: r.read,
                    ts,
                    header: None,
                });
            }
            self.budget -= 1;
            stats.pages += 1;
            self.bytes += self.m.map.subbuf_size() as u64;
            let view = self.m.map.reader()?;
            let l = &self.layout;
            let header = match (
                view.word(l.timestamp_offset, 8),
                view.word(l.commit_offset, l.commit_size),
            ) {
                (Some(ts), Some(commit)) => {
                    let room = view.size().saturating_sub(l.data_offset).min(l.data_size);
                    header_from_words(ts, commit, room, |at| {
                        view.word(l.data_offset + at, l.commit_size)
                    })
                }
                _ => Err(super::page::PageError::InvalidPageHeader),
            };
            match header {
                Ok(h) => {
                    self.in_span = true;
                    return Some(Span {
                        pos: 0,
                        end: r.read,
                        ts: h.timestamp,
                        header: Some(h),
                    });
                }
                Err(e) => stats.parse_errors[e.parse_status() as usize] += 1,
            }
        }
    }

    fn bytes(&self) -> &[u8] {
        self.m.map.reader().map(|v| v.data()).unwrap_or_default()
    }
}

impl Drop for MappedFeed<'_> {
    fn drop(&mut self) {
        if self.in_span {
            // The encoder stopped inside a span (no room): its end is unknown.
            self.m.ts = None;
        }
    }
}

/// One CPU's pages read with read(2) one at a time into a single page,
/// until the kernel has nothing more or, in a periodic drain, until a page
/// other than the drain's first comes back less than half full.
///
/// A page that short is the one the kernel is still writing into: it
/// copies such a page event by event with interrupts off, and a reader that
/// keeps asking while a writer keeps writing gets a trickle of tiny pages at
/// that price (with 32 KiB sub-buffers it read 358 bytes of pages per event
/// instead of 58). The rest waits for the next drain; a flush or the last
/// drain reads to the end. A drain's first page may be short for another
/// reason: it is what the writer added to the page the last drain stopped
/// in, and full pages may follow it.
struct ReadFeed<'a> {
    file: &'a File,
    page: &'a mut [u8],
    layout: PageLayout,
    bytes_read: u64,
    read_errors: u64,
    cpu: u32,
    /// Stop after a page less than half full (not in a final pass).
    stop_when_caught_up: bool,
    caught_up: bool,
    /// Pages this drain has read.
    pages: u64,
}

impl PageFeed for ReadFeed<'_> {
    fn next_span(&mut self, _prev_ts: u64, stats: &mut EncodeStats) -> Option<Span> {
        if self.caught_up {
            return None;
        }
        loop {
            let n = match (&mut self.file).read(self.page) {
                Ok(0) => return None,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.read_errors += 1;
                    log::debug!("cpu{} trace_pipe_raw: {e}", self.cpu);
                    return None;
                }
            };
            // A short read is still one page: the commit bounds it.
            self.page[n..].fill(0);
            self.bytes_read += n as u64;
            stats.pages += 1;
            if let Some(span) = Span::of_page(self.page, 0, &self.layout, stats) {
                self.pages += 1;
                self.caught_up = self.stop_when_caught_up
                    && self.pages > 1
                    && span.end - span.pos < self.layout.data_size / 2;
                return Some(span);
            }
        }
    }

    fn bytes(&self) -> &[u8] {
        self.page
    }
}

/// Callback told the thread ids seen in each drain.
pub type PidSink = Box<dyn FnMut(&[i32]) + Send>;

/// One CPU's raw pipe.
pub(crate) struct CpuPipe {
    pub cpu: u32,
    pub file: File,
    /// Bytes read from it so far.
    pub bytes_read: u64,
    pub(crate) read_errors: u64,
    pub(crate) cursor: CpuCursor,
    /// (read end, write end) of the pipe splice moves pages through.
    pub(crate) splice_pipe: Option<(OwnedFd, OwnedFd)>,
    /// The mapped ring buffer, when read through the mapping.
    pub map: Option<MappedCpu>,
}

/// Everything the reader holds while it runs, with its schedule.
pub(crate) struct ReaderState<O: PacketOutput> {
    pub output: O,
    pub encoder: BundleEncoder,
    pub pipes: Vec<CpuPipe>,
    pub table: Arc<EventTable>,
    pub filter: PrintFilter,
    pub layout: PageLayout,
    pub(crate) pid_sink: Option<PidSink>,
    pub mode: ReadMode,
    staging: Vec<u8>,
    pids: Vec<i32>,
    /// Per CPU: a timestamp went backwards (should never happen).
    pub non_monotonic: u64,
    /// Whether the kernel wakes us at a fill watermark (`buffer_percent`).
    pub watermark: bool,
    /// Drains started by the watermark rather than the period.
    pub watermark_drains: u64,
    period: Duration,
    /// The next periodic drain.
    next: Instant,
    /// Until then the CPUs' pipes are not watched (a watermark drain just ran).
    quiet_until: Instant,
}

impl<O: PacketOutput> ReaderState<O> {
    pub(crate) fn new(
        output: O,
        encoder: BundleEncoder,
        pipes: Vec<CpuPipe>,
        table: Arc<EventTable>,
        filter: PrintFilter,
        layout: PageLayout,
        pid_sink: Option<PidSink>,
    ) -> Self {
        let staging = vec![0u8; BATCH_PAGES * layout.page_size()];
        Self {
            output,
            encoder,
            pipes,
            table,
            filter,
            layout,
            pid_sink,
            mode: ReadMode::Read,
            staging,
            pids: Vec::new(),
            non_monotonic: 0,
            watermark: false,
            watermark_drains: 0,
            period: Duration::from_millis(100),
            next: Instant::now(),
            quiet_until: Instant::now(),
        }
    }

    /// Drains every `period` from now on (the first after one period).
    pub(crate) fn schedule(&mut self, period: Duration) {
        self.period = period;
        self.next = Instant::now() + period;
        self.quiet_until = Instant::now();
    }

    /// Fills the staging buffer from CPU `i` with whole pages; returns the
    /// bytes filled and whether the CPU has nothing more now.
    fn fill(&mut self, i: usize, mode: ReadMode) -> (usize, bool) {
        let page = self.layout.page_size();
        let mut filled = 0;
        let pipe = &mut self.pipes[i];
        while filled + page <= self.staging.len() {
            if let (ReadMode::Splice, Some((pr, pw))) = (mode, &pipe.splice_pipe) {
                // Only full pages come through splice; at most what the pipe holds.
                let room = (self.staging.len() - filled).min(SPLICE_PIPE_PAGES * page);
                match rustix::pipe::splice(
                    &pipe.file,
                    None,
                    pw,
                    None,
                    room,
                    rustix::pipe::SpliceFlags::NONBLOCK,
                ) {
                    Ok(0) => return (filled, true),
                    Ok(n) => {
                        let mut got = 0;
                        while got < n {
                            match rustix::io::read(pr, &mut self.staging[filled + got..filled + n])
                            {
                                Ok(0) => break,
                                Ok(m) => got += m,
                                Err(rustix::io::Errno::INTR) => {}
                                Err(e) => {
                                    pipe.read_errors += 1;
                                    log::debug!("cpu{} splice pipe: {e}", pipe.cpu);
                                    break;
                                }
                            }
                        }
                        pipe.bytes_read += got as u64;
                        // Whole pages only: a torn tail (never seen) is dropped.
                        filled += got / page * page;
                        if got < n {
                            return (filled, true);
                        }
                    }
                    Err(rustix::io::Errno::AGAIN) => return (filled, true),
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => {
                        pipe.read_errors += 1;
                        log::debug!("cpu{} splice: {e}", pipe.cpu);
                        return (filled, true);
                    }
                }
                continue;
            }
            let slot = &mut self.staging[filled..filled + page];
            match pipe.file.read(slot) {
                Ok(0) => return (filled, true),
                Ok(n) => {
                    // A short read is still one page: the commit bounds it.
                    slot[n..].fill(0);
                    pipe.bytes_read += n as u64;
                    filled += page;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (filled, true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    pipe.read_errors += 1;
                    log::debug!("cpu{} trace_pipe_raw: {e}", pipe.cpu);
                    return (filled, true);
                }
            }
        }
        (filled, false)
    }

    /// Reads and encodes everything available on every CPU. With splice a
    /// partly filled page stays in the kernel until `final_pass`, which
    /// reads it with read(2).
    pub(crate) fn drain(&mut self, final_pass: bool) {
        // Latency rules pair events older than the drain's start (watch.rs).
        let cutoff = self.encoder.watch_cutoff();
        for i in 0..self.pipes.len() {
            let modes: &[ReadMode] = match (self.mode, final_pass) {
                (ReadMode::Splice, true) => &[ReadMode::Splice, ReadMode::Read],
                (m, _) => &[m][..],
            };
            let pipe = &mut self.pipes[i];
            if let Some(m) = &mut pipe.map {
                loop {
                    let mut feed = MappedFeed {
                        m,
                        layout: self.layout,
                        budget: BATCH_PAGES,
                        in_span: false,
                        more: false,
                        caught_up: false,
                        bytes: 0,
                    };
                    let cursor = &mut pipe.cursor;
                    let before = cursor.last_ts;
                    self.encoder.encode_feed(
                        &mut self.output,
                        &self.table,
                        &self.filter,
                        cursor,
                        &mut feed,
                    );
                    let (more, bytes) = (feed.more, feed.bytes);
                    drop(feed);
                    if cursor.last_ts < before {
                        self.non_monotonic += 1;
                    }
                    pipe.bytes_read += bytes;
                    if !more {
                        break;
                    }
                }
                continue;
            }
            if modes == [ReadMode::Read] {
                // Page by page into one page of staging, encoded as read: a
                // bundle runs on across pages until it is full, so the CPU's
                // drain is not cut into a bundle per batch.
                let pipe = &mut self.pipes[i];
                let before = pipe.cursor.last_ts;
                let page = self.layout.page_size();
                let mut feed = ReadFeed {
                    file: &pipe.file,
                    page: &mut self.staging[..page],
                    layout: self.layout,
                    bytes_read: 0,
                    read_errors: 0,
                    cpu: pipe.cpu,
                    stop_when_caught_up: !final_pass,
                    caught_up: false,
                    pages: 0,
                };
                self.encoder.encode_feed(
                    &mut self.output,
                    &self.table,
                    &self.filter,
                    &mut pipe.cursor,
                    &mut feed,
                );
                pipe.bytes_read += feed.bytes_read;
                pipe.read_errors += feed.read_errors;
                if pipe.cursor.last_ts < before {
                    self.non_monotonic += 1;
                }
                continue;
            }
            for &mode in modes {
                loop {
                    let (filled, empty) = self.fill(i, mode);
                    if filled > 0 {
                        let pipe = &mut self.pipes[i];
                        let before = pipe.cursor.last_ts;
                        self.encoder.encode_pages(
                            &mut self.output,
                            &self.table,
                            &self.filter,
                            &self.layout,
                            &mut pipe.cursor,
                            &self.staging[..filled],
                        );
                        if pipe.cursor.last_ts < before {
                            self.non_monotonic += 1;
                        }
                    }
                    if empty {
                        break;
                    }
                }
            }
        }
        if let Some(c) = cutoff {
            self.encoder
                .settle_watch(if final_pass { u64::MAX } else { c });
        }
        self.encoder.take_pids(&mut self.pids);
        if !self.pids.is_empty()
            && let Some(sink) = &mut self.pid_sink
        {
            sink(&self.pids);
        }
    }

    /// Whether the CPUs' pipes are watched now: with a watermark, outside
    /// the quiet spell after a watermark drain.
    fn watching(&self, now: Instant) -> bool {
        self.watermark && now >= self.quiet_until
    }

    /// When the reader next wants [`on_due`](Self::on_due) without a CPU
    /// waking it: the periodic drain, or the end of a quiet spell (the
    /// pipes are watched again then).
    pub(crate) fn next_due(&self) -> Instant {
        if self.watermark && !self.watching(Instant::now()) {
            self.next.min(self.quiet_until)
        } else {
            self.next
        }
    }

    /// The CPUs' pipes to wait on for the watermark (none outside it).
    pub(crate) fn watched(&self) -> Vec<BorrowedFd<'_>> {
        if !self.watching(Instant::now()) {
            return Vec::new();
        }
        self.pipes.iter().map(|p| p.file.as_fd()).collect()
    }

    /// The periodic drain when it is due; or, when a watched pipe was
    /// readable (`woken`), an early drain at the watermark.
    pub(crate) fn on_due(&mut self, now: Instant, woken: bool) {
        if now >= self.next {
            let late = now.saturating_duration_since(self.next);
            let t = Instant::now();
            self.drain(false);
            let took = t.elapsed();
            if late > self.period / 2 || took > self.period / 2 {
                log::debug!("ftrace drain: {late:?} late, took {took:?}");
            }
            self.next = now + self.period;
        } else if woken && self.watching(now) {
            self.watermark_drains += 1;
            self.drain(false);
            self.quiet_until = now + MIN_WAKE_INTERVAL;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::ftrace::format::parse_header_page;

    fn fixture(name: &str) -> Vec<u8> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ftrace");
        std::fs::read(dir.join(name)).expect("fixture")
    }

    /// Spans a [`ReadFeed`] gives from a file of pages: a short one (the
    /// rest of a page the last drain stopped in), full ping-pong pages, a
    /// short one again (what the kernel hands out for the page it is still
    /// writing) and a full one.
    fn spans(stop_when_caught_up: bool) -> Vec<usize> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ftrace");
        let hp = std::fs::read_to_string(dir.join("tree/events/header_page")).expect("header_page");
        let layout = parse_header_page(&hp).expect("layout");
        let page = layout.page_size();
        let (full, short) = (fixture("pingpong_cpu0.raw"), fixture("cpu0.raw"));
        let mut pages = short[page..2 * page].to_vec();
        pages.extend_from_slice(&full[..2 * page]);
        pages.extend_from_slice(&short[page..2 * page]);
        pages.extend_from_slice(&full[2 * page..3 * page]);
        let path = std::env::temp_dir().join(format!(
            "recorder-readfeed-{}-{stop_when_caught_up}",
            std::process::id()
        ));
        std::fs::write(&path, &pages).expect("write pages");
        let file = File::open(&path).expect("open pages");
        let _ = std::fs::remove_file(&path);
        let mut buf = vec![0u8; page];
        let mut feed = ReadFeed {
            file: &file,
            page: &mut buf,
            layout,
            bytes_read: 0,
            read_errors: 0,
            cpu: 0,
            stop_when_caught_up,
            caught_up: false,
            pages: 0,
        };
        let mut stats = EncodeStats::default();
        std::iter::from_fn(|| feed.next_span(0, &mut stats))
            .map(|s| s.end - s.pos)
            .collect()
    }

    #[test]
    fn a_periodic_drain_stops_at_the_page_still_being_written() {
        assert_eq!(spans(true), [344, 4036, 4064, 344]);
    }

    #[test]
    fn a_final_drain_reads_to_the_end() {
        assert_eq!(spans(false), [344, 4036, 4064, 344, 4036]);
    }
}
