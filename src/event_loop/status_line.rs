//! The live status line on a terminal's stderr: elapsed time, state, bytes
//! written and rate, and each buffer's fill and loss.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use crate::bytes::HumanBytes;
use crate::ringbuf::BufferStats;

/// How often the line is redrawn.
const PERIOD: Duration = Duration::from_millis(500);

/// What the line shows, read when it is drawn.
pub(crate) struct StatusFigures<'a> {
    pub elapsed: Duration,
    pub state: &'a str,
    pub bytes_written: u64,
    pub buffers: Vec<BufferStats>,
}

/// The status line, when stderr is a terminal.
pub(super) struct StatusLine {
    bar: indicatif::ProgressBar,
    next: Instant,
    /// Bytes written at the start of the rate window.
    window: (Instant, u64),
}

impl StatusLine {
    /// A status line, or `None` when stderr is not a terminal.
    pub(super) fn on_terminal() -> Option<Self> {
        if !std::io::stderr().is_terminal() {
            return None;
        }
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(4));
        let now = Instant::now();
        Some(Self {
            bar,
            next: now,
            window: (now, 0),
        })
    }

    /// How long until the next redraw.
    pub(super) fn until_due(&self) -> Duration {
        self.next.saturating_duration_since(Instant::now())
    }

    /// Redraws if due.
    pub(super) fn draw_if_due(&mut self, figures: impl FnOnce() -> StatusFigures<'static>) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + PERIOD;
        let f = figures();
        let dt = now.duration_since(self.window.0).as_secs_f64();
        let rate = if dt > 0.0 {
            f.bytes_written.saturating_sub(self.window.1) as f64 / dt / 1e6
        } else {
            0.0
        };
        if dt >= 1.0 {
            self.window = (now, f.bytes_written);
        }
        let mut msg = format!(
            "{:>6.1}s  {}  written {}  {:.1} MB/s",
            f.elapsed.as_secs_f64(),
            f.state,
            HumanBytes(f.bytes_written),
            rate
        );
        for (i, s) in f.buffers.iter().enumerate() {
            let fill = if s.buffer_size > 0 {
                100.0 * s.bytes_buffered as f64 / s.buffer_size as f64
            } else {
                0.0
            };
            msg.push_str(&format!("  buf{i} {fill:.0}%"));
            let lost = s.bytes_overwritten + s.bytes_discarded;
            if lost > 0 {
                msg.push_str(&format!(" lost {}", HumanBytes(lost)));
            }
        }
        self.bar.set_message(msg);
        self.bar.tick();
    }

    /// Clears the line for the summary.
    pub(super) fn finish(self) {
        self.bar.finish_and_clear();
    }
}
