//! The summary printed when a session ends: what was written, how it ended,
//! and, for every buffer that lost data, what to change. "Nothing lost" is
//! said only when the file received everything: after an output failure or
//! at the size cap the summary says what did not reach the file instead.

use std::fmt::Write;

use crate::bytes::HumanBytes;
use crate::event_loop::{BufferSummary, Outcome};
use crate::session::{StopReason, Timeline, TriggerMode};

/// The summary for people (several lines, no trailing newline).
pub(crate) fn render(o: &Outcome, t: &Timeline) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "recorder: {} — {} in {:.1} s ({}, {} write passes)",
        o.output_label,
        HumanBytes(o.bytes_written),
        o.elapsed.as_secs_f64(),
        o.sink_kind,
        o.passes
    );
    let _ = writeln!(s, "  ended: {}", o.reason);
    if let Some((before, after)) = o.compression {
        let _ = writeln!(
            s,
            "  zstd: {} of packets written as {} ({:.2}x)",
            HumanBytes(before),
            HumanBytes(after),
            before as f64 / after.max(1) as f64
        );
    }
    if let Some(seg) = &o.segments {
        segments(&mut s, seg);
    }
    trigger_notes(&mut s, o, t);
    // What kept buffered data from the file, if anything did.
    let file_short = match &o.reason {
        // The buffers were not to be written (Perfetto's semantics): the
        // failure was the sync of what the file held already.
        StopReason::OutputFailed(_) if kept_back(o, t) => {
            let _ = writeln!(
                s,
                "  no trigger fired, so the buffers were not to be written; the output failed syncing what it held (see above)"
            );
            None
        }
        StopReason::OutputFailed(_) => {
            Some("not all of it reached the file: the output failed (see above)")
        }
        StopReason::SizeCap => {
            let _ = writeln!(
                s,
                "  max_file_size_bytes left {} of the last pass out of the file",
                HumanBytes(o.cut_bytes)
            );
            Some("not all of it reached the file: max_file_size_bytes left the rest out")
        }
        _ => None,
    };
    let mut packets = 0;
    for (i, b) in o.buffers.iter().enumerate() {
        packets += b.stats.packets_written;
        buffer(&mut s, i, b, t, file_short);
    }
    for p in &o.producers {
        producer(&mut s, p);
    }
    for q in &o.quotas {
        quota(&mut s, q);
    }
    rules(&mut s, &o.rules);
    let _ = write!(s, "  {packets} packets in all");
    for w in &o.warnings {
        let _ = write!(s, "\n  warning: {w}");
    }
    s
}

/// What each trigger rule did, and the rules that never fired.
fn rules(s: &mut String, rules: &[crate::event_loop::rules::RuleReport]) {
    let ms = |ns: u64| ns as f64 / 1e6;
    for r in rules.iter().filter(|r| r.matched > 0) {
        let _ = write!(
            s,
            "  rule {:?}: matched {}, fired {}, taken {}",
            r.name, r.matched, r.fired, r.accepted
        );
        if r.suppressed > 0 {
            let _ = write!(s, ", {} held back by its count or rate", r.suppressed);
        }
        if r.refused > 0 {
            let _ = write!(
                s,
                ", {} refused by the session ({})",
                r.refused,
                r.last_refusal.as_deref().unwrap_or("?")
            );
        }
        if let (Some(m), Some(x)) = (r.delay_median_ns, r.delay_max_ns) {
            let _ = write!(
                s,
                "; event to recorder {:.1} ms median, {:.1} ms most",
                ms(m),
                ms(x)
            );
        }
        if let Some(f) = r.frozen_after_ns {
            let _ = write!(
                s,
                "; frozen: the kernel's buffers end {:.1} µs after the match",
                f as f64 / 1e3
            );
        }
        let _ = writeln!(s, "\n    {}", r.text);
    }
    let never: Vec<&crate::event_loop::rules::RuleReport> =
        rules.iter().filter(|r| r.matched == 0).collect();
    for r in never {
        let _ = writeln!(s, "  rule {:?} never fired: {}", r.name, r.text);
    }
}

/// Whether the session held its buffers back for a trigger that never
/// fired: an untriggered START_TRACING or STOP_TRACING session writes
/// nothing at its end, unless it streams while it waits.
fn kept_back(o: &Outcome, t: &Timeline) -> bool {
    !o.triggered
        && matches!(t.mode, TriggerMode::StopTracing | TriggerMode::StartTracing)
        && !t.streams_before_trigger()
}

