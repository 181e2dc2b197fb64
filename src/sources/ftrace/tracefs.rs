//! tracefs: finding it, our own instance, and every setting we change
//! remembered so it can be put back (at stop, after an error, and — for
//! instances left by a crashed run — at the next start).
//!
//! `set_ftrace_pid`, `set_ftrace_filter` and `set_ftrace_notrace` are never
//! opened: sandboxes refuse even that.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Roots tried in order.
pub(crate) const TRACEFS_ROOTS: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];
/// Prefix of the instances this program creates (`recorder-<pid>`, then
/// `recorder-<pid>-<n>` for further sources of the same process).
pub(crate) const INSTANCE_PREFIX: &str = "recorder-";

static NEXT_INSTANCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Errors of finding and using tracefs.
#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    /// tracefs is mounted at none of the places tried, nor could it be mounted.
    #[error(
        "tracefs not found at {tried}; mount it (mount -t tracefs nodev /sys/kernel/tracing) or run as root"
    )]
    NotFound {
        /// The places tried, comma-separated.
        tried: String,
    },
    /// A tracefs file or directory could not be read, written or created.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system call returned.
        source: io::Error,
    },
    /// The configured instance name is not a plain name, or names the
    /// kernel's own `hyp`/`hypervisor` instance.
    #[error("instance name {0:?} is reserved or not a plain name")]
    BadInstanceName(String),
}

// The name grammar is the config's: it refuses bad names at load.
pub use crate::config::event_name::{event_spec_problem, is_plain_name};

