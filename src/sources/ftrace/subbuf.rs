//! The size of the kernel's ring-buffer sub-buffers (`buffer_subbuf_size_kb`,
//! Linux 6.8+): the unit `trace_pipe_raw` hands out per `read(2)` and the
//! unit the kernel overwrites when a buffer is full.
//!
//! Each `read(2)` of a full sub-buffer pays a fixed cost in the kernel (the
//! reader-page swap under the buffer's lock, the syscall) besides the copy.
//! With the kernel's default of one 4 KiB page that fixed part was about a
//! sixth of the recorder's CPU under a context-switch storm; 16 KiB
//! sub-buffers spread it over four times the events (docs/ftrace.md).
//!
//! Larger ones make the kernel copy a partly filled sub-buffer event by
//! event more often and make the unit of loss coarser, so the recorder
//! stays at 16 KiB and only where the per-CPU buffer still holds at least
//! [`MIN_SUBBUFS`] of them.

/// The environment variable that sets the size in KiB (`4` keeps one page
/// per sub-buffer as the kernel does by default).
pub(crate) const SUBBUF_ENV: &str = "RECORDER_FTRACE_SUBBUF_KB";

/// The size chosen when none is asked for.
pub const DEFAULT_SUBBUF_KB: u32 = 16;

/// Sub-buffers a per-CPU buffer keeps at least: below that the kernel's
/// default is left alone, so a small buffer does not lose in large steps.
pub(crate) const MIN_SUBBUFS: u32 = 64;

/// The largest size accepted (the kernel refuses orders above its own limit;
/// beyond this nothing is gained and a partial sub-buffer costs much more).
pub const MAX_SUBBUF_KB: u32 = 1024;

/// How the sub-buffer size is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SubbufSize {
    /// [`DEFAULT_SUBBUF_KB`] where the buffer is large enough, else as found.
    #[default]
    Auto,
    /// This many KiB (a power of two, at least a page).
    Kb(u32),
}

/// [`SUBBUF_ENV`] holds something that is not a usable size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{SUBBUF_ENV}={0:?}: expected `auto` or a power of two from 4 to {MAX_SUBBUF_KB} (KiB)")]
pub struct BadSubbufSize(pub String);

impl SubbufSize {
    /// `auto` (or empty) or a power of two in KiB, 4 to [`MAX_SUBBUF_KB`].
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "" | "auto" => Some(Self::Auto),
            n => n
                .parse::<u32>()
                .ok()
                .filter(|k| k.is_power_of_two() && (4..=MAX_SUBBUF_KB).contains(k))
                .map(Self::Kb),
        }
    }

    /// The size [`SUBBUF_ENV`] asks for (`Auto` when unset).
    pub(crate) fn from_env() -> Result<Self, BadSubbufSize> {
        match std::env::var(SUBBUF_ENV) {
            Err(_) => Ok(Self::Auto),
            Ok(v) => Self::parse(&v).ok_or(BadSubbufSize(v)),
        }
    }

    /// The size to write for a buffer of `per_cpu_kb` KiB per CPU on a
    /// system with `page_kb` KiB pages, or `None` to leave it as it is.
    pub fn choose(self, per_cpu_kb: u32, page_kb: u32) -> Option<u32> {
        match self {
            Self::Kb(k) => Some(k.max(page_kb)),
            Self::Auto
                if DEFAULT_SUBBUF_KB > page_kb && per_cpu_kb / DEFAULT_SUBBUF_KB >= MIN_SUBBUFS =>
            {
                Some(DEFAULT_SUBBUF_KB)
            }
            Self::Auto => None,
        }
    }
}

/// What this kernel does with a write of `buffer_subbuf_size_kb`: some
/// refuse it (EPERM, even on a new instance and for the size it already
/// has), and the recorder then keeps the kernel's size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settable {
    /// The kernel takes the write.
    Yes,
    /// No `buffer_subbuf_size_kb` (before Linux 6.8).
    Absent,
    /// The kernel refuses it: why.
    Refused(String),
}

/// Asks the kernel once, on an instance of its own
/// (`recorder-PID-SUBBUF_PROBE`, removed before returning; named so that a
/// crash leaves it to the stale-instance sweep), to take its sub-buffer
/// size back as it is. `None`: it cannot be told (no rights to make an
/// instance).
pub fn probe(top: &super::tracefs::Tracefs) -> Option<Settable> {
    const FILE: &str = "buffer_subbuf_size_kb";
    if top.read(FILE).is_err() {
        return Some(Settable::Absent);
    }
    let name = format!(
        "{}{}-{SUBBUF_PROBE}",
        super::tracefs::INSTANCE_PREFIX,
        std::process::id()
    );
    let inst = top.instance(&name);
    std::fs::create_dir(inst.root()).ok()?;
    let answer = inst.read(FILE).map_err(|e| e.to_string()).and_then(|now| {
        std::fs::write(inst.path(FILE), now.trim())
            .map_err(|e| format!("writing {FILE} back as it is, on a new instance: {e}"))
    });
    let _ = std::fs::remove_dir(inst.root());
    Some(match answer {
        Ok(()) => Settable::Yes,
        Err(why) => Settable::Refused(why),
    })
}

/// The number in the probe instance's name (`recorder-PID-N`).
const SUBBUF_PROBE: u32 = 999_999;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_powers_of_two_in_range() {
        assert_eq!(SubbufSize::parse("auto"), Some(SubbufSize::Auto));
        assert_eq!(SubbufSize::parse(""), Some(SubbufSize::Auto));
        assert_eq!(SubbufSize::parse("16"), Some(SubbufSize::Kb(16)));
        assert_eq!(SubbufSize::parse(" 4\n"), Some(SubbufSize::Kb(4)));
        for bad in ["0", "2", "12", "2048", "-4", "16k", "big"] {
            assert_eq!(SubbufSize::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn auto_takes_16_kib_only_with_room_for_64_of_them() {
        assert_eq!(SubbufSize::Auto.choose(8192, 4), Some(16));
        assert_eq!(SubbufSize::Auto.choose(1024, 4), Some(16));
        assert_eq!(SubbufSize::Auto.choose(1008, 4), None);
        assert_eq!(SubbufSize::Auto.choose(64, 4), None);
        // 16 KiB or 64 KiB pages: one page per sub-buffer already.
        assert_eq!(SubbufSize::Auto.choose(8192, 16), None);
        assert_eq!(SubbufSize::Auto.choose(8192, 64), None);
        assert_eq!(SubbufSize::Kb(4).choose(8192, 4), Some(4));
        assert_eq!(SubbufSize::Kb(4).choose(8192, 64), Some(64));
        assert_eq!(SubbufSize::Kb(64).choose(64, 4), Some(64));
    }
}
