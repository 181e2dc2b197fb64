//! The scheduler slice of the thread that serves producers.
//!
//! An SDK app drops packets while its shared memory is full, and a chunk is
//! freed only when the thread that serves it wakes up on the app's
//! CommitData and moves it out. On a loaded machine that wake-up waits for
//! the running task's slice to end. Since Linux 6.12 a SCHED_OTHER thread
//! may ask for a shorter slice (`sched_setattr` with `sched_runtime`): it
//! is picked sooner when it wakes and runs for less at a time, with the
//! same weight and so the same share of the CPU. Its nice value is kept;
//! no privilege is needed. Threads it starts later get the default slice
//! (`SCHED_FLAG_RESET_ON_FORK`): a reader spawned by the serving thread,
//! which wants long runs, does not inherit it. On older kernels the call
//! fails and nothing changes.
//!
//! Invariants:
//! - SC1 `SchedAttr` has the kernel's `struct sched_attr` layout of its
//!   first version (`SCHED_ATTR_SIZE_VER0`, 48 bytes, checked at compile
//!   time), its `size` says so, and it outlives the call, which only reads
//!   it.

use std::time::Duration;

/// `struct sched_attr`, first version.
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

const SCHED_ATTR_SIZE_VER0: usize = 48;
const _: () = assert!(std::mem::size_of::<SchedAttr>() == SCHED_ATTR_SIZE_VER0);
/// SCHED_OTHER (SCHED_NORMAL).
const SCHED_OTHER: u32 = 0;
/// Threads and processes started by this one get the default attributes.
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// Errors of asking for a slice.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SchedError {
    #[error("reading the thread's nice value: {0}")]
    Nice(#[source] std::io::Error),
    #[error("sched_setattr: {0}")]
    SetAttr(#[source] std::io::Error),
}

/// Asks the scheduler to give the calling thread slices of `slice` (the
/// kernel clamps it to 0.1–100 ms), keeping SCHED_OTHER and its nice value.
pub(crate) fn request_slice(slice: Duration) -> Result<(), SchedError> {
    let nice = rustix::process::getpriority_process(None)
        .map_err(|e| SchedError::Nice(std::io::Error::from_raw_os_error(e.raw_os_error())))?;
    let attr = SchedAttr {
        size: SCHED_ATTR_SIZE_VER0 as u32,
        policy: SCHED_OTHER,
        flags: SCHED_FLAG_RESET_ON_FORK,
        nice,
        priority: 0,
        runtime: slice.as_nanos().min(u128::from(u64::MAX)) as u64,
        deadline: 0,
        period: 0,
    };
    // SAFETY: SC1 — a pointer to a live, correctly laid out and sized
    // struct; pid 0 is the calling thread; the call's own flags are 0.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
    if r != 0 {
        return Err(SchedError::SetAttr(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice the kernel reports for this thread, where it says
    /// (`se.slice` in /proc/thread-self/sched, kernels with EEVDF).
    fn slice_now() -> Option<u64> {
        let text = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
        text.lines()
            .find(|l| l.starts_with("se.slice"))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|v| v.trim().parse().ok())
    }

    #[test]
    fn a_thread_gets_the_slice_it_asks_for_keeps_its_nice_value_and_does_not_pass_it_on() {
        std::thread::spawn(|| {
            let nice = rustix::process::getpriority_process(None).expect("nice");
            match request_slice(Duration::from_micros(250)) {
                Ok(()) => {
                    if let Some(s) = slice_now() {
                        assert_eq!(s, 250_000);
                        // A thread it starts does not inherit the slice.
                        let child = std::thread::spawn(slice_now).join().expect("child");
                        assert_ne!(child, Some(250_000), "the slice was inherited");
                    }
                }
                // Kernels before 6.12 refuse a runtime for SCHED_OTHER.
                Err(SchedError::SetAttr(e)) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}")
                }
                Err(e) => panic!("{e}"),
            }
            assert_eq!(
                rustix::process::getpriority_process(None).expect("nice"),
                nice
            );
        })
        .join()
        .expect("thread");
    }
}
