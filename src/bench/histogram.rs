//! Latency histograms (hdrhistogram, nanoseconds) and their summary
//! percentiles.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Longest latency recorded exactly (values above are clamped): one hour.
const MAX_NS: u64 = 3_600_000_000_000;

/// A latency histogram in nanoseconds, 3 significant figures.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    hist: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    pub fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, MAX_NS, 3)
                .expect("bounds 1..1h with 3 figures are valid hdrhistogram parameters"),
        }
    }

    /// Records one value; 0 is raised to 1 ns and values past an hour are
    /// clamped, so recording never fails.
    pub(crate) fn record_ns(&mut self, ns: u64) {
        self.hist.saturating_record(ns.max(1));
    }

    /// Records `value` `count` times (one timed batch standing for its packets).
    pub(crate) fn record_n_ns(&mut self, ns: u64, count: u64) {
        // The clamp keeps the value in bounds, so this cannot fail.
        let _ = self.hist.record_n(ns.clamp(1, MAX_NS), count);
    }

    /// Adds every value of `other`.
    pub(crate) fn merge(&mut self, other: &LatencyHistogram) {
        // Same bounds on both sides, so this cannot fail.
        let _ = self.hist.add(&other.hist);
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// p50, p99, p99.9 and max (all 0 when empty).
    pub(crate) fn percentiles(&self) -> Percentiles {
        if self.hist.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: self.hist.len(),
            p50_ns: self.hist.value_at_quantile(0.50),
            p99_ns: self.hist.value_at_quantile(0.99),
            p999_ns: self.hist.value_at_quantile(0.999),
            max_ns: self.hist.max(),
        }
    }
}

/// Summary of a [`LatencyHistogram`]. Values are hdrhistogram's
/// (highest-equivalent values, within 0.1%).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub(crate) p50_ns: u64,
    pub(crate) p99_ns: u64,
    pub(crate) p999_ns: u64,
    pub(crate) max_ns: u64,
}

/// Formats nanoseconds for people: `850ns`, `12.3us`, `4.56ms`, `1.20s`.
pub(crate) fn format_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}us", f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", f / 1e6)
    } else {
        format!("{:.2}s", f / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within hdrhistogram's 3-significant-figure resolution.
    fn close(a: u64, b: u64) -> bool {
        a.abs_diff(b) <= b / 500 + 1
    }

    #[test]
    fn percentiles_of_1_to_1000() {
        let mut h = LatencyHistogram::new();
        for v in 1..=1000 {
            h.record_ns(v);
        }
        let p = h.percentiles();
        assert_eq!(p.count, 1000);
        assert!(close(p.p50_ns, 500), "{p:?}");
        assert!(close(p.p99_ns, 990), "{p:?}");
        assert!(close(p.p999_ns, 999), "{p:?}");
        assert!(close(p.max_ns, 1000), "{p:?}");
    }

    #[test]
    fn a_single_outlier_shows_only_in_the_tail() {
        let mut h = LatencyHistogram::new();
        h.record_n_ns(100, 9_999);
        h.record_ns(1_000_000);
        let p = h.percentiles();
        assert!(close(p.p50_ns, 100));
        assert!(close(p.p99_ns, 100));
        assert!(close(p.p999_ns, 100));
        assert!(close(p.max_ns, 1_000_000));
    }

    #[test]
    fn merge_adds_counts_and_zero_is_recorded() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        a.record_ns(0);
        b.record_n_ns(50, 3);
        b.record_ns(u64::MAX);
        a.merge(&b);
        assert_eq!(a.count(), 5);
        assert!(close(a.percentiles().max_ns, MAX_NS));
        assert_eq!(a.percentiles().p50_ns, 50);
    }

    #[test]
    fn empty_is_all_zero() {
        assert_eq!(
            LatencyHistogram::new().percentiles(),
            Percentiles::default()
        );
    }

    #[test]
    fn format_ns_units() {
        assert_eq!(format_ns(850), "850ns");
        assert_eq!(format_ns(12_340), "12.3us");
        assert_eq!(format_ns(4_560_000), "4.56ms");
        assert_eq!(format_ns(1_200_000_000), "1.20s");
    }
}