fn io_err(path: &Path, source: io::Error) -> TracefsError {
    TracefsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A tracefs directory: the top level or an instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracefs {
    root: PathBuf,
}

fn looks_like_tracefs(p: &Path) -> bool {
    p.join("events/header_page").is_file()
}

impl Tracefs {
    /// Uses `root` as is (fixture trees in tests, or a known mount).
    pub fn at(root: impl Into<PathBuf>) -> Result<Self, TracefsError> {
        let root = root.into();
        if looks_like_tracefs(&root) {
            Ok(Self { root })
        } else {
            Err(TracefsError::NotFound {
                tried: root.display().to_string(),
            })
        }
    }

    /// Finds tracefs at the usual places, mounting it when we are root and
    /// it is absent.
    pub fn discover() -> Result<Self, TracefsError> {
        for r in TRACEFS_ROOTS {
            if let Ok(t) = Self::at(*r) {
                return Ok(t);
            }
        }
        if rustix::process::geteuid().is_root() {
            let target = Path::new(TRACEFS_ROOTS[0]);
            let mounted = rustix::mount::mount(
                "nodev",
                target,
                "tracefs",
                rustix::mount::MountFlags::empty(),
                None::<&std::ffi::CStr>,
            );
            if mounted.is_ok()
                && let Ok(t) = Self::at(target)
            {
                log::info!("mounted tracefs at {}", target.display());
                return Ok(t);
            }
        }
        Err(TracefsError::NotFound {
            tried: TRACEFS_ROOTS.join(", "),
        })
    }

    /// The directory: the tracefs mount, or an instance under `instances/`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of `rel` (`events/header_page`, `per_cpu/cpu0/stats`) in it.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Reads a whole tracefs file. Large reads only: some tracefs files
    /// (`events/header_page`) answer a small first read, as the standard
    /// library's probe read is, with a cut line and then continue wrongly.
    pub fn read(&self, rel: &str) -> Result<String, TracefsError> {
        let p = self.path(rel);
        let mut f = fs::File::open(&p).map_err(|e| io_err(&p, e))?;
        let mut out = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match f.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(&p, e)),
            }
        }
        String::from_utf8(out)
            .map_err(|e| io_err(&p, io::Error::new(io::ErrorKind::InvalidData, e)))
    }

    /// Writes `value` to the file `rel` in one write, as tracefs expects.
    pub fn write(&self, rel: &str, value: &str) -> Result<(), TracefsError> {
        let p = self.path(rel);
        fs::write(&p, value).map_err(|e| io_err(&p, e))
    }

    /// The instance `name` (which may not exist yet).
    pub fn instance(&self, name: &str) -> Tracefs {
        Tracefs {
            root: self.root.join("instances").join(name),
        }
    }

    /// CPUs with a `per_cpu/cpuN` directory, ascending.
    pub fn cpus(&self) -> Vec<u32> {
        let mut v: Vec<u32> = fs::read_dir(self.path("per_cpu"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("cpu")?.parse().ok())
            .collect();
        v.sort_unstable();
        v
    }

    /// Event groups (directories under `events/`).
    pub fn groups(&self) -> Vec<String> {
        list_dirs(&self.path("events"))
    }

    /// Events of `group` that have a format file.
    pub fn events_of(&self, group: &str) -> Vec<String> {
        list_dirs(&self.path(&format!("events/{group}")))
            .into_iter()
            .filter(|n| self.path(&format!("events/{group}/{n}/format")).is_file())
            .collect()
    }

    /// Removes what a recorder process `pid` made here and may have left
    /// when it died during its set-up: its instances (`recorder-<pid>`,
    /// `recorder-<pid>-<n>`, tracing off first) and its kprobes (group
    /// `recorder_<pid>`). Returns what was removed.
    pub(crate) fn remove_leftovers_of(&self, pid: u32) -> Vec<String> {
        let mut removed = Vec::new();
        let own = format!("{INSTANCE_PREFIX}{pid}");
        for name in list_dirs(&self.path("instances")) {
            let ours = name == own
                || name
                    .strip_prefix(&own)
                    .and_then(|r| r.strip_prefix('-'))
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            if !ours {
                continue;
            }
            let inst = self.instance(&name);
            if inst.path("tracing_on").exists() {
                let _ = inst.write("tracing_on", "0");
            }
            match fs::remove_dir(inst.root()) {
                Ok(()) => removed.push(name),
                Err(e) => log::warn!("tracefs instance {name} not removed: {e}"),
            }
        }
        let group = format!("recorder_{pid}");
        let kprobes = self.path("kprobe_events");
        for event in list_dirs(&self.path(&format!("events/{group}"))) {
            let line = format!("-:{group}/{event}\n");
            let res = fs::OpenOptions::new()
                .append(true)
                .open(&kprobes)
                .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
            match res {
                Ok(()) => removed.push(format!("{group}/{event}")),
                Err(e) => log::warn!("kprobe {group}/{event} not removed: {e}"),
            }
        }
        removed
    }

    /// Removes `recorder-<pid>` instances whose process is gone (`proc` is
    /// the procfs root). Returns the names removed.
    pub fn remove_stale_instances(&self, proc: &Path) -> Vec<String> {
        let mut removed = Vec::new();
        for name in list_dirs(&self.path("instances")) {
            // `recorder-<pid>` or `recorder-<pid>-<n>`.
            let Some(pid) = name
                .strip_prefix(INSTANCE_PREFIX)
                .and_then(|p| p.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if proc.join(pid.to_string()).exists() {
                continue;
            }
            let inst = self.instance(&name);
            if inst.path("tracing_on").exists() {
                let _ = inst.write("tracing_on", "0");
            }
            match fs::remove_dir(inst.root()) {
                Ok(()) => {
                    log::info!("removed stale tracefs instance {name}");
                    removed.push(name);
                }
                Err(e) => log::warn!("stale tracefs instance {name} not removed: {e}"),
            }
        }
        removed
    }
}

fn list_dirs(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    v.sort();
    v
}

/// The value of a tracefs setting as it is to be written back:
/// `[boot] local global` → `boot`; `7 (expanded: 1408)` → `7`.
pub(crate) fn restorable_value(rel: &str, text: &str) -> String {
    let t = text.trim();
    if rel.ends_with("trace_clock")
        && let (Some(a), Some(b)) = (t.find('['), t.find(']'))
    {
        return t[a + 1..b].to_string();
    }
    if rel.ends_with("buffer_size_kb") {
        return t.split_whitespace().next().unwrap_or("").to_string();
    }
    t.to_string()
}

/// How one change is undone.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Undo {
    /// Write `value` back to `rel` of the recording directory (`top`: of the
    /// tracefs top level).
    Write {
        top: bool,
        rel: String,
        value: String,
    },
    /// Append `line` to `rel` of the top level (`-:group/name` removes a
    /// kprobe made by appending its definition), or of the recording
    /// directory (`!traceoff` removes an event trigger).
    Append {
        top: bool,
        rel: String,
        line: String,
    },
}

/// The tracefs directory a recording uses, with everything it changed.
/// Dropping it restores the changes (and removes an instance it created).
pub(crate) struct TracefsSession {
    top: Tracefs,
    dir: Tracefs,
    created_instance: bool,
    /// How to undo each change, in the order made.
    saved: Vec<Undo>,
    restored: bool,
}

