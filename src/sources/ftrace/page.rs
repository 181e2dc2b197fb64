//! Walking one raw ring-buffer page as read from `per_cpu/cpuN/trace_pipe_raw`.
//!
//! ```text
//!  page:  | timestamp u64 | commit (4|8 bytes) | data ...................... |
//!          commit: low bits = data length, bit 31 RB_MISSED_EVENTS,
//!                  bit 30 RB_MISSED_STORED (count stored after the data)
//!  event: | type_len:5 time_delta:27 | array[0] | payload ...
//!          type_len 1..=28 : payload of type_len*4 bytes right after the header
//!          type_len 0      : array[0] = payload length + 4, payload after it
//!          29 padding      : time_delta 0 → rest of page; else skip 4+array[0]
//!          30 time extend  : delta = array[0] << 27 | time_delta
//!          31 time stamp   : absolute = array[0] << 27 | time_delta
//! ```
//!
//! The walker never reads outside the page: every length is checked before it
//! is used, and a malformed page ends the walk with a [`PageError`].

use super::format::{PageLayout, read_uint};

const TYPE_PADDING: u32 = 29;
const TYPE_TIME_EXTEND: u32 = 30;
const TYPE_TIME_STAMP: u32 = 31;
const TYPE_DATA_MAX: u32 = 28;
const MISSED_EVENTS: u64 = 1 << 31;
const MISSED_STORED: u64 = 1 << 30;
/// The commit's length bits; the flags above it and the sign extension of
/// a negative `local_t` are masked off.
const COMMIT_LEN_MASK: u64 = (1 << 30) - 1;
/// The kernel keeps absolute stamps to 59 bits.
const TS_MASK: u64 = (1 << 59) - 1;

/// Why a page (or the rest of it) could not be walked. The discriminants
/// are Perfetto's `FtraceParseStatus` values, so they can be reported as is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[repr(u32)]
pub enum PageError {
    /// The page is shorter than its header, or its commit claims more data than
    /// the page holds.
    #[error("page shorter than its header or commit beyond the page")]
    InvalidPageHeader = 4,
    /// The page ends inside an event's 4-byte header.
    #[error("event header truncated")]
    ShortEventHeader = 5,
    /// The page ends before a padding record's length word.
    #[error("padding length truncated")]
    ShortPaddingLength = 7,
    /// A padding record's length runs past the page's data, or is shorter
    /// than its own length word.
    #[error("padding beyond the page")]
    InvalidPaddingLength = 8,
    /// The page ends inside a time extend's second word.
    #[error("time extend truncated")]
    ShortTimeExtend = 9,
    /// The page ends inside an absolute time stamp's second word.
    #[error("absolute time stamp truncated")]
    ShortTimeStamp = 10,
    /// The page ends before the length word of a `type_len` 0 event.
    #[error("data length truncated")]
    ShortDataLength = 11,
    /// A `type_len` 0 event whose length word leaves no payload.
    #[error("zero data length")]
    ZeroDataLength = 12,
    /// A data event runs past the page's data.
    #[error("event beyond the page")]
    InvalidDataLength = 13,
}

impl PageError {
    /// Perfetto's `FtraceParseStatus` number for this error.
    pub(crate) fn parse_status(self) -> u32 {
        self as u32
    }
}

/// The decoded page header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader {
    /// The timestamp the page's first event delta counts from.
    pub timestamp: u64,
    /// Bytes of event data after the header.
    pub data_len: usize,
    /// The kernel dropped events before this page (ring overwritten).
    pub missed_events: bool,
    /// How many, when the kernel stored the count.
    pub(crate) missed_count: Option<u64>,
}

/// One data record of a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEvent<'p> {
    /// The event's timestamp: the page's, plus every delta up to it.
    pub timestamp: u64,
    /// Offset of the payload within the page.
    pub offset: usize,
    /// The record (common fields first).
    pub payload: &'p [u8],
}

