//! What a test needs of the machine, and the one way a test says so:
//! `require!(need)` skips the test with the reason, or fails it where CI
//! asks for everything (`RECORDER_REQUIRE_KERNEL=1` for root, tracefs and
//! io_uring; `RECORDER_REQUIRE_PEERS=1` for Perfetto's tools and configs).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Skips the test (returns from it, with the default value of its return
/// type) when a need is missing; `require!(a, b)` checks in order and skips
/// for the first missing one. A need is an `Option<Missing>` (None: met),
/// an `Option<String>` (a kernel need and its reason), or a
/// `Result<T, Missing>`, whose `T` the macro evaluates to.
macro_rules! require {
    ($need:expr) => {
        match $crate::harness::need::Need::met($need) {
            Ok(found) => found,
            Err(missing) => {
                $crate::harness::need::skip(missing);
                return Default::default();
            }
        }
    };
    ($($need:expr),+ $(,)?) => {
        $(require!($need);)+
    };
}

/// Who may do without a missing need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Root, tracefs, io_uring, mounts: required by `RECORDER_REQUIRE_KERNEL=1`.
    Kernel,
    /// Trace processor, tracebox, Perfetto's test configs, a built package:
    /// required by `RECORDER_REQUIRE_PEERS=1`.
    Peer,
}

/// A need this machine does not meet, and why.
#[derive(Debug, Clone)]
pub struct Missing {
    pub kind: Kind,
    pub why: String,
}

impl Missing {
    pub fn kernel(why: impl Into<String>) -> Missing {
        Missing {
            kind: Kind::Kernel,
            why: why.into(),
        }
    }

    pub fn peer(why: impl Into<String>) -> Missing {
        Missing {
            kind: Kind::Peer,
            why: why.into(),
        }
    }
}

/// What `require!` accepts.
pub trait Need {
    type Found;
    fn met(self) -> Result<Self::Found, Missing>;
}

impl Need for Option<Missing> {
    type Found = ();
    fn met(self) -> Result<(), Missing> {
        self.map_or(Ok(()), Err)
    }
}

/// A bare reason is a kernel need, as the machine's own checks give them.
impl Need for Option<String> {
    type Found = ();
    fn met(self) -> Result<(), Missing> {
        self.map_or(Ok(()), |why| Err(Missing::kernel(why)))
    }
}

impl<T> Need for Result<T, Missing> {
    type Found = T;
    fn met(self) -> Result<T, Missing> {
        self
    }
}

/// Whether kernel features are required (CI): a test that would skip fails.
pub fn kernel_required() -> bool {
    std::env::var_os("RECORDER_REQUIRE_KERNEL").is_some_and(|v| v == "1")
}

/// Whether the peers are required (CI): Perfetto's own test configs, its
/// trace processor and tracebox, which the repository does not carry.
pub fn peers_required() -> bool {
    std::env::var_os("RECORDER_REQUIRE_PEERS").is_some_and(|v| v == "1")
}

/// Says why a test (or a part of one) skips; panics with the reason instead
/// when the need is required.
pub fn skip(missing: Missing) {
    let Missing { kind, why } = missing;
    match kind {
        Kind::Kernel if kernel_required() => panic!("RECORDER_REQUIRE_KERNEL=1 but: {why}"),
        Kind::Peer if peers_required() => panic!("RECORDER_REQUIRE_PEERS=1 but: {why}"),
        _ => eprintln!("skipped: {why}"),
    }
}

/// A kernel need met when `present`.
pub fn present(present: bool, why: &str) -> Option<Missing> {
    (!present).then(|| Missing::kernel(why))
}

/// Whether this process is root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

pub fn root() -> Option<Missing> {
    present(is_root(), "needs root")
}

/// `program ARGS` runs and succeeds.
pub fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn setpriv() -> Option<Missing> {
    present(runs("setpriv", &["--version"]), "setpriv missing")
}

