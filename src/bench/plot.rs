//! `--plot FILE.svg`: two bar charts over the sweep, retained % above and
//! accepted MB/s below, one bar per configuration (a few lines of SVG by
//! hand; no plotting dependency).

use std::fmt::Write;

use super::report::ConfigReport;

const WIDTH: f64 = 900.0;
const PANEL: f64 = 220.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;
const GAP: f64 = 70.0;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A short label for a configuration's bar.
fn label(r: &ConfigReport) -> String {
    let mut s = format!("#{} {} {}K", r.index, r.policy, r.buffer_kb);
    if let Some(p) = r.packet_size {
        let _ = write!(s, " {p}B");
    }
    s
}

/// One panel of bars, values in `0..=max`.
fn panel(out: &mut String, y0: f64, title: &str, values: &[(String, f64)], max: f64, color: &str) {
    let n = values.len().max(1) as f64;
    let plot_w = WIDTH - LEFT - 20.0;
    let slot = plot_w / n;
    let bar = (slot * 0.7).max(1.0);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{:.1}" font-size="14" font-weight="bold">{}</text>"#,
        y0 - 10.0,
        escape(title)
    );
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{y0:.1}" x2="{LEFT}" y2="{:.1}" stroke="#333"/>"##,
        y0 + PANEL
    );
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/>"##,
        y0 + PANEL,
        WIDTH - 20.0,
        y0 + PANEL
    );
    for k in 0..=4 {
        let v = max * k as f64 / 4.0;
        let y = y0 + PANEL - PANEL * k as f64 / 4.0;
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{v:.1}</text><line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
            LEFT - 4.0,
            y + 3.0,
            WIDTH - 20.0
        );
    }
    for (i, (name, v)) in values.iter().enumerate() {
        let h = if max > 0.0 {
            PANEL * (v / max).clamp(0.0, 1.0)
        } else {
            0.0
        };
        let x = LEFT + slot * i as f64 + (slot - bar) / 2.0;
        let y = y0 + PANEL - h;
        let _ = writeln!(
            out,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{bar:.1}" height="{h:.1}" fill="{color}"><title>{}: {v:.2}</title></rect>"#,
            escape(name)
        );
        let lx = x + bar / 2.0;
        let ly = y0 + PANEL + 12.0;
        let _ = writeln!(
            out,
            r#"<text x="{lx:.1}" y="{ly:.1}" font-size="9" text-anchor="end" transform="rotate(-30 {lx:.1} {ly:.1})">{}</text>"#,
            escape(name)
        );
    }
}

/// The SVG document for `reports`.
pub(crate) fn svg(reports: &[ConfigReport]) -> String {
    let height = TOP + 2.0 * PANEL + 2.0 * GAP + 20.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let retained: Vec<(String, f64)> = reports.iter().map(|r| (label(r), r.retained_pct)).collect();
    panel(&mut out, TOP, "retained %", &retained, 100.0, "#4c9f70");
    let mbps: Vec<(String, f64)> = reports
        .iter()
        .map(|r| (label(r), r.accepted_mbps))
        .collect();
    let max = mbps.iter().map(|(_, v)| *v).fold(0.0, f64::max);
    let max = if max > 0.0 { max * 1.1 } else { 1.0 };
    panel(
        &mut out,
        TOP + PANEL + GAP,
        "accepted MB/s",
        &mbps,
        max,
        "#3a6ea5",
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(escape("a<b>&c"), "a&lt;b&gt;&amp;c");
    }

    #[test]
    fn empty_sweep_is_a_valid_document() {
        let s = svg(&[]);
        assert!(s.starts_with("<svg "));
        assert!(s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<rect").count(), 1);
    }
}