/// Parses the header of `page` with `layout`.
pub fn parse_header(page: &[u8], layout: &PageLayout) -> Result<PageHeader, PageError> {
    let timestamp =
        read_uint(page, layout.timestamp_offset, 8).ok_or(PageError::InvalidPageHeader)?;
    let commit = read_uint(page, layout.commit_offset, layout.commit_size)
        .ok_or(PageError::InvalidPageHeader)?;
    let room = page
        .len()
        .saturating_sub(layout.data_offset)
        .min(layout.data_size);
    if page.len() < layout.data_offset {
        return Err(PageError::InvalidPageHeader);
    }
    header_from_words(timestamp, commit, room, |at| {
        read_uint(page, layout.data_offset + at, layout.commit_size)
    })
}

/// The header from a page's two words, for pages not held as one slice
/// (a mapped sub-buffer): `room` is the data bytes the page holds and
/// `stored_count` reads the `long` at that offset after the data start.
pub(crate) fn header_from_words(
    timestamp: u64,
    commit: u64,
    room: usize,
    stored_count: impl FnOnce(usize) -> Option<u64>,
) -> Result<PageHeader, PageError> {
    let data_len = (commit & COMMIT_LEN_MASK) as usize;
    if data_len > room {
        return Err(PageError::InvalidPageHeader);
    }
    let missed_events = commit & MISSED_EVENTS != 0;
    let missed_count = if missed_events && commit & MISSED_STORED != 0 {
        // Stored as a `long` right after the data, when it fits.
        stored_count(data_len)
    } else {
        None
    };
    Ok(PageHeader {
        timestamp,
        data_len,
        missed_events,
        missed_count,
    })
}

/// Iterates the data records of one page.
pub struct EventIter<'p> {
    page: &'p [u8],
    pos: usize,
    end: usize,
    ts: u64,
    done: bool,
}

impl<'p> EventIter<'p> {
    /// Walks `page`, whose header was parsed as `header`.
    pub fn new(page: &'p [u8], layout: &PageLayout, header: &PageHeader) -> Self {
        let pos = layout.data_offset.min(page.len());
        let end = (pos + header.data_len).min(page.len());
        Self {
            page,
            pos,
            end,
            ts: header.timestamp,
            done: false,
        }
    }

    /// Walks `bytes[pos..end]`, events of one page whose running timestamp
    /// at `pos` is `ts` (a page's data, or the rest of it after a pause).
    pub(crate) fn span(bytes: &'p [u8], pos: usize, end: usize, ts: u64) -> Self {
        let end = end.min(bytes.len());
        Self {
            page: bytes,
            pos: pos.min(end),
            end,
            ts,
            done: false,
        }
    }

    /// Where the walk stands: the next record's offset and the running
    /// timestamp there (to resume with [`EventIter::span`]).
    pub fn position(&self) -> (usize, u64) {
        (self.pos, self.ts)
    }

    fn u32_at(&self, at: usize) -> Option<u32> {
        read_uint(&self.page[..self.end], at, 4).map(|v| v as u32)
    }

