//! Log lines a peer may cause: every socket the recorder serves logs on
//! behalf of local users, who must not be able to fill the disk or forge
//! lines. A uid gets a burst of lines, then one per interval; lines left
//! out are counted and said with the next one written. And whatever a peer
//! sent is shown escaped and cut ([`for_log`]).

use std::time::{Duration, Instant};

/// Lines one uid may cause at once …
pub const LOG_BURST: u32 = 20;
/// … and then one per interval; the rest are counted.
pub const LOG_INTERVAL: Duration = Duration::from_secs(1);
/// Characters of a peer's text a log line shows at most.
pub(crate) const MAX_LOGGED_CHARS: usize = 128;

/// One uid's log budget.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogBucket {
    tokens: u32,
    /// When tokens were last added (`None`: never logged yet).
    refilled: Option<Instant>,
    /// Lines left out since the last one written.
    unsaid: u64,
}

impl Default for LogBucket {
    fn default() -> Self {
        Self {
            tokens: LOG_BURST,
            refilled: None,
            unsaid: 0,
        }
    }
}

impl LogBucket {
    /// Whether a line may be written at `now`: `Some` with how many lines
    /// were left out before it, `None` when this one is left out (and
    /// counted).
    pub(crate) fn take(&mut self, now: Instant) -> Option<u64> {
        let last = *self.refilled.get_or_insert(now);
        let refills = now.saturating_duration_since(last).as_nanos() / LOG_INTERVAL.as_nanos();
        if refills > 0 {
            self.tokens = self
                .tokens
                .saturating_add(u32::try_from(refills).unwrap_or(u32::MAX))
                .min(LOG_BURST);
            self.refilled = Some(now);
        }
        if self.tokens == 0 {
            self.unsaid += 1;
            return None;
        }
        self.tokens -= 1;
        Some(std::mem::take(&mut self.unsaid))
    }
}

/// `text` from a peer as a log line may show it: control characters
/// escaped (a newline cannot forge a line), at most [`MAX_LOGGED_CHARS`]
/// characters, the length said when cut.
pub(crate) fn for_log(text: &str) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == MAX_LOGGED_CHARS {
            out.push_str(&format!("… ({} bytes)", text.len()));
            break;
        }
        push_escaped(&mut out, c, c.is_control() || c == '"' || c == '\\');
    }
    out
}

/// Pushes `c` to `out`, escaped as Rust writes it (`\n`, `\u{1b}`) when
/// `escape`.
pub(crate) fn push_escaped(out: &mut String, c: char, escape: bool) {
    if escape {
        out.extend(c.escape_default());
    } else {
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_per_interval_and_the_rest_counted() {
        let mut b = LogBucket::default();
        let t0 = Instant::now();
        for _ in 0..LOG_BURST {
            assert_eq!(b.take(t0), Some(0));
        }
        assert_eq!(b.take(t0), None);
        assert_eq!(b.take(t0), None);
        assert_eq!(b.take(t0 + LOG_INTERVAL), Some(2));
        assert_eq!(b.take(t0 + LOG_INTERVAL), None);
    }

    #[test]
    fn peer_text_cannot_forge_a_line_or_flood_one() {
        assert_eq!(for_log("a\nrecorder: forged"), "a\\nrecorder: forged");
        let long = "k".repeat(120_000);
        let shown = for_log(&long);
        assert!(shown.len() < 200, "{}", shown.len());
        assert!(shown.ends_with("(120000 bytes)"));
    }
}