/// What the trigger mode made of the run: an untriggered session's empty
/// output, a CLONE_SNAPSHOT session's snapshots.
fn trigger_notes(s: &mut String, o: &Outcome, t: &Timeline) {
    match (&o.reason, t.mode) {
        (StopReason::TriggerTimeout, m) if m != TriggerMode::None => {
            let _ = writeln!(
                s,
                "  no trigger fired within trigger_timeout_ms ({} ms), so nothing was written: as with Perfetto, an untriggered {} session leaves the output empty.",
                t.trigger_timeout.as_millis(),
                mode_name(m)
            );
            let names: Vec<&str> = t.rules.iter().map(|r| r.name.as_str()).collect();
            let _ = writeln!(s, "  listed triggers: {}", names.join(", "));
        }
        (
            StopReason::Signal | StopReason::StopRequested,
            TriggerMode::StopTracing | TriggerMode::StartTracing,
        ) if !o.triggered => {
            let _ = writeln!(
                s,
                "  stopped before any trigger fired: nothing was written (Perfetto's semantics)."
            );
        }
        _ => {}
    }
    if t.mode == TriggerMode::CloneSnapshot {
        if o.snapshots.is_empty() {
            let _ = writeln!(
                s,
                "  no snapshot was taken (the main output of a CLONE_SNAPSHOT session stays empty)"
            );
        }
        for p in &o.snapshots {
            let _ = writeln!(s, "  snapshot: {}", p.display());
        }
        if o.snapshots_refused > 0 {
            let b = &t.snapshot_budget;
            let _ = writeln!(
                s,
                "  {} snapshot trigger(s) refused: a snapshot was under way, the budget was spent, or the sender's uid had taken its share ({} snapshots, {} at most, each counted at {}; a uid other than root and the session's user {} at most, {} of them kept for those two)",
                o.snapshots_refused,
                b.max_count,
                HumanBytes(b.max_bytes),
                HumanBytes(b.bytes_each),
                b.share(),
                b.reserved()
            );
        }
    }
}

/// One buffer's line, and for each kind of loss in it, what to change.
fn buffer(s: &mut String, i: usize, b: &BufferSummary, t: &Timeline, file_short: Option<&str>) {
    let st = &b.stats;
    let lost = st.bytes_overwritten + st.bytes_discarded;
    let _ = write!(
        s,
        "  buffer {i} ({}, {}): {} packets, {} recorded",
        b.policy,
        HumanBytes(st.buffer_size),
        st.packets_written,
        HumanBytes(st.bytes_written)
    );
    if let Some(why) = file_short {
        let _ = write!(s, "; {why}");
        if st.bytes_buffered > 0 {
            let _ = write!(
                s,
                "; {} ({} packets) still buffered were never written",
                HumanBytes(st.bytes_buffered),
                st.packets_buffered
            );
        }
    }
    if lost == 0 && st.packets_refused == 0 {
        if file_short.is_none() {
            let _ = write!(s, ", nothing lost");
        }
        let _ = writeln!(s);
        return;
    }
    let _ = writeln!(s);
    if st.bytes_overwritten > 0 {
        let advice = if t.write_period.is_some() {
            "raise size_kb or shorten file_write_period_ms"
        } else {
            "raise size_kb, or stream with write_into_file"
        };
        let _ = writeln!(
            s,
            "    {} overwritten ({} packets, RING_BUFFER): {advice}",
            HumanBytes(st.bytes_overwritten),
            st.packets_overwritten
        );
    }
    let (full_packets, full_bytes) = st.discarded_full();
    if full_bytes > 0 || full_packets > 0 {
        let _ = writeln!(
            s,
            "    {} discarded ({} packets, DISCARD: the buffer was full): raise size_kb{}",
            HumanBytes(full_bytes),
            full_packets,
            if t.write_period.is_some() {
                " or shorten file_write_period_ms"
            } else {
                ""
            }
        );
    }
    if st.bytes_discarded_pinned > 0 || st.packets_discarded_pinned > 0 {
        let _ = writeln!(
            s,
            "    {} discarded ({} packets, {}: the free space was pinned by a write pass in flight): \
             raise size_kb or shorten file_write_period_ms",
            HumanBytes(st.bytes_discarded_pinned),
            st.packets_discarded_pinned,
            b.policy
        );
    }
    if st.bytes_discarded_held > 0 || st.packets_discarded_held > 0 {
        let _ = writeln!(
            s,
            "    {} discarded ({} packets, {}: every chunk was taken by another writer, most of them \
             nearly empty: many data sources on few chunks, not a full buffer): \
             raise size_kb or use fewer data sources per buffer",
            HumanBytes(st.bytes_discarded_held),
            st.packets_discarded_held,
            b.policy
        );
    }
    if st.packets_refused > 0 {
        let _ = writeln!(
            s,
            "    {} packets refused as too big for the buffer",
            st.packets_refused
        );
    }
}