    /// The data event whose payload is `start..next`, `delta` after the
    /// one before; the walk goes on after it.
    fn event(&mut self, delta: u64, start: usize, next: usize) -> Result<RawEvent<'p>, PageError> {
        if next > self.end {
            return Err(PageError::InvalidDataLength);
        }
        self.ts = self.ts.wrapping_add(delta);
        self.pos = next;
        Ok(RawEvent {
            timestamp: self.ts,
            offset: start,
            payload: &self.page[start..next],
        })
    }

    /// The next data record, time records and padding applied on the way;
    /// `Ok(None)` at the span's end.
    pub fn step(&mut self) -> Result<Option<RawEvent<'p>>, PageError> {
        loop {
            if self.pos >= self.end {
                return Ok(None);
            }
            let hdr = self.u32_at(self.pos).ok_or(PageError::ShortEventHeader)?;
            let type_len = hdr & 0x1f;
            let delta = (hdr >> 5) as u64;
            let body = self.pos + 4;
            match type_len {
                TYPE_PADDING => {
                    if delta == 0 {
                        // Null padding: nothing valid follows on this page.
                        self.pos = self.end;
                        return Ok(None);
                    }
                    let len = self.u32_at(body).ok_or(PageError::ShortPaddingLength)? as usize;
                    let next = body
                        .checked_add(len)
                        .ok_or(PageError::InvalidPaddingLength)?;
                    if next > self.end || len < 4 {
                        return Err(PageError::InvalidPaddingLength);
                    }
                    self.pos = next;
                }
                TYPE_TIME_EXTEND => {
                    let hi = self.u32_at(body).ok_or(PageError::ShortTimeExtend)? as u64;
                    self.ts = self.ts.wrapping_add((hi << 27) | delta);
                    self.pos = body + 4;
                }
                TYPE_TIME_STAMP => {
                    let hi = self.u32_at(body).ok_or(PageError::ShortTimeStamp)? as u64;
                    let abs = ((hi << 27) | delta) & TS_MASK;
                    // Keep the page's bits above the 59 the kernel stores.
                    self.ts = (self.ts & !TS_MASK) | abs;
                    self.pos = body + 4;
                }
                0 => {
                    let len = self.u32_at(body).ok_or(PageError::ShortDataLength)? as usize;
                    if len <= 4 {
                        return Err(PageError::ZeroDataLength);
                    }
                    let next = body.checked_add(len).ok_or(PageError::InvalidDataLength)?;
                    return self.event(delta, body + 4, next).map(Some);
                }
                n => {
                    debug_assert!(n <= TYPE_DATA_MAX);
                    return self.event(delta, body, body + 4 * n as usize).map(Some);
                }
            }
        }
    }
}

