//! ReadBuffers: a session's file, packet by packet in its order, cut into
//! replies a client accepts (each under [`wire::MAX_READ_REPLY_BYTES`]); a
//! packet larger than that is split into slices, the last one marked.
//!
//! What was returned is consumed, as traced's ReadBuffers consumes its
//! buffers: a later read (of a running session, after a write pass added
//! to the file) goes on where the last one ended, and the pages already
//! returned are given back to the system.

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::wire;
use crate::protos::ReadBuffersResponse;
use crate::protos::read_buffers_response::Slice;
use crate::wire::framing::{self, Step};

/// Bytes read from the file at a time.
const WINDOW: usize = 1 << 20;

/// Reads a file of `0x0A <len> <packet>` records into ReadBuffers replies.
pub(crate) struct Readback {
    file: File,
    /// File offset of `buf[0]`.
    at: u64,
    /// Bytes from the start of the file already given back.
    released: u64,
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
    /// A record that does not parse: nothing after it is returned.
    corrupt: bool,
    /// The rest of a packet being sliced: (offset in `buf`, end).
    partial: Option<(usize, usize)>,
}

impl Readback {
    pub(crate) fn new(file: File) -> Self {
        Self {
            file,
            at: 0,
            released: 0,
            buf: Vec::new(),
            pos: 0,
            eof: false,
            corrupt: false,
            partial: None,
        }
    }

    /// Looks for data written since the end was last seen.
    pub(crate) fn resume(&mut self) {
        self.eof = false;
    }

    /// The next reply; `None` once everything written so far was returned.
    /// A record still being written waits for the next call; a corrupt one
    /// ends the readback where it starts.
    pub(crate) fn next_reply(&mut self) -> std::io::Result<Option<ReadBuffersResponse>> {
        let mut slices = Vec::new();
        let mut bytes = 0;
        loop {
            let room = wire::MAX_READ_REPLY_BYTES.saturating_sub(bytes);
            if room < 64 {
                break;
            }
            if let Some((from, end)) = self.partial {
                let take = (end - from).min(room);
                let last = from + take == end;
                slices.push(Slice {
                    data: Some(self.buf[from..from + take].to_vec()),
                    last_slice_for_packet: Some(last),
                });
                bytes += take + 16;
                self.partial = (!last).then_some((from + take, end));
                if last {
                    self.pos = end;
                }
                continue;
            }
            match framing::step(&self.buf[self.pos..], self.at + self.pos as u64) {
                Step::Frame(f) => {
                    let start = self.pos + f.header_len;
                    self.partial = Some((start, start + f.packet.len()));
                }
                _ if self.corrupt => break,
                Step::NeedMore if !self.eof => self.refill()?,
                Step::NeedMore => break,
                Step::Corrupt(_) => {
                    self.corrupt = true;
                    self.pos = self.buf.len();
                    break;
                }
            }
        }
        if slices.is_empty() {
            return Ok(None);
        }
        Ok(Some(ReadBuffersResponse { slices }))
    }

    /// Drops what was returned and reads the next window after the rest.
    fn refill(&mut self) -> std::io::Result<()> {
        self.buf.drain(..self.pos);
        self.at += self.pos as u64;
        self.pos = 0;
        self.release();
        let have = self.buf.len();
        // Only what the file holds past what is buffered: a read of a few
        // pages neither zeroes nor faults in a whole window.
        let from = self.at + have as u64;
        let left = self.file.metadata()?.len().saturating_sub(from);
        let want = usize::try_from(left).unwrap_or(WINDOW).min(WINDOW);
        if want == 0 {
            self.eof = true;
            return Ok(());
        }
        self.buf.resize(have + want, 0);
        let n = self.file.read_at(&mut self.buf[have..], from)?;
        self.buf.truncate(have + n);
        if n == 0 {
            self.eof = true;
        }
        Ok(())
    }

    /// Gives back the whole pages before the read position: a long session
    /// read while it runs holds only what was not read yet. Files that
    /// cannot punch holes keep their pages.
    fn release(&mut self) {
        let end = self.at & !(PAGE - 1);
        if end > self.released {
            use rustix::fs::{FallocateFlags, fallocate};
            let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            if fallocate(&self.file, flags, self.released, end - self.released).is_ok() {
                self.released = end;
            }
        }
    }
}

/// Hole punching works in whole pages.
const PAGE: u64 = 4096;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn packets_of(replies: &[ReadBuffersResponse]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut cur = Vec::new();
        for r in replies {
            for s in &r.slices {
                cur.extend_from_slice(s.data());
                if s.last_slice_for_packet() {
                    out.push(std::mem::take(&mut cur));
                }
            }
        }
        out
    }

    #[test]
    fn packets_come_back_whole_in_order_and_replies_stay_bounded() {
        let sizes = [0usize, 1, 100, 70_000, 300_000, 5, 2 * WINDOW + 3, 17];
        let packets: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| vec![i as u8; n])
            .collect();
        let mut f = tempfile::tempfile().expect("tempfile");
        for p in &packets {
            f.write_all(&framing::record(p)).expect("write");
        }
        // A torn tail is left out.
        f.write_all(&[0x0a, 0x80]).expect("write");
        let mut rb = Readback::new(f);
        let mut replies = Vec::new();
        while let Some(r) = rb.next_reply().expect("read") {
            assert!(prost::Message::encoded_len(&r) < wire::MAX_READ_REPLY_BYTES + 1024);
            replies.push(r);
        }
        assert_eq!(packets_of(&replies), packets);
    }

    #[test]
    fn a_growing_file_is_read_on_from_where_the_last_read_ended_and_read_pages_are_freed() {
        let memfd = rustix::fs::memfd_create("readback-test", rustix::fs::MemfdFlags::CLOEXEC)
            .expect("memfd");
        let mut w = File::from(memfd);
        let r = w.try_clone().expect("clone");
        let first: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 100_000]).collect();
        for p in &first {
            w.write_all(&framing::record(p)).expect("write");
        }
        // A record cut by the writer (not yet complete) waits.
        let next = vec![99u8; 5000];
        let rec = framing::record(&next);
        w.write_all(&rec[..10]).expect("write");
        let mut rb = Readback::new(r);
        let mut replies = Vec::new();
        while let Some(x) = rb.next_reply().expect("read") {
            replies.push(x);
        }
        assert_eq!(packets_of(&replies), first);
        assert!(rb.next_reply().expect("read").is_none());
        w.write_all(&rec[10..]).expect("write");
        rb.resume();
        let mut more = Vec::new();
        while let Some(x) = rb.next_reply().expect("read") {
            more.push(x);
        }
        assert_eq!(packets_of(&more), vec![next]);
        // What was read no longer takes memory.
        let st = rustix::fs::fstat(&w).expect("stat");
        assert!(
            (st.st_blocks as u64) * 512 < 2 * WINDOW as u64,
            "{} bytes still held of {}",
            st.st_blocks * 512,
            st.st_size
        );
    }
}