impl TracefsSession {
    /// Opens the directory to record in: `instance_name` if given (created
    /// if absent), else our own `recorder-<pid>`. Stale instances of dead
    /// runs are removed first.
    pub(crate) fn open(
        top: &Tracefs,
        instance_name: Option<&str>,
        proc: &Path,
    ) -> Result<Self, TracefsError> {
        top.remove_stale_instances(proc);
        let name = match instance_name {
            Some(n) => {
                if !is_plain_name(n) || n == "hyp" || n == "hypervisor" {
                    return Err(TracefsError::BadInstanceName(n.to_string()));
                }
                n.to_string()
            }
            None => {
                // Unique per source, so two recordings in one process do not share.
                let n = NEXT_INSTANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n == 0 {
                    format!("{INSTANCE_PREFIX}{}", std::process::id())
                } else {
                    format!("{INSTANCE_PREFIX}{}-{n}", std::process::id())
                }
            }
        };
        let dir = top.instance(&name);
        let mut created = false;
        if !dir.root().is_dir() {
            fs::create_dir(dir.root()).map_err(|e| io_err(dir.root(), e))?;
            created = true;
        }
        Ok(Self {
            top: top.clone(),
            dir,
            created_instance: created,
            saved: Vec::new(),
            restored: false,
        })
    }

    /// Records in `top` itself (no instance).
    #[cfg(test)]
    pub(crate) fn top_level(top: &Tracefs) -> Self {
        Self {
            top: top.clone(),
            dir: top.clone(),
            created_instance: false,
            saved: Vec::new(),
            restored: false,
        }
    }

    /// The directory being recorded in.
    pub(crate) fn dir(&self) -> &Tracefs {
        &self.dir
    }

    /// The tracefs top level.
    pub(crate) fn top(&self) -> &Tracefs {
        &self.top
    }

    /// Writes `value` to `rel`, remembering the old value the first time.
    pub(crate) fn set(&mut self, rel: &str, value: &str) -> Result<(), TracefsError> {
        self.set_in(false, rel, value)
    }

    /// [`TracefsSession::set`] on a file of the tracefs top level (global
    /// settings such as `max_graph_depth`).
    pub(crate) fn set_top(&mut self, rel: &str, value: &str) -> Result<(), TracefsError> {
        self.set_in(true, rel, value)
    }

    fn set_in(&mut self, top: bool, rel: &str, value: &str) -> Result<(), TracefsError> {
        let dir = if top { &self.top } else { &self.dir };
        let known = self
            .saved
            .iter()
            .any(|u| matches!(u, Undo::Write { top: t, rel: r, .. } if *t == top && r == rel));
        if !known {
            let old = dir.read(rel)?;
            self.saved.push(Undo::Write {
                top,
                rel: rel.to_string(),
                value: restorable_value(rel, &old),
            });
        }
        dir.write(rel, value)
    }

    /// Appends `line` to `rel` of the top level (`kprobe_events`); `undo` is
    /// appended at restore.
    pub(crate) fn append_top(
        &mut self,
        rel: &str,
        line: &str,
        undo: &str,
    ) -> Result<(), TracefsError> {
        self.append_in(true, rel, line, undo)
    }

    /// Appends `line` to `rel` of the recording directory (an event's
    /// `trigger`); `undo` is appended at restore.
    pub(crate) fn append(&mut self, rel: &str, line: &str, undo: &str) -> Result<(), TracefsError> {
        self.append_in(false, rel, line, undo)
    }

    fn append_in(
        &mut self,
        top: bool,
        rel: &str,
        line: &str,
        undo: &str,
    ) -> Result<(), TracefsError> {
        let p = if top {
            self.top.path(rel)
        } else {
            self.dir.path(rel)
        };
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .map_err(|e| io_err(&p, e))?;
        std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())
            .map_err(|e| io_err(&p, e))?;
        self.saved.push(Undo::Append {
            top,
            rel: rel.to_string(),
            line: undo.to_string(),
        });
        Ok(())
    }

    /// Puts back every setting, newest first; removes an instance we
    /// created. Idempotent; errors are logged, the rest still restored.
    pub(crate) fn restore(&mut self) {
        if self.restored {
            return;
        }
        self.restored = true;
        self.teardown().run();
    }

    /// Hands the undoing over to someone else (the privileged broker, after
    /// this process gave up root): returns what [`restore`](Self::restore)
    /// would do, and this session will no longer do it.
    pub(crate) fn hand_over(&mut self) -> Option<TracefsTeardown> {
        if self.restored {
            return None;
        }
        self.restored = true;
        Some(self.teardown())
    }

    /// The restore as a list of steps, in order.
    fn teardown(&self) -> TracefsTeardown {
        let mut steps = Vec::new();
        let write = |dir: &Tracefs, rel: &str, value: &str| TeardownStep {
            path: dir.path(rel),
            value: value.to_string(),
            append: false,
        };
        // Stop tracing first so nothing more is written while restoring.
        let sets_tracing = self
            .saved
            .iter()
            .any(|u| matches!(u, Undo::Write { top: false, rel, .. } if rel == "tracing_on"));
        if sets_tracing {
            steps.push(write(&self.dir, "tracing_on", "0"));
        }
        for undo in self.saved.iter().rev() {
            match undo {
                Undo::Write { top, rel, value } => {
                    // tracing_on goes back last, after everything else.
                    if !*top && rel == "tracing_on" {
                        continue;
                    }
                    steps.push(write(if *top { &self.top } else { &self.dir }, rel, value));
                }
                Undo::Append { top, rel, line } => steps.push(TeardownStep {
                    path: if *top { &self.top } else { &self.dir }.path(rel),
                    value: line.clone(),
                    append: true,
                }),
            }
        }
        for undo in &self.saved {
            if let Undo::Write {
                top: false,
                rel,
                value,
            } = undo
                && rel == "tracing_on"
            {
                steps.push(write(&self.dir, rel, value));
            }
        }
        TracefsTeardown {
            steps,
            remove_dir: self.created_instance.then(|| self.dir.root().to_path_buf()),
        }
    }
}

