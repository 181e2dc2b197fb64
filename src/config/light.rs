//! Light mode: a TraceConfig from a command line, as Perfetto's `perfetto`
//! client builds one when it is given no config
//! (`-t 10s -b 32mb sched freq idle sched/sched_switch`).
//!
//! The config is Perfetto's, field for field: one buffer of `-b` (default
//! 32 MiB, no fill policy: RING_BUFFER), `duration_ms` from `-t` (default
//! 10 s; 0: until stopped), `flush_period_ms` 30000, or with `-s`
//! `write_into_file` and `max_file_size_bytes` instead (Perfetto's client
//! sets the flush period there too, where its service ignores it); one `linux.ftrace` source
//! whose `ftrace_events` are the words with a `/` and whose
//! `atrace_categories` are the other words (each adds its kernel events,
//! [`super::categories`]); `linux.process_stats` (processes seen by ftrace)
//! and `linux.system_info`; for `disk` also `linux.sys_stats` with disk
//! statistics every second. It is built as text and loaded like any config,
//! so it is validated, printed by `--dry-run` and written into the trace's
//! `trace_config` packet as any other.
//!
//! Differences, on purpose: Perfetto's client accepts any word and records
//! what it can; here a word that is neither a category nor an event this
//! kernel has is refused with the nearest one. Perfetto's `symbolize_ksyms`
//! is left out (recorder does not symbolize), so is `gfx`'s Android-only
//! frame timeline source, and `hyp` (pKVM's hypervisor instance, Android
//! only) is refused.

use std::fmt::Write as _;

use thiserror::Error;

use super::categories;
use super::event_name::event_spec_problem;

/// Edits between `a` and `b`, a swap of two neighbours counting one (the
/// commonest slip: `shced`).
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

/// The candidate nearest to `word` when near enough to be a slip: at most
/// two edits, or a third of a long word.
fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let n = word.chars().count();
    // No name is that long; a huge word costs no comparisons.
    if n > 128 {
        return None;
    }
    let limit = (n / 3).max(2).min(n.saturating_sub(1));
    candidates
        .into_iter()
        .filter(|c| c.len().abs_diff(word.len()) <= limit)
        .map(|c| (distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Perfetto's defaults for `-t` and `-b`.
pub(crate) const DEFAULT_TIME_MS: u64 = 10_000;
/// 32 MiB.
pub(crate) const DEFAULT_BUFFER_KB: u64 = 32 * 1024;
/// The flush period Perfetto's light mode sets.
pub(crate) const FLUSH_PERIOD_MS: u64 = 30_000;
/// The disk statistics period the `disk` category adds.
pub(crate) const DISKSTAT_PERIOD_MS: u64 = 1000;

/// What the command line asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LightRequest {
    /// `-t` in milliseconds (`None`: [`DEFAULT_TIME_MS`]; 0: no duration).
    pub(crate) time_ms: Option<u64>,
    /// `-b` in KiB (`None`: [`DEFAULT_BUFFER_KB`]).
    pub buffer_kb: Option<u64>,
    /// `-s` in KiB: stream to the file and stop at this size.
    pub(crate) max_file_size_kb: Option<u64>,
    /// Events (`GROUP/NAME`, `GROUP/*`) and categories, in order.
    pub words: Vec<String>,
}

/// Why a command line makes no config.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum LightError {
    /// A word that is neither a category nor an event.
    #[error("{word:?} is neither a category nor an ftrace event{}", suggestion(.nearest))]
    Unknown {
        /// The word.
        word: String,
        /// The closest category, event or command, if one is close.
        nearest: Option<String>,
    },
    /// A word with a `/` that is not an event's name.
    #[error(transparent)]
    BadEvent(#[from] super::event_name::NotAnEvent),
    /// An event this kernel does not have.
    #[error(
        "this kernel has no ftrace event {word:?}{}",
        suggestion(.nearest)
    )]
    NoSuchEvent {
        /// The word.
        word: String,
        /// The closest event the kernel has, if one is close.
        nearest: Option<String>,
    },
    /// A word light mode does not record on Linux.
    #[error("{word:?}: {why}")]
    Unsupported {
        /// The word.
        word: String,
        /// Why.
        why: &'static str,
    },
    /// `-b 0`.
    #[error("--buffer must be more than 0")]
    NoBuffer,
    /// A size beyond what a config can say.
    #[error("{flag} {kb} KiB is larger than a TraceConfig can hold")]
    TooLarge {
        /// `--buffer` or `--size`.
        flag: &'static str,
        /// The size asked for.
        kb: u64,
    },
}