pub fn prlimit() -> Option<Missing> {
    present(runs("prlimit", &["--version"]), "prlimit missing")
}

/// An unprivileged local user to attack a root session with: root, and
/// `setpriv` to become uid 65534.
pub fn attacker() -> Option<Missing> {
    root().or_else(setpriv)
}

pub const TRACEFS: &str = "/sys/kernel/tracing";

/// Root and a tracefs with instances at /sys/kernel/tracing.
pub fn tracefs_instances() -> Option<Missing> {
    root().or_else(|| {
        present(
            Path::new(TRACEFS).join("instances").is_dir(),
            &format!("no tracefs instances at {TRACEFS}"),
        )
    })
}

/// Root and a tracefs the recorder finds, with instances: what a real
/// kernel recording needs.
pub fn kernel_tracing() -> Option<Missing> {
    use recorder::sources::ftrace::tracefs::Tracefs;
    root().or_else(|| match Tracefs::discover() {
        Err(e) => Some(Missing::kernel(format!("no tracefs: {e}"))),
        Ok(t) => present(t.path("instances").is_dir(), "tracefs has no instances"),
    })
}

/// io_uring, where the kernel allows it.
pub fn io_uring() -> Option<Missing> {
    recorder::storage::io_uring_available()
        .err()
        .map(|why| Missing::kernel(format!("io_uring unavailable: {why}")))
}

/// `program` as the shell would find it on `$PATH`, if it is there.
pub fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Perfetto's all-in-one binary: `RECORDER_TRACEBOX`, else `tracebox` on
/// `$PATH`.
pub fn tracebox_path() -> Option<PathBuf> {
    match std::env::var_os("RECORDER_TRACEBOX") {
        Some(p) => Some(PathBuf::from(p)).filter(|p| p.exists()),
        None => on_path("tracebox"),
    }
}

/// Perfetto's own client and services (tracebox), for the serve tests.
pub fn tracebox() -> Option<Missing> {
    tracebox_path()
        .is_none()
        .then(|| Missing::peer("no tracebox (set RECORDER_TRACEBOX, or put tracebox on PATH)"))
}

/// Perfetto's trace processor.
pub fn trace_processor() -> Option<Missing> {
    super::trace_processor::unavailable().map(Missing::peer)
}

/// Perfetto's own test configs (its `test/configs`, 25 files), which the
/// repository cannot carry: `$RECORDER_PERFETTO_TEST_CONFIGS` names them.
pub fn perfetto_test_configs() -> Result<PathBuf, Missing> {
    let Some(p) = std::env::var_os("RECORDER_PERFETTO_TEST_CONFIGS").map(PathBuf::from) else {
        return Err(Missing::peer(
            "RECORDER_PERFETTO_TEST_CONFIGS is not set (Perfetto's test/configs directory)",
        ));
    };
    if !p.is_dir() {
        return Err(Missing::peer(format!(
            "Perfetto's test configs are not at {} (RECORDER_PERFETTO_TEST_CONFIGS)",
            p.display()
        )));
    }
    Ok(p)
}

/// Whether `need` is met; when it is not, says why (a failure where it is
/// required), for a test that goes on without it.
pub fn met(need: Option<Missing>) -> bool {
    need.map(skip).is_none()
}

/// What `need` found, or None once it said why not (a failure where it is
/// required), for a test that goes on without it.
pub fn found<T>(need: Result<T, Missing>) -> Option<T> {
    need.map_err(skip).ok()
}

/// A new directory `mnt` with a tmpfs of `size` (mount's `size=`) mounted
/// on it: the small disk the full-disk tests fill. Unmounting is the
/// test's.
pub fn small_tmpfs(mnt: &Path, size: &str) -> Option<Missing> {
    std::fs::create_dir(mnt).expect("mkdir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(mnt)
        .status()
        .is_ok_and(|s| s.success());
    present(mounted, "cannot mount a tmpfs")
}
