//! The aligned table people read: one row per configuration.

use super::histogram::format_ns;
use super::report::ConfigReport;

/// A text table: a header row, then rows; text columns are left-aligned,
/// numeric ones right-aligned, two spaces apart.
#[derive(Clone, Debug, Default)]
pub(crate) struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

fn numeric(cell: &str) -> bool {
    cell.chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '-')
}

impl Table {
    pub(crate) fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are blank, extra ones ignored).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn render(&self) -> String {
        let n = self.headers.len();
        let cell = |r: &Vec<String>, i: usize| r.get(i).cloned().unwrap_or_default();
        let mut width: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        // A column is right-aligned when all its non-empty cells are numbers.
        let mut right = vec![true; n];
        for r in &self.rows {
            for (i, w) in width.iter_mut().enumerate() {
                let c = cell(r, i);
                *w = (*w).max(c.chars().count());
                if !c.is_empty() && !numeric(&c) {
                    right[i] = false;
                }
            }
        }
        let mut out = String::new();
        let line = |cells: Vec<String>, out: &mut String| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                let pad = width[i].saturating_sub(c.chars().count());
                if right[i] {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad));
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(self.headers.clone(), &mut out);
        for r in &self.rows {
            line((0..n).map(|i| cell(r, i)).collect(), &mut out);
        }
        out
    }
}

/// `1234567` → `1.23M`; `999` → `999`.
pub(crate) fn si(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// The sweep as a table.
pub(crate) fn sweep_table(reports: &[ConfigReport]) -> String {
    let mut t = Table::new(&[
        "#",
        "policy",
        "buf_kb",
        "chunk_kb",
        "pkt_b",
        "wr",
        "period_ms",
        "offered/s",
        "accepted/s",
        "MB/s",
        "retained%",
        "overwr_MB",
        "discard_MB",
        "write_p50",
        "write_p99",
        "acq_p99",
        "pass_p99",
        "cpu_s",
        "rss_MB",
        "verified",
        "kept",
        "lossless/s",
        "min_kb",
    ]);
    for r in reports {
        let b = r.buffers.first();
        t.row(vec![
            r.index.to_string(),
            r.policy.to_string(),
            r.buffer_kb.to_string(),
            format!("{}", r.chunk_kb),
            r.packet_size.map_or("-".into(), |p| p.to_string()),
            r.writers.to_string(),
            r.write_period_ms.to_string(),
            si(r.offered_pps),
            si(r.accepted_pps),
            format!("{:.1}", r.accepted_mbps),
            format!("{:.2}", r.retained_pct),
            format!("{:.1}", r.bytes_overwritten as f64 / 1e6),
            format!("{:.1}", r.bytes_discarded as f64 / 1e6),
            format_ns(r.write_latency.p50_ns),
            format_ns(r.write_latency.p99_ns),
            format_ns(r.acquire_latency.p99_ns),
            format_ns(r.passes.duration.p99_ns),
            format!("{:.2}", r.cpu.total_s),
            format!("{:.1}", r.peak_rss_kb as f64 / 1024.0),
            if !r.verify.checked {
                "skipped".into()
            } else if r.verify.ok {
                "yes".into()
            } else {
                "NO".into()
            },
            r.verify.kept().to_string(),
            b.map_or("-".into(), |b| si(b.lossless_rate_pps)),
            b.map_or("-".into(), |b| b.min_size_kb.to_string()),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_text_left_and_numbers_right() {
        let mut t = Table::new(&["name", "n"]);
        t.row(vec!["ring".into(), "5".into()]);
        t.row(vec!["discard".into(), "1234".into()]);
        t.row(vec!["x".into()]);
        assert_eq!(
            t.render(),
            "name        n\n\
             ring        5\n\
             discard  1234\n\
             x\n"
        );
    }

    #[test]
    fn a_text_cell_makes_the_column_left_aligned() {
        let mut t = Table::new(&["a", "ok"]);
        t.row(vec!["1".into(), "yes".into()]);
        t.row(vec!["22".into(), "NO".into()]);
        assert_eq!(t.render(), " a  ok\n 1  yes\n22  NO\n");
    }

    #[test]
    fn si_units() {
        assert_eq!(si(999.0), "999");
        assert_eq!(si(12_345.0), "12.3k");
        assert_eq!(si(5_700_000.0), "5.70M");
        assert_eq!(si(1.2e9), "1.20G");
    }
}
