//! Perfetto's own trace processor as the third oracle: SQL over a trace file,
//! run through the `trace_processor` wrapper of Perfetto's prebuilt tools
//! (v58.2, the engine behind the Perfetto UI), which the repository does not
//! carry: `$RECORDER_TRACE_PROCESSOR` names it, else `trace_processor_shell`
//! on `$PATH`.
//!
//! A missing or unusable trace processor skips the check with the reason;
//! under `RECORDER_REQUIRE_PEERS=1` (CI) that is a failure, as for Perfetto's
//! test configs.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::need::{on_path, peers_required};

/// One value of a result row, as the shell prints it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

impl Value {
    /// The integer, or panics naming what it is instead.
    pub fn int(&self) -> i64 {
        match self {
            Value::Int(i) => *i,
            Value::Real(r) if r.fract() == 0.0 => *r as i64,
            other => panic!("not an integer: {other:?}"),
        }
    }

    /// The text, or panics naming what it is instead.
    pub fn text(&self) -> &str {
        match self {
            Value::Text(s) => s,
            other => panic!("not text: {other:?}"),
        }
    }

    /// The text, or None for NULL.
    pub fn opt_text(&self) -> Option<&str> {
        match self {
            Value::Null => None,
            v => Some(v.text()),
        }
    }

    /// The integer, or None for NULL.
    pub fn opt_int(&self) -> Option<i64> {
        match self {
            Value::Null => None,
            v => Some(v.int()),
        }
    }
}

/// The result of one query: column names and rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
}

impl Rows {
    pub fn col(&self, name: &str) -> usize {
        self.columns
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("no column {name} in {:?}", self.columns))
    }

    /// The values of one column, in row order.
    pub fn column(&self, name: &str) -> Vec<Value> {
        let i = self.col(name);
        self.rows.iter().map(|r| r[i].clone()).collect()
    }

    /// The single value of a one-row, one-column result.
    pub fn scalar(&self) -> Value {
        assert_eq!(
            (self.rows.len(), self.columns.len()),
            (1, 1),
            "not a scalar: {self:?}"
        );
        self.rows[0][0].clone()
    }

    /// Each row as column name → value.
    pub fn maps(&self) -> Vec<BTreeMap<String, Value>> {
        self.rows
            .iter()
            .map(|r| {
                self.columns
                    .iter()
                    .cloned()
                    .zip(r.iter().cloned())
                    .collect()
            })
            .collect()
    }
}

/// The wrapper script: `$RECORDER_TRACE_PROCESSOR`, else
/// `trace_processor_shell` on `$PATH`; None when neither is set or found.
pub fn shell_path() -> Option<PathBuf> {
    std::env::var_os("RECORDER_TRACE_PROCESSOR")
        .map(PathBuf::from)
        .or_else(|| on_path("trace_processor_shell"))
}

/// What the queries run: the shell binary beside the wrapper once the
/// wrapper has run (it installs the runtime library; its own check of the
/// library, `ldconfig -p | grep -q` under `pipefail`, can fail when grep
/// exits first, and then tries apt-get again, which fails while another
/// test holds the package lock).
pub fn query_program() -> PathBuf {
    // Only asked for once `unavailable` said there is one.
    let wrapper = shell_path().unwrap_or_else(|| PathBuf::from("trace_processor_shell"));
    let shell = wrapper.with_file_name("trace_processor_shell");
    if wrapper.file_name().is_some_and(|n| n == "trace_processor") && shell.exists() {
        shell
    } else {
        wrapper
    }
}