fn suggestion(nearest: &Option<String>) -> String {
    match nearest {
        Some(n) => format!("; did you mean {n:?}?"),
        None => format!(
            " (categories: {}; events are GROUP/NAME or GROUP/*, as under /sys/kernel/tracing/events)",
            categories::CATEGORIES
                .iter()
                .map(|c| c.name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Why a `-t` or `-b`/`-s` value is not one.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{value:?} is not {what} (expected {expected})")]
pub(crate) struct UnitError {
    value: String,
    what: &'static str,
    expected: &'static str,
}

/// A number and a unit from `units` (`0` alone needs none), as Perfetto's
/// client reads `-t` and `-b`: `value × multiplier`.
fn with_unit(
    arg: &str,
    units: &[(&str, u64)],
    what: &'static str,
    expected: &'static str,
) -> Result<u64, UnitError> {
    let bad = || UnitError {
        value: arg.to_string(),
        what,
        expected,
    };
    let digits = arg.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = arg.split_at(digits);
    let n: u64 = number.parse().map_err(|_| bad())?;
    if unit.is_empty() && n == 0 {
        return Ok(0);
    }
    let unit = unit.to_ascii_lowercase();
    let (_, mult) = units.iter().find(|(u, _)| *u == unit).ok_or_else(bad)?;
    n.checked_mul(*mult).ok_or_else(bad)
}

/// `-t`: `500ms`, `10s`, `5m`, `1h` (or `0`) in milliseconds.
pub(crate) fn parse_time_ms(arg: &str) -> Result<u64, UnitError> {
    with_unit(
        arg,
        &[("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)],
        "a duration",
        "a number with ms, s, m or h: 10s",
    )
}

/// `-b`, `-s`: `512kb`, `32mb`, `1gb` (or `k`, `m`, `g`) in KiB.
pub(crate) fn parse_size_kb(arg: &str) -> Result<u64, UnitError> {
    with_unit(
        arg,
        &[
            ("k", 1),
            ("kb", 1),
            ("m", 1024),
            ("mb", 1024),
            ("g", 1024 * 1024),
            ("gb", 1024 * 1024),
        ],
        "a size",
        "a number with kb, mb or gb: 32mb",
    )
}

/// The words sorted into events and categories, each once, in order.
#[derive(Debug, Default, PartialEq, Eq)]
struct Words {
    events: Vec<String>,
    categories: Vec<String>,
}

/// Sorts `words`; `kernel_events` (`group/name` of every event tracefs
/// lists, when it can be read) refuses events the kernel lacks; `commands`
/// are offered too for a mistyped subcommand.
fn sort_words(
    words: &[String],
    kernel_events: Option<&[String]>,
    commands: &[&str],
) -> Result<Words, LightError> {
    let mut out = Words::default();
    for w in words {
        if w.contains('/') {
            if let Some(why) = event_spec_problem(w) {
                return Err(LightError::BadEvent(why));
            }
            if let Some(known) = kernel_events {
                check_event(w, known)?;
            }
            if !out.events.contains(w) {
                out.events.push(w.clone());
            }
        } else if categories::find(w).is_some() {
            if !out.categories.contains(w) {
                out.categories.push(w.clone());
            }
        } else if w == "hyp" || w == "hypervisor" {
            return Err(LightError::Unsupported {
                word: w.clone(),
                why: "pKVM hypervisor events come from a tracefs instance only Android's pKVM kernels have; not recorded here",
            });
        } else {
            return Err(LightError::Unknown {
                word: w.clone(),
                nearest: nearest_word(w, kernel_events, commands),
            });
        }
    }
    Ok(out)
}

/// An event with `/` the kernel has (`group/*`: a group it has).
fn check_event(w: &str, known: &[String]) -> Result<(), LightError> {
    let (group, name) = w.split_once('/').unwrap_or((w, ""));
    let found = if name == "*" {
        known
            .iter()
            .any(|k| k.split_once('/').is_some_and(|(g, _)| g == group))
    } else {
        known.iter().any(|k| k == w)
    };
    if found {
        return Ok(());
    }
    let nearest = if name == "*" {
        let groups: Vec<&str> = known
            .iter()
            .filter_map(|k| k.split_once('/').map(|(g, _)| g))
            .collect();
        closest(group, groups).map(|g| format!("{g}/*"))
    } else {
        // The same name in another group first, then a near spelling.
        known
            .iter()
            .find(|k| k.split_once('/').is_some_and(|(_, n)| n == name))
            .cloned()
            .or_else(|| closest(w, known.iter().map(String::as_str)).map(str::to_string))
    };
    Err(LightError::NoSuchEvent {
        word: w.to_string(),
        nearest,
    })
}

/// The category, event or command nearest to a bare word: an event of that
/// exact name first (`sched_switch` → `sched/sched_switch`).
fn nearest_word(w: &str, kernel_events: Option<&[String]>, commands: &[&str]) -> Option<String> {
    let table_events = categories::CATEGORIES.iter().flat_map(|c| c.events.iter());
    let mut events: Vec<&str> = table_events.copied().collect();
    if let Some(k) = kernel_events {
        events.extend(k.iter().map(String::as_str));
    }
    if let Some(e) = events
        .iter()
        .find(|e| e.split_once('/').is_some_and(|(_, n)| n == w))
    {
        return Some((*e).to_string());
    }
    let names = categories::CATEGORIES
        .iter()
        .map(|c| c.name)
        .chain(commands.iter().copied());
    if let Some(n) = closest(w, names) {
        return Some(n.to_string());
    }
    let bare: Vec<&str> = events
        .iter()
        .filter_map(|e| e.split_once('/').map(|(_, n)| n))
        .collect();
    let n = closest(w, bare)?;
    events
        .iter()
        .find(|e| e.split_once('/').is_some_and(|(_, x)| x == n))
        .map(|e| (*e).to_string())
}

/// The TraceConfig `req` stands for, as text. `kernel_events` (every
/// `group/name` tracefs lists, `None` when it cannot be read: events are
/// then checked when recording) and `commands` are for refusing and
/// suggesting.
pub(crate) fn build(
    req: &LightRequest,
    kernel_events: Option<&[String]>,
    commands: &[&str],
) -> Result<String, LightError> {
    let words = sort_words(&req.words, kernel_events, commands)?;
    let buffer_kb = req.buffer_kb.unwrap_or(DEFAULT_BUFFER_KB);
    if buffer_kb == 0 {
        return Err(LightError::NoBuffer);
    }
    if u32::try_from(buffer_kb).is_err() {
        return Err(LightError::TooLarge {
            flag: "--buffer",
            kb: buffer_kb,
        });
    }
    let time_ms = req.time_ms.unwrap_or(DEFAULT_TIME_MS);
    let time_ms = u32::try_from(time_ms).unwrap_or(u32::MAX);
    let mut s = String::new();
    let _ = writeln!(s, "# recorder light mode{}", command_line(req));
    let _ = writeln!(s, "buffers {{\n  size_kb: {buffer_kb}\n}}");
    let _ = writeln!(s, "duration_ms: {time_ms}");
    match req.max_file_size_kb.filter(|kb| *kb > 0) {
        Some(kb) => {
            let bytes = kb
                .checked_mul(1024)
                .ok_or(LightError::TooLarge { flag: "--size", kb })?;
            // No flush_period_ms: beside write_into_file the service ignores
            // it (Perfetto's too), and says so in a warning.
            let _ = writeln!(s, "write_into_file: true\nmax_file_size_bytes: {bytes}");
        }
        None => {
            let _ = writeln!(s, "flush_period_ms: {FLUSH_PERIOD_MS}");
        }
    }
    if words.categories.iter().any(|c| c == "disk") {
        let _ = writeln!(
            s,
            "data_sources {{\n  config {{\n    name: \"linux.sys_stats\"\n    \
             sys_stats_config {{\n      diskstat_period_ms: {DISKSTAT_PERIOD_MS}\n    }}\n  }}\n}}"
        );
    }
    if !words.events.is_empty() || !words.categories.is_empty() {
        let _ = writeln!(
            s,
            "data_sources {{\n  config {{\n    name: \"linux.ftrace\"\n    ftrace_config {{"
        );
        for e in &words.events {
            let _ = writeln!(s, "      ftrace_events: \"{e}\"");
        }
        for c in &words.categories {
            let _ = writeln!(s, "      atrace_categories: \"{c}\"");
        }
        let _ = writeln!(s, "    }}\n  }}\n}}");
    }
    for name in ["linux.process_stats", "linux.system_info"] {
        let _ = writeln!(
            s,
            "data_sources {{\n  config {{\n    name: \"{name}\"\n    target_buffer: 0\n  }}\n}}"
        );
    }
    Ok(s)
}

/// The request as flags, for the config's first comment.
fn command_line(req: &LightRequest) -> String {
    let mut s = String::new();
    if let Some(t) = req.time_ms {
        let _ = write!(s, " -t {t}ms");
    }
    if let Some(b) = req.buffer_kb {
        let _ = write!(s, " -b {b}kb");
    }
    if let Some(kb) = req.max_file_size_kb {
        let _ = write!(s, " -s {kb}kb");
    }
    for w in &req.words {
        // Only words that passed the grammar reach here: no newline.
        let _ = write!(s, " {w}");
    }
    if s.is_empty() {
        s.push_str(" (defaults)");
    } else {
        s.insert(0, ':');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SourceKind, load_text};

    fn req(words: &[&str]) -> LightRequest {
        LightRequest {
            words: words.iter().map(|w| w.to_string()).collect(),
            ..LightRequest::default()
        }
    }

    fn kernel() -> Vec<String> {
        ["sched/sched_switch", "sched/sched_waking", "power/cpu_idle"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    #[test]
    fn units_are_perfettos() {
        assert_eq!(parse_time_ms("10s"), Ok(10_000));
        assert_eq!(parse_time_ms("500ms"), Ok(500));
        assert_eq!(parse_time_ms("2m"), Ok(120_000));
        assert_eq!(parse_time_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_time_ms("0"), Ok(0));
        assert_eq!(parse_size_kb("32mb"), Ok(32 * 1024));
        assert_eq!(parse_size_kb("8m"), Ok(8 * 1024));
        assert_eq!(parse_size_kb("1gb"), Ok(1024 * 1024));
        assert_eq!(parse_size_kb("512kb"), Ok(512));
        assert_eq!(parse_size_kb("64MB"), Ok(64 * 1024));
        for bad in ["10", "s", "", "10x", "-1s", "1.5s", "99999999999999999999h"] {
            assert!(parse_time_ms(bad).is_err(), "{bad:?}");
        }
        for bad in ["32", "mb", "32tb", "1 mb"] {
            assert!(parse_size_kb(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_swap_is_one_slip() {
        assert_eq!(distance("shced", "sched"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(closest("frq", ["freq", "irq"]), Some("freq"));
        assert_eq!(closest("zzzz", ["freq", "irq"]), None);
    }

    #[test]
    fn the_config_is_perfettos_light_mode_config() {
        let text = build(
            &LightRequest {
                time_ms: Some(3000),
                buffer_kb: Some(8192),
                max_file_size_kb: Some(100 * 1024),
                words: ["sched/sched_switch", "sched", "freq", "sched"]
                    .map(String::from)
                    .to_vec(),
            },
            Some(&kernel()),
            &[],
        )
        .expect("built");
        let spec = load_text(&text, "light", false)
            .expect("parses")
            .validate()
            .expect("valid");
        assert_eq!(spec.buffers.len(), 1);
        assert_eq!(spec.buffers[0].size.kb(), 8192);
        assert_eq!(
            spec.buffers[0].fill_policy,
            crate::config::FillPolicy::RingBuffer
        );
        assert_eq!(spec.duration.map(|d| d.as_millis()), Some(3000));
        let file = spec.file.as_ref().expect("write_into_file");
        assert_eq!(file.max_size.map(|b| b.bytes()), Some(100 * 1024 * 1024));
        let names: Vec<&str> = spec.data_sources.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["linux.ftrace", "linux.process_stats", "linux.system_info"]
        );
        let SourceKind::Ftrace(f) = &spec.data_sources[0].kind else {
            panic!("ftrace first");
        };
        assert_eq!(f.events, ["sched/sched_switch"]);
        assert_eq!(f.atrace_categories, ["sched", "freq"]);
        // The explicit event is not repeated among the categories' ones.
        assert!(
            f.category_events
                .contains(&"power/cpu_frequency".to_string())
        );
        assert!(
            !f.category_events
                .contains(&"sched/sched_switch".to_string())
        );
        let SourceKind::ProcessStats(p) = &spec.data_sources[1].kind else {
            panic!("process_stats second");
        };
        assert!(!p.disable_on_demand && !p.scan_all_processes_on_start);
    }

    #[test]
    fn defaults_are_ten_seconds_of_a_32_mib_ring_and_disk_adds_disk_stats() {
        let text = build(&req(&["disk"]), None, &[]).expect("built");
        let spec = load_text(&text, "light", false)
            .expect("parses")
            .validate()
            .expect("valid");
        assert_eq!(spec.buffers[0].size.kb(), 32 * 1024);
        assert_eq!(spec.duration.map(|d| d.as_millis()), Some(10_000));
        assert!(spec.file.is_none());
        assert_eq!(spec.data_sources[0].name, "linux.sys_stats");
        assert!(text.contains("diskstat_period_ms: 1000"), "{text}");
        // Without tracefs, events are taken as written (checked when recording).
        assert!(build(&req(&["kmem/mm_page_alloc"]), None, &[]).is_ok());
    }

    #[test]
    fn unknown_words_get_the_nearest_category_event_or_command() {
        let k = kernel();
        let err = |words: &[&str]| {
            build(&req(words), Some(&k), &["inspect", "bench"]).expect_err("refused")
        };
        assert_eq!(
            err(&["shced"]),
            LightError::Unknown {
                word: "shced".into(),
                nearest: Some("sched".into())
            }
        );
        assert_eq!(
            err(&["sched_switch"]),
            LightError::Unknown {
                word: "sched_switch".into(),
                nearest: Some("sched/sched_switch".into())
            }
        );
        assert_eq!(
            err(&["inspekt"]),
            LightError::Unknown {
                word: "inspekt".into(),
                nearest: Some("inspect".into())
            }
        );
        assert_eq!(
            err(&["sched/sched_swtich"]),
            LightError::NoSuchEvent {
                word: "sched/sched_swtich".into(),
                nearest: Some("sched/sched_switch".into())
            }
        );
        assert_eq!(
            err(&["power/sched_switch"]),
            LightError::NoSuchEvent {
                word: "power/sched_switch".into(),
                nearest: Some("sched/sched_switch".into())
            }
        );
        assert_eq!(
            err(&["powr/*"]),
            LightError::NoSuchEvent {
                word: "powr/*".into(),
                nearest: Some("power/*".into())
            }
        );
        assert!(matches!(err(&["../x"]), LightError::BadEvent(_)));
        assert!(matches!(err(&["hyp"]), LightError::Unsupported { .. }));
        let far = err(&["zzzzzzzz"]).to_string();
        assert!(far.contains("categories: binder_driver"), "{far}");
        assert_eq!(
            build(
                &LightRequest {
                    buffer_kb: Some(0),
                    ..req(&[])
                },
                None,
                &[]
            ),
            Err(LightError::NoBuffer)
        );
    }
}