impl<'p> Iterator for EventIter<'p> {
    type Item = Result<RawEvent<'p>, PageError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.step() {
            Ok(Some(e)) => Some(Ok(e)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Builds synthetic pages for tests and fuzz seeds, in the 64-bit layout.
pub mod build {
    /// Appends events to a page image.
    pub struct PageBuilder {
        /// The page image so far: the header's timestamp and a zero commit, then
        /// the records appended.
        pub buf: Vec<u8>,
        page_size: usize,
    }

    impl PageBuilder {
        /// An empty page of `page_size` bytes whose header timestamp is
        /// `timestamp`.
        pub fn new(timestamp: u64, page_size: usize) -> Self {
            let mut buf = Vec::with_capacity(page_size);
            buf.extend_from_slice(&timestamp.to_le_bytes());
            buf.extend_from_slice(&0u64.to_le_bytes());
            Self { buf, page_size }
        }

        fn header(&mut self, type_len: u32, delta: u32) {
            self.buf
                .extend_from_slice(&((delta << 5) | type_len).to_le_bytes());
        }

        /// A data record; `payload` is padded to 4 bytes.
        pub fn event(&mut self, delta: u32, payload: &[u8]) -> &mut Self {
            let padded = payload.len().div_ceil(4) * 4;
            if padded <= 28 * 4 && !payload.is_empty() {
                self.header((padded / 4) as u32, delta);
            } else {
                self.header(0, delta);
                self.buf
                    .extend_from_slice(&((padded + 4) as u32).to_le_bytes());
            }
            self.buf.extend_from_slice(payload);
            self.buf.resize(self.buf.len() + padded - payload.len(), 0);
            self
        }

        /// A time extend adding `delta` to the running timestamp.
        pub fn time_extend(&mut self, delta: u64) -> &mut Self {
            self.header(30, (delta & ((1 << 27) - 1)) as u32);
            self.buf
                .extend_from_slice(&((delta >> 27) as u32).to_le_bytes());
            self
        }

        /// An absolute time stamp setting the running timestamp to `ts`.
        pub fn time_stamp(&mut self, ts: u64) -> &mut Self {
            self.header(31, (ts & ((1 << 27) - 1)) as u32);
            self.buf
                .extend_from_slice(&((ts >> 27) as u32).to_le_bytes());
            self
        }

        /// A discarded record of `len` bytes after its header (len ≥ 4).
        pub fn padding(&mut self, len: u32) -> &mut Self {
            self.header(29, 1);
            self.buf.extend_from_slice(&len.to_le_bytes());
            self.buf.resize(self.buf.len() + len as usize - 4, 0);
            self
        }

        /// Finishes the page: sets commit (with flags) and pads to the page size.
        pub fn finish(&mut self, missed: Option<Option<u64>>) -> Vec<u8> {
            let len = (self.buf.len() - 16) as u64;
            let mut commit = len;
            let mut page = self.buf.clone();
            if let Some(count) = missed {
                commit |= 1 << 31;
                if let Some(c) = count {
                    commit |= 1 << 30;
                    page.extend_from_slice(&c.to_le_bytes());
                }
                // A negative local_t reads back sign-extended.
                commit |= 0xffff_ffff_0000_0000;
            }
            page[8..16].copy_from_slice(&commit.to_le_bytes());
            page.resize(self.page_size.max(page.len()), 0);
            page
        }
    }
}

#[cfg(test)]
mod tests {
    use super::build::PageBuilder;
    use super::*;

    const LAYOUT: PageLayout = PageLayout {
        timestamp_offset: 0,
        commit_offset: 8,
        commit_size: 8,
        data_offset: 16,
        data_size: 4080,
    };

    type Walk = (PageHeader, Vec<(u64, Vec<u8>)>, Option<PageError>);

    fn walk(page: &[u8]) -> Walk {
        let h = parse_header(page, &LAYOUT).expect("header");
        let mut evs = Vec::new();
        let mut err = None;
        for e in EventIter::new(page, &LAYOUT, &h) {
            match e {
                Ok(e) => evs.push((e.timestamp, e.payload.to_vec())),
                Err(e) => err = Some(e),
            }
        }
        (h, evs, err)
    }

    #[test]
    fn deltas_extends_stamps_padding() {
        let page = PageBuilder::new(1000, 4096)
            .event(5, &[1, 0, 0, 0])
            .time_extend(1 << 40)
            .event(7, &[2, 0, 0, 0, 9, 9, 9, 9])
            .padding(12)
            .time_stamp(5_000_000_000)
            .event(3, &[3; 200])
            .finish(None);
        let (h, evs, err) = walk(&page);
        assert!(!h.missed_events);
        assert_eq!(err, None);
        let ts: Vec<u64> = evs.iter().map(|e| e.0).collect();
        assert_eq!(ts, [1005, 1005 + (1 << 40) + 7, 5_000_000_003]);
        assert_eq!(evs[1].1, [2, 0, 0, 0, 9, 9, 9, 9]);
        assert_eq!(evs[2].1.len(), 200);
    }

    #[test]
    fn missed_events_flags() {
        let page = PageBuilder::new(1, 4096)
            .event(1, &[1; 8])
            .finish(Some(Some(42)));
        let (h, evs, _) = walk(&page);
        assert!(h.missed_events);
        assert_eq!(h.missed_count, Some(42));
        assert_eq!(h.data_len, 12);
        assert_eq!(evs.len(), 1);
        let page = PageBuilder::new(1, 4096)
            .event(1, &[1; 8])
            .finish(Some(None));
        let (h, _, _) = walk(&page);
        assert!(h.missed_events);
        assert_eq!(h.missed_count, None);
    }

    #[test]
    fn null_padding_ends_page_and_truncation_is_an_error() {
        let mut b = PageBuilder::new(0, 4096);
        b.event(1, &[1; 4]);
        b.buf.extend_from_slice(&29u32.to_le_bytes());
        b.buf.extend_from_slice(&[0xaa; 8]);
        let (_, evs, err) = walk(&b.finish(None));
        assert_eq!((evs.len(), err), (1, None));

        let mut b = PageBuilder::new(0, 4096);
        b.event(1, &[1; 4]);
        // Claims 28 words but the commit ends right after the header.
        b.buf.extend_from_slice(&28u32.to_le_bytes());
        let (_, evs, err) = walk(&b.finish(None));
        assert_eq!((evs.len(), err), (1, Some(PageError::InvalidDataLength)));
    }

    #[test]
    fn bad_commit_refused() {
        let mut page = vec![0u8; 4096];
        page[8..16].copy_from_slice(&5000u64.to_le_bytes());
        assert_eq!(
            parse_header(&page, &LAYOUT),
            Err(PageError::InvalidPageHeader)
        );
        assert_eq!(
            parse_header(&page[..10], &LAYOUT),
            Err(PageError::InvalidPageHeader)
        );
    }
}