/// One write of a restore.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TeardownStep {
    /// The tracefs file to write.
    pub path: PathBuf,
    /// What to write: the value the recording found there, or the line that
    /// undoes one it appended (`-:group/name`).
    pub value: String,
    /// Appended as a line (`kprobe_events`) rather than written.
    pub append: bool,
}

/// What undoes a recording's tracefs changes: writes in order, then the
/// instance directory to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TracefsTeardown {
    /// The writes, in order.
    pub steps: Vec<TeardownStep>,
    /// The instance directory to remove after them, when the recording
    /// created it.
    pub remove_dir: Option<PathBuf>,
}

impl TracefsTeardown {
    /// Performs it; errors are logged, the rest still done.
    pub fn run(&self) {
        for step in &self.steps {
            let res = if step.append {
                fs::OpenOptions::new()
                    .append(true)
                    .open(&step.path)
                    .and_then(|mut f| {
                        std::io::Write::write_all(&mut f, format!("{}\n", step.value).as_bytes())
                    })
            } else {
                fs::write(&step.path, &step.value)
            };
            if let Err(e) = res {
                log::warn!("restoring tracefs {}: {e}", step.path.display());
            }
        }
        if let Some(d) = &self.remove_dir
            && let Err(e) = fs::remove_dir(d)
        {
            log::warn!("removing tracefs instance {}: {e}", d.display());
        }
    }
}

impl Drop for TracefsSession {
    fn drop(&mut self) {
        self.restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restorable_values() {
        assert_eq!(
            restorable_value("trace_clock", "[local] global boot\n"),
            "local"
        );
        assert_eq!(
            restorable_value("buffer_size_kb", "7 (expanded: 1408)\n"),
            "7"
        );
        assert_eq!(
            restorable_value("events/sched/sched_switch/enable", "0\n"),
            "0"
        );
    }

    #[test]
    fn session_restores_a_plain_directory() {
        let d = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(d.path().join("events")).expect("mkdir");
        fs::write(d.path().join("events/header_page"), "").expect("write");
        fs::write(d.path().join("trace_clock"), "[local] boot\n").expect("write");
        fs::write(d.path().join("tracing_on"), "1\n").expect("write");
        let t = Tracefs::at(d.path()).expect("tracefs");
        {
            let mut s = TracefsSession::top_level(&t);
            s.set("trace_clock", "boot").expect("set");
            s.set("tracing_on", "0").expect("set");
            s.set("trace_clock", "mono").expect("set again");
            assert_eq!(t.read("trace_clock").expect("read"), "mono");
        }
        assert_eq!(t.read("trace_clock").expect("read"), "local");
        assert_eq!(t.read("tracing_on").expect("read"), "1");
    }

    #[test]
    fn stale_instances_of_dead_pids_are_removed() {
        let d = tempfile::tempdir().expect("tempdir");
        let proc = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(d.path().join("events")).expect("mkdir");
        fs::write(d.path().join("events/header_page"), "").expect("write");
        for n in [
            "recorder-1",
            "recorder-1-3",
            "recorder-2",
            "recorder-2-1",
            "other",
        ] {
            fs::create_dir_all(d.path().join("instances").join(n)).expect("mkdir");
        }
        fs::create_dir(proc.path().join("2")).expect("mkdir");
        let t = Tracefs::at(d.path()).expect("tracefs");
        assert_eq!(
            t.remove_stale_instances(proc.path()),
            ["recorder-1", "recorder-1-3"]
        );
        assert!(d.path().join("instances/recorder-2-1").is_dir());
        assert!(d.path().join("instances/recorder-2").is_dir());
        assert!(d.path().join("instances/other").is_dir());
    }
}
