//! Giving the heap's free pages back to the kernel.
//!
//! Set-up allocates what the session never needs again (the config
//! schema's descriptors, about 6 MiB), and allocations made after it sit
//! above it on the heap, so the allocator cannot shrink the heap when it
//! is freed: its pages would stay resident, and counted, for a session of
//! hours. glibc's `malloc_trim` hands free pages anywhere in the heap back
//! (`MADV_DONTNEED`); other C libraries keep them.
//!
//! Invariants:
//! - H1 `malloc_trim` takes no pointer and touches only the allocator's own
//!   free lists, under its own locks: any thread may call it at any time.

/// Returns the heap's free pages to the kernel, where the C library can;
/// whether any were returned.
pub(crate) fn return_free_pages() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: H1.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident set of this process, in KiB.
    fn rss_kb() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            })
            .unwrap_or(0)
    }

    #[test]
    fn freed_small_allocations_below_live_ones_leave_the_resident_set() {
        // 16 MiB in small pieces (each below the allocator's mmap
        // threshold, so on the heap), touched, then a live allocation above
        // them, then the pieces freed: only a trim gives their pages back.
        let pieces: Vec<Vec<u8>> = (0..4096).map(|_| vec![1u8; 4096]).collect();
        let above = vec![2u8; 4096];
        drop(pieces);
        let before = rss_kb();
        let trimmed = return_free_pages();
        let after = rss_kb();
        assert_eq!(above[0], 2);
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(trimmed, "nothing given back");
            // Other tests run beside this one: ask for half.
            assert!(
                after + 8 * 1024 <= before,
                "resident {before} KiB before the trim, {after} KiB after"
            );
        }
    }
}