/// Why trace processor cannot run here, if it cannot (checked once).
pub fn unavailable() -> Option<String> {
    static WHY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    WHY.get_or_init(|| {
        let Some(path) = shell_path() else {
            return Some(
                "no trace processor (set RECORDER_TRACE_PROCESSOR, or put trace_processor_shell on PATH)"
                    .into(),
            );
        };
        if !path.exists() {
            return Some(format!(
                "no trace processor at {} (set RECORDER_TRACE_PROCESSOR)",
                path.display()
            ));
        }
        let runs = |p: &Path| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        // Installed already: the binary runs by itself.
        if query_program() != path && runs(&query_program()) {
            return None;
        }
        match Command::new(&path).arg("--version").output() {
            Ok(o) if o.status.success() => None,
            Ok(o) => Some(format!(
                "{} --version failed ({}): {}",
                path.display(),
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => Some(format!("cannot run {}: {e}", path.display())),
        }
    })
    .clone()
}

/// A trace loaded (lazily, once per query) into trace processor.
#[derive(Debug, Clone)]
pub struct Tp {
    trace: PathBuf,
}

/// A handle on `trace` for queries, or None (with the reason printed) when
/// trace processor is unavailable; under `RECORDER_REQUIRE_PEERS=1` that
/// panics instead.
pub fn open(trace: &Path) -> Option<Tp> {
    match unavailable() {
        None => Some(Tp {
            trace: trace.to_path_buf(),
        }),
        Some(why) if peers_required() => panic!("RECORDER_REQUIRE_PEERS=1 but: {why}"),
        Some(why) => {
            eprintln!("trace processor check skipped: {why}");
            None
        }
    }
}

/// Writes `packets` (each one serialized TracePacket) as a trace file in
/// `dir` and opens it.
pub fn open_packets(dir: &Path, name: &str, packets: &[Vec<u8>]) -> Option<Tp> {
    let mut data = Vec::new();
    for p in packets {
        data.extend_from_slice(&recorder::trace::service::frame(p));
    }
    let path = dir.join(name);
    std::fs::write(&path, data).expect("write the trace");
    open(&path)
}

impl Tp {
    /// Runs one SQL statement. String values must not contain `"`: the
    /// shell prints them unescaped (use `hex(x)` for such columns); a row
    /// that does not split into the header's columns panics.
    pub fn query(&self, sql: &str) -> Rows {
        let dir = tempfile::tempdir().expect("tempdir");
        let q = dir.path().join("q.sql");
        std::fs::write(&q, sql).expect("write the query");
        let out = Command::new(query_program())
            .arg("-q")
            .arg(&q)
            .arg(&self.trace)
            .output()
            .expect("trace processor runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "trace processor failed on {} ({}):\n{sql}\n{}",
            self.trace.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        parse(&stdout).unwrap_or_else(|e| panic!("{e}\n{sql}\n{stdout}"))
    }

    /// Every `stats` row with a non-zero value and the given severity:
    /// (name, idx, value).
    pub fn stats(&self, severity: &str) -> Vec<(String, Option<i64>, i64)> {
        self.query(&format!(
            "select name, idx, value from stats where severity = '{severity}' and value != 0 \
             order by name, idx"
        ))
        .rows
        .iter()
        .map(|r| (r[0].text().to_string(), r[1].opt_int(), r[2].int()))
        .collect()
    }

    /// One stat's value (0 when absent), for the given index (None: a
    /// single-valued stat).
    pub fn stat(&self, name: &str, idx: Option<i64>) -> i64 {
        let cond = idx.map_or("idx is null".to_string(), |i| format!("idx = {i}"));
        let r = self.query(&format!(
            "select value from stats where name = '{name}' and {cond}"
        ));
        r.rows.first().map_or(0, |row| row[0].int())
    }

    /// Asserts the trace carries no `error`-severity stat (what the UI shows
    /// every user as a trace error), and returns its `data_loss` rows.
    pub fn assert_no_errors(&self) -> Vec<(String, Option<i64>, i64)> {
        let errors = self.stats("error");
        assert!(
            errors.is_empty(),
            "{}: trace processor reports errors: {errors:?}",
            self.trace.display()
        );
        self.stats("data_loss")
    }

    /// The triggers trace processor shows (instants on its "Trace Triggers"
    /// track), in time order: (name, timestamp, producer).
    pub fn triggers(&self) -> Vec<(String, i64, String)> {
        self.query(
            "select s.name, s.ts, extract_arg(s.arg_set_id, 'producer_name') as producer \
             from slice s join track t on s.track_id = t.id \
             where t.name = 'Trace Triggers' order by s.ts",
        )
        .rows
        .iter()
        .map(|r| (r[0].text().to_string(), r[1].int(), r[2].text().to_string()))
        .collect()
    }

    /// A `metadata` entry (int or string), if present.
    pub fn metadata(&self, name: &str) -> Option<Value> {
        let r = self.query(&format!(
            "select coalesce(int_value, str_value) as v from metadata where name = '{name}'"
        ));
        r.rows.first().map(|row| row[0].clone())
    }
}

/// Parses the shell's output of one statement: a header of quoted column
/// names, then rows of `[NULL]`, numbers and quoted strings (which may hold
/// commas and newlines; a quote ends a string only before `,`, a newline or
/// the end).
pub fn parse(out: &str) -> Result<Rows, String> {
    let mut records: Vec<Vec<String>> = Vec::new();
    let mut row: Vec<String> = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let chars: Vec<char> = out.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let next = chars.get(i + 1).copied();
        match c {
            '"' if !quoted && field.is_empty() => {
                quoted = true;
                field.push(c);
            }
            '"' if quoted && matches!(next, None | Some(',') | Some('\n')) => {
                quoted = false;
                field.push(c);
            }
            ',' if !quoted => row.push(std::mem::take(&mut field)),
            '\n' if !quoted => {
                row.push(std::mem::take(&mut field));
                if !(row.len() == 1 && row[0].is_empty()) {
                    records.push(std::mem::take(&mut row));
                }
                row.clear();
            }
            _ => field.push(c),
        }
    }
    if quoted {
        return Err("output ends inside a quoted string".into());
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        records.push(row);
    }
    let mut records = records.into_iter();
    let columns: Vec<String> = records
        .next()
        .ok_or("no header in trace processor's output")?
        .into_iter()
        .map(|c| c.trim_matches('"').to_string())
        .collect();
    let mut rows = Vec::new();
    for r in records {
        if r.len() != columns.len() {
            return Err(format!(
                "a row does not split into the {} columns {columns:?}: {r:?}",
                columns.len()
            ));
        }
        rows.push(r.into_iter().map(value).collect());
    }
    Ok(Rows { columns, rows })
}

pub fn value(f: String) -> Value {
    // NULL prints as `[NULL]`, quoted or not.
    if f == "[NULL]" || f == "\"[NULL]\"" {
        Value::Null
    } else if let Some(s) = f.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        Value::Text(s.to_string())
    } else if let Ok(i) = f.parse::<i64>() {
        Value::Int(i)
    } else if let Ok(r) = f.parse::<f64>() {
        Value::Real(r)
    } else {
        Value::Text(f)
    }
}

/// What trace processor must show of a trace, derived from the trace itself
/// by the independent decoder with trace processor's rules (v58.2):
/// `traced_buf_*` rows from the last `trace_stats`, `traced_buf_sequence_packet_loss`
/// from the loss markers of each sequence after its first packet, attributed
/// to buffers by the WriterStats, `ftrace_cpu_has_data_loss` for each CPU
/// with a bundle marked `lost_events`.
#[derive(Debug, Default)]
pub struct Expected {
    /// (stat, buffer) → value, for the BufferStats rows compared.
    pub buffer_stats: BTreeMap<(&'static str, i64), i64>,
    /// The `data_loss` rows: (name, idx, value).
    pub data_loss: Vec<(String, Option<i64>, i64)>,
    pub tracing_started_ns: Option<i64>,
    pub tracing_disabled_ns: Option<i64>,
    pub uuid: Option<String>,
    /// Sequence id → buffer index, from the WriterStats.
    pub writer_buffers: BTreeMap<u64, u32>,
}

impl Expected {
    /// Derives the expectation from a trace's bytes (a torn tail ignored).
    pub fn of(data: &[u8]) -> Expected {
        let packets = super::expand(data).0;
        let mut e = Expected::default();
        let mut seen_seq = std::collections::BTreeSet::new();
        let mut markers: BTreeMap<u64, i64> = BTreeMap::new();
        let mut lost_cpus = std::collections::BTreeSet::new();
        let mut stats = None;
        for p in &packets {
            if p.has_trace_config() && p.trace_config().write_into_file() {
                for (i, b) in p.trace_config().buffers.iter().enumerate() {
                    use perfetto_protos::trace_config::trace_config::buffer_config::FillPolicy;
                    if b.fill_policy() == FillPolicy::DISCARD {
                        e.data_loss.push((
                            "config_write_into_file_discard".into(),
                            Some(i as i64),
                            1,
                        ));
                    }
                }
            }
            if p.has_trusted_packet_sequence_id() {
                let seq = p.trusted_packet_sequence_id();
                let first = seen_seq.insert(seq);
                if !first && p.previous_packet_dropped() {
                    *markers.entry(u64::from(seq)).or_default() += 1;
                }
            }
            if p.has_service_event() {
                let ev = p.service_event();
                let ts = p.timestamp() as i64;
                if ev.tracing_started() {
                    e.tracing_started_ns = Some(ts);
                }
                if ev.tracing_disabled() {
                    e.tracing_disabled_ns = Some(ts);
                }
            }
            if p.has_trace_uuid() {
                let u = p.trace_uuid();
                let hex = format!("{:016x}{:016x}", u.msb() as u64, u.lsb() as u64);
                e.uuid = Some(format!(
                    "{}-{}-{}-{}-{}",
                    &hex[..8],
                    &hex[8..12],
                    &hex[12..16],
                    &hex[16..20],
                    &hex[20..]
                ));
            }
            if p.has_ftrace_events() && p.ftrace_events().lost_events() {
                lost_cpus.insert(i64::from(p.ftrace_events().cpu()));
            }
            if p.has_trace_stats() {
                stats = Some(p.trace_stats().clone());
            }
        }
        let mut per_buffer_loss: BTreeMap<i64, i64> = BTreeMap::new();
        if let Some(s) = &stats {
            for (i, b) in s.buffer_stats.iter().enumerate() {
                let i = i as i64;
                for (name, v) in [
                    ("traced_buf_buffer_size", b.buffer_size()),
                    ("traced_buf_bytes_written", b.bytes_written()),
                    ("traced_buf_bytes_overwritten", b.bytes_overwritten()),
                    ("traced_buf_bytes_read", b.bytes_read()),
                    (
                        "traced_buf_padding_bytes_written",
                        b.padding_bytes_written(),
                    ),
                    ("traced_buf_chunks_written", b.chunks_written()),
                    ("traced_buf_chunks_overwritten", b.chunks_overwritten()),
                    ("traced_buf_chunks_discarded", b.chunks_discarded()),
                    ("traced_buf_chunks_read", b.chunks_read()),
                    ("traced_buf_write_wrap_count", b.write_wrap_count()),
                ] {
                    e.buffer_stats.insert((name, i), v as i64);
                }
                if b.trace_writer_packet_loss() > 0 {
                    e.data_loss.push((
                        "traced_buf_trace_writer_packet_loss".into(),
                        Some(i),
                        b.trace_writer_packet_loss() as i64,
                    ));
                }
            }
            // A flush some data source never answered is a loss the trace
            // itself states (trace_stats.flushes_failed).
            if s.flushes_failed() > 0 {
                e.data_loss.push((
                    "traced_flushes_failed".into(),
                    None,
                    s.flushes_failed() as i64,
                ));
            }
            for w in &s.writer_stats {
                e.writer_buffers.insert(w.sequence_id(), w.buffer());
                let n = markers.get(&w.sequence_id()).copied().unwrap_or(0);
                *per_buffer_loss.entry(i64::from(w.buffer())).or_default() += n;
            }
        }
        for (b, n) in per_buffer_loss {
            if n > 0 {
                e.data_loss
                    .push(("traced_buf_sequence_packet_loss".into(), Some(b), n));
            }
        }
        for cpu in lost_cpus {
            e.data_loss
                .push(("ftrace_cpu_has_data_loss".into(), Some(cpu), 1));
        }
        e.data_loss.sort();
        e
    }
}

/// Loads `trace` in trace processor (if available) and checks it shows what
/// the trace holds: no error stat, the buffer stats of the last
/// `trace_stats`, exactly the expected `data_loss` rows, the session's start,
/// end and UUID. Returns the handle for further queries.
pub fn check(trace: &Path) -> Option<Tp> {
    let tp = open(trace)?;
    let data = std::fs::read(trace).expect("read the trace");
    let want = Expected::of(&data);
    let loss = tp.assert_no_errors();
    assert_eq!(
        loss,
        want.data_loss,
        "{}: trace processor's data_loss rows",
        trace.display()
    );
    let got: BTreeMap<(String, i64), i64> = tp
        .query(
            "select name, idx, value from stats where name like 'traced_buf_%' and idx is not null",
        )
        .rows
        .iter()
        .map(|r| ((r[0].text().to_string(), r[1].int()), r[2].int()))
        .collect();
    for ((name, idx), v) in &want.buffer_stats {
        assert_eq!(
            got.get(&(name.to_string(), *idx)).copied().unwrap_or(0),
            *v,
            "{}: {name}[{idx}]",
            trace.display()
        );
    }
    let meta = |k: &str| tp.metadata(k).and_then(|v| v.opt_int());
    assert_eq!(
        meta("tracing_started_ns"),
        want.tracing_started_ns,
        "tracing_started"
    );
    if want.tracing_disabled_ns.is_some() {
        assert_eq!(meta("tracing_disabled_ns"), want.tracing_disabled_ns);
    }
    assert_eq!(
        tp.metadata("trace_uuid")
            .and_then(|v| v.opt_text().map(String::from)),
        want.uuid
    );
    Some(tp)
}

/// Decodes the `hex()` of a string column (strings with quotes are not
/// safe in the shell's output).
pub fn unhex(s: &str) -> String {
    let bytes: Vec<u8> = (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Trace processor's process table shows every process and thread of the
/// trace's `process_tree` packets (pid, parent pid, command line; thread
/// tgid and name), and its per-process memory counters every value of the
/// `process_stats` packets (kB as bytes), at their timestamps.
pub fn assert_process_view(tp: &Tp, packets: &[perfetto_protos::trace_packet::TracePacket]) {
    // A pid reused while the trace ran (a busy machine forks fast) has a row
    // per process in trace processor: ours must be one of them.
    let mut procs: BTreeMap<i64, Vec<(String, Option<i64>)>> = BTreeMap::new();
    for r in &tp
        .query(
            "select p.pid, hex(p.cmdline) as c, pp.pid as ppid from process p \
             left join process pp on p.parent_upid = pp.upid where p.pid is not null",
        )
        .rows
    {
        procs
            .entry(r[0].int())
            .or_default()
            .push((unhex(r[1].opt_text().unwrap_or("")), r[2].opt_int()));
    }
    let mut threads: BTreeMap<i64, Vec<(Option<i64>, String)>> = BTreeMap::new();
    for r in &tp
        .query(
            "select t.tid, p.pid, hex(t.name) as n from thread t left join process p using (upid)",
        )
        .rows
    {
        threads
            .entry(r[0].int())
            .or_default()
            .push((r[1].opt_int(), unhex(r[2].opt_text().unwrap_or(""))));
    }
    // Trace processor drops a kworker's "-workqueue" or "+workqueue"
    // suffix (it changes with the work item).
    let cmdline_of = |pr: &perfetto_protos::process_tree::process_tree::Process| {
        let c = pr.cmdline.join(" ");
        match c.split_once(['-', '+']) {
            Some((head, _)) if c.starts_with("kworker/") => head.to_string(),
            _ => c,
        }
    };
    // A process that exec'd, or was re-parented, between two scans is one
    // process to trace processor, which keeps the later command line or
    // parent: each pid's row must match one of what the scans saw of it.
    // An orphan adopted by init before its first scan shows parent 1 there,
    // where trace processor keeps the parent that forked it (from the fork
    // event the trace also holds).
    let mut scanned: BTreeMap<i64, Vec<(String, Option<i64>)>> = BTreeMap::new();
    for p in packets {
        for pr in &p.process_tree().processes {
            // The kernel's own pid 0 is not a process trace processor keeps.
            let parent = (pr.ppid() > 0).then(|| i64::from(pr.ppid()));
            scanned
                .entry(i64::from(pr.pid()))
                .or_default()
                .push((cmdline_of(pr), parent));
        }
    }
    let seen: usize = scanned.values().map(Vec::len).sum();
    for (pid, ours) in &scanned {
        let rows = procs
            .get(pid)
            .unwrap_or_else(|| panic!("pid {pid} missing from trace processor"));
        assert!(
            rows.iter()
                .any(|(cmdline, ppid)| ours.iter().any(|(c, parent)| c == cmdline
                    && (parent.is_none() || ppid == parent || *parent == Some(1)))),
            "pid {pid}: ours {ours:?}, trace processor's {rows:?}"
        );
    }
    let mut want_counters = BTreeMap::new();
    for p in packets {
        for th in &p.process_tree().threads {
            let rows = threads
                .get(&i64::from(th.tid()))
                .unwrap_or_else(|| panic!("tid {} missing from trace processor", th.tid()));
            assert!(
                rows.iter()
                    .any(|(tgid, name)| *tgid == Some(i64::from(th.tgid()))
                        && (!th.has_name() || name == th.name())),
                "tid {}: ours tgid {} name {:?}, trace processor's {rows:?}",
                th.tid(),
                th.tgid(),
                th.name()
            );
        }
        let ts = p.timestamp() as i64;
        for pr in &p.process_stats().processes {
            let pid = i64::from(pr.pid());
            for (name, has, kb) in [
                ("mem.virt", pr.has_vm_size_kb(), pr.vm_size_kb()),
                ("mem.rss", pr.has_vm_rss_kb(), pr.vm_rss_kb()),
                ("mem.rss.anon", pr.has_rss_anon_kb(), pr.rss_anon_kb()),
                ("mem.rss.file", pr.has_rss_file_kb(), pr.rss_file_kb()),
                ("mem.rss.shmem", pr.has_rss_shmem_kb(), pr.rss_shmem_kb()),
                ("mem.swap", pr.has_vm_swap_kb(), pr.vm_swap_kb()),
                ("mem.locked", pr.has_vm_locked_kb(), pr.vm_locked_kb()),
                ("mem.rss.watermark", pr.has_vm_hwm_kb(), pr.vm_hwm_kb()),
            ] {
                if has {
                    want_counters.insert((name.to_string(), pid, ts), (kb * 1024) as i64);
                }
            }
            if pr.has_oom_score_adj() {
                want_counters.insert(("oom_score_adj".into(), pid, ts), pr.oom_score_adj());
            }
        }
    }
    assert!(seen > 0 || !want_counters.is_empty(), "nothing to compare");
    if want_counters.is_empty() {
        return;
    }
    let got: BTreeMap<(String, i64, i64), i64> = tp
        .query(
            "select pct.name, p.pid, c.ts, c.value from counter c \
             join process_counter_track pct on c.track_id = pct.id join process p using (upid)",
        )
        .rows
        .iter()
        .map(|r| {
            (
                (r[0].text().to_string(), r[1].int(), r[2].int()),
                r[3].int(),
            )
        })
        .collect();
    for (k, v) in &want_counters {
        assert_eq!(got.get(k), Some(v), "process counter {k:?}");
    }
}

/// Trace processor's system counter tracks hold every value of the trace's
/// `sys_stats` packets at their timestamps: meminfo (kB as bytes), vmstat,
/// per-CPU times and the fork count. Returns how many values were compared.
pub fn assert_sys_stats_view(
    tp: &Tp,
    packets: &[perfetto_protos::trace_packet::TracePacket],
) -> usize {
    use protobuf::Enum;
    let mut want: BTreeMap<(String, Option<i64>, i64), i64> = BTreeMap::new();
    for p in packets.iter().filter(|p| p.has_sys_stats()) {
        let s = p.sys_stats();
        let ts = p.timestamp() as i64;
        for m in &s.meminfo {
            let id = m.key().value() as u32;
            let (name, _) = recorder::sources::sys_stats::MEMINFO_KEYS
                .iter()
                .find(|(_, n)| *n == id)
                .expect("known meminfo key");
            want.insert((name.to_string(), None, ts), (m.value() * 1024) as i64);
        }
        for v in &s.vmstat {
            let id = v.key().value() as u32;
            let (name, _) = recorder::sources::sys_stats::VMSTAT_KEYS
                .iter()
                .find(|(_, n)| *n == id)
                .expect("known vmstat key");
            want.insert((name.to_string(), None, ts), v.value() as i64);
        }
        for c in &s.cpu_stat {
            let cpu = Some(i64::from(c.cpu_id()));
            for (name, v) in [
                ("cpu.times.user_ns", c.user_ns()),
                ("cpu.times.user_nice_ns", c.user_nice_ns()),
                ("cpu.times.system_mode_ns", c.system_mode_ns()),
                ("cpu.times.idle_ns", c.idle_ns()),
                ("cpu.times.io_wait_ns", c.io_wait_ns()),
                ("cpu.times.irq_ns", c.irq_ns()),
                ("cpu.times.softirq_ns", c.softirq_ns()),
            ] {
                want.insert((name.to_string(), cpu, ts), v as i64);
            }
        }
        if s.has_num_forks() {
            want.insert(("num_forks".into(), None, ts), s.num_forks() as i64);
        }
    }
    let got: BTreeMap<(String, Option<i64>, i64), i64> = tp
        .query(
            "select ct.name, extract_arg(ct.dimension_arg_set_id, 'cpu') as cpu, c.ts, c.value \
             from counter c join counter_track ct on c.track_id = ct.id \
             where ct.type in ('meminfo', 'vmstat', 'cpustat', 'num_forks')",
        )
        .rows
        .iter()
        .map(|r| {
            (
                (r[0].text().to_string(), r[1].opt_int(), r[2].int()),
                r[3].int(),
            )
        })
        .collect();
    for (k, v) in &want {
        assert_eq!(got.get(k), Some(v), "system counter {k:?}");
    }
    want.len()
}
