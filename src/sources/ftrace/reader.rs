//! The reader thread: every drain period it reads every CPU's
//! `per_cpu/cpuN/trace_pipe_raw` (non-blocking `read(2)`, a page per call)
//! until the kernel has nothing more, and encodes the pages as bundles.
//!
//! `read(2)` rather than splice: with a periodic drain only the last page of
//! each CPU per period is partial, and it needs one syscall per page instead
//! of splice's two (into a pipe, then out of it); see BENCHMARKS.md.

use std::fs::File;
use std::io::{self, Read};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use super::encode::{BundleEncoder, CpuCursor, PrintFilter};
use super::event_table::EventTable;
use super::format::PageLayout;
use super::output::PacketOutput;

/// Pages read from one CPU before they are encoded (bounds the staging buffer).
pub const BATCH_PAGES: usize = 64;

/// Callback told the thread ids seen in each drain.
pub type PidSink = Box<dyn FnMut(&[i32]) + Send>;

/// Requests to the reader thread.
pub enum Command {
    /// Drain now, then acknowledge.
    Flush(Sender<()>),
    /// Drain a last time and exit.
    Stop,
}

/// One CPU's raw pipe.
pub struct CpuPipe {
    pub cpu: u32,
    pub file: File,
    /// Bytes read from it so far.
    pub bytes_read: u64,
    pub read_errors: u64,
    pub cursor: CpuCursor,
}

/// Everything the thread owns while it runs; handed back when it exits.
pub struct ReaderState<O: PacketOutput> {
    pub output: O,
    pub encoder: BundleEncoder,
    pub pipes: Vec<CpuPipe>,
    pub table: Arc<EventTable>,
    pub filter: PrintFilter,
    pub layout: PageLayout,
    pub pid_sink: Option<PidSink>,
    staging: Vec<u8>,
    pids: Vec<i32>,
    /// Per CPU: a timestamp went backwards (should never happen).
    pub non_monotonic: u64,
}

impl<O: PacketOutput> ReaderState<O> {
    pub fn new(
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
            staging,
            pids: Vec::new(),
            non_monotonic: 0,
        }
    }

    /// Reads and encodes everything available on every CPU.
    pub fn drain(&mut self) {
        let page = self.layout.page_size();
        for i in 0..self.pipes.len() {
            loop {
                let mut filled = 0;
                let mut empty = false;
                while filled + page <= self.staging.len() {
                    let slot = &mut self.staging[filled..filled + page];
                    match self.pipes[i].file.read(slot) {
                        Ok(0) => {
                            empty = true;
                            break;
                        }
                        Ok(n) => {
                            // A short read is still one page: the commit bounds it.
                            slot[n..].fill(0);
                            self.pipes[i].bytes_read += n as u64;
                            filled += page;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            empty = true;
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            self.pipes[i].read_errors += 1;
                            log::debug!("cpu{} trace_pipe_raw: {e}", self.pipes[i].cpu);
                            empty = true;
                            break;
                        }
                    }
                }
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
        self.encoder.take_pids(&mut self.pids);
        if !self.pids.is_empty()
            && let Some(sink) = &mut self.pid_sink
        {
            sink(&self.pids);
        }
    }

    /// The thread body: drain every `period` and on request, until Stop.
    pub fn run(mut self, period: Duration, rx: Receiver<Command>) -> Self {
        loop {
            match rx.recv_timeout(period) {
                Err(RecvTimeoutError::Timeout) => self.drain(),
                Ok(Command::Flush(ack)) => {
                    self.drain();
                    let _ = ack.send(());
                }
                Ok(Command::Stop) | Err(RecvTimeoutError::Disconnected) => {
                    self.drain();
                    return self;
                }
            }
        }
    }
}