/// The segments line(s): how many, their sizes, what the budget deleted,
/// the hook's record.
fn segments(s: &mut String, seg: &crate::storage::segment::SegmentsStatus) {
    let mut sizes: Vec<u64> = seg.segments.iter().map(|x| x.bytes).collect();
    sizes.sort_unstable();
    let kept = seg.segments.iter().filter(|x| x.kept).count();
    let _ = write!(
        s,
        "  segments: {} in {} ({kept} kept, {} deleted by the budget, {} on disk)",
        seg.segments.len(),
        seg.dir.display(),
        seg.deleted,
        HumanBytes(seg.bytes_on_disk)
    );
    if let (Some(min), Some(max)) = (sizes.first(), sizes.last()) {
        let median = sizes[sizes.len() / 2];
        let _ = write!(
            s,
            "; sizes {} / {} / {} (min / median / max)",
            HumanBytes(*min),
            HumanBytes(median),
            HumanBytes(*max)
        );
    }
    let _ = writeln!(s);
    let lost: Vec<String> = seg
        .segments
        .iter()
        .filter(|x| x.lost_bytes > 0)
        .map(|x| format!("{} ({})", x.index, HumanBytes(x.lost_bytes)))
        .collect();
    if !lost.is_empty() {
        let _ = writeln!(s, "    segments with loss: {}", lost.join(", "));
    }
    if let Some(h) = &seg.hook {
        let _ = write!(
            s,
            "    --on-segment-closed: {} ran, {} failed ({} timed out), {} not run",
            h.ran, h.failed, h.timed_out, h.skipped
        );
        if h.gone > 0 {
            let _ = write!(s, " ({} of them deleted before their turn)", h.gone);
        }
        if h.stopped > 0 {
            let _ = write!(s, ", {} killed at the end", h.stopped);
        }
        let _ = writeln!(s, "; {} segments deleted or moved by it", h.deleted);
    }
}

fn mode_name(m: TriggerMode) -> &'static str {
    match m {
        TriggerMode::None => "untriggered",
        TriggerMode::StartTracing => "START_TRACING",
        TriggerMode::StopTracing => "STOP_TRACING",
        TriggerMode::CloneSnapshot => "CLONE_SNAPSHOT",
    }
}

/// One uid's quota line: what its producers were refused, and its closed
/// producers folded into it.
pub(crate) fn quota(s: &mut String, q: &crate::producer::quota::UidReport) {
    let who = if q.uid == crate::transport::peer::OTHER_UIDS {
        "other uids".to_string()
    } else {
        format!("uid {}", q.uid)
    };
    let _ = write!(s, "  producers of {who}:");
    let mut sep = " ";
    for (limit, n) in q.hits.each() {
        let _ = write!(s, "{sep}{n} {}", limit.what());
        sep = ", ";
    }
    if q.closed_producers > 0 {
        let _ = write!(
            s,
            "{sep}{} more closed producers ({} packets, {})",
            q.closed_producers,
            q.closed_stats.packets,
            HumanBytes(q.closed_stats.bytes)
        );
    }
    let _ = writeln!(s);
}

/// One producer's line: who, what it wrote, what it lost and why.
fn producer(s: &mut String, p: &crate::producer::host::ProducerReport) {
    let st = &p.stats;
    let sources = if p.data_sources.is_empty() {
        "no data source of this config".to_string()
    } else {
        p.data_sources.join(", ")
    };
    let _ = write!(
        s,
        "  producer {:?} (pid {}, uid {}): {sources}; {} packets, {} in {} chunks",
        crate::producer::connection::short(&p.name),
        p.pid,
        p.uid,
        st.packets,
        HumanBytes(st.bytes),
        st.chunks_committed
    );
    if st.chunks_scraped > 0 {
        let _ = write!(s, " ({} scraped before their commit)", st.chunks_scraped);
    }
    let mut any = false;
    for (what, n) in st.losses() {
        let _ = write!(s, "{} {n} {what}", if any { "," } else { "; lost:" });
        any = true;
    }
    if !any {
        let _ = write!(s, ", nothing refused");
    }
    if !p.connected {
        let _ = write!(s, " (disconnected)");
    }
    let _ = writeln!(s);
}
