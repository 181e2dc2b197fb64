//! Oracle for the SysStats text parsers (`/proc/meminfo`, `vmstat`, `stat`,
//! `diskstats`, `buddyinfo`, `pressure/*`): the first byte picks the parser,
//! the rest is the file's text. Checks that the parser never panics, that
//! its output is well-formed protobuf (walked by an independent reader here,
//! down into every nested entry), and that the number of entries of each
//! kind agrees with an independent count of the lines that should yield one.

use recorder::sources::sys_stats::{
    MEMINFO_KEYS, VMSTAT_KEYS, enabled_keys, encode_buddyinfo, encode_diskstats, encode_meminfo,
    encode_psi, encode_stat, encode_vmstat, stat_mask,
};
use recorder::trace::encoder::ProtoEncoder;

pub fn check(data: &[u8]) {
    let Some((&sel, text)) = data.split_first() else {
        return;
    };
    // Each input byte yields at most a few dozen output bytes (a "cpu0\n"
    // line becomes a ~100-byte CpuTimes), so this always fits.
    let mut buf = vec![0u8; text.len() * 64 + 4096];
    let mut e = ProtoEncoder::new(&mut buf);
    let lines = split_lines(text);
    let (field, expected) = match sel % 6 {
        0 => {
            let keys = enabled_keys(MEMINFO_KEYS, &[], "fuzz");
            encode_meminfo(&mut e, text, &keys);
            let n = lines
                .iter()
                .filter(|l| {
                    let w = split_words(l);
                    w.len() >= 2 && {
                        let k = w[0].strip_suffix(b":").unwrap_or(w[0]);
                        MEMINFO_KEYS.iter().any(|(n, _)| n.as_bytes() == k)
                    }
                })
                .count();
            (1, n)
        }
        1 => {
            let keys = enabled_keys(VMSTAT_KEYS, &[], "fuzz");
            encode_vmstat(&mut e, text, &keys);
            let n = lines
                .iter()
                .filter(|l| {
                    let w = split_words(l);
                    w.len() >= 2 && VMSTAT_KEYS.iter().any(|(n, _)| n.as_bytes() == w[0])
                })
                .count();
            (2, n)
        }
        2 => {
            encode_stat(&mut e, text, stat_mask(&[]), 10_000_000);
            let n = lines
                .iter()
                .filter(|l| {
                    split_words(l)
                        .first()
                        .is_some_and(|w| w.len() > 3 && w.starts_with(b"cpu"))
                })
                .count();
            (3, n)
        }
        3 => {
            encode_diskstats(&mut e, text);
            (13, lines.len())
        }
        4 => {
            encode_buddyinfo(&mut e, text);
            (12, lines.len())
        }
        _ => {
            encode_psi(&mut e, text, 1, 2);
            (14, lines.len())
        }
    };
    let len = e.finish().expect("the buffer is sized for any output");
    let fields = walk(&buf[..len]).expect("well-formed protobuf");
    let got = fields.iter().filter(|(f, _)| *f == field).count();
    assert_eq!(got, expected, "entries of field {field}");
    for (_, payload) in &fields {
        if let Payload::Len(bytes) = payload {
            // Every nested entry is itself a well-formed message.
            walk(bytes).expect("well-formed nested entry");
        }
    }
    if sel % 6 == 5 {
        for (_, p) in &fields {
            let Payload::Len(bytes) = p else {
                panic!("psi entries are messages")
            };
            let inner = walk(bytes).expect("well-formed");
            let resource = inner.iter().find(|(f, _)| *f == 1).map(|(_, p)| p.clone());
            assert!(
                matches!(resource, Some(Payload::Varint(0..=2))),
                "{resource:?}"
            );
        }
    }
}

#[derive(Clone, Debug)]
enum Payload<'a> {
    Varint(u64),
    Len(&'a [u8]),
    Fixed,
}

fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(*pos)?;
        *pos += 1;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The top-level fields of a message, or `None` if it is malformed.
fn walk(b: &[u8]) -> Option<Vec<(u64, Payload<'_>)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < b.len() {
        let tag = varint(b, &mut pos)?;
        let (field, wt) = (tag >> 3, tag & 7);
        if field == 0 {
            return None;
        }
        let p = match wt {
            0 => Payload::Varint(varint(b, &mut pos)?),
            1 => {
                pos = pos.checked_add(8).filter(|p| *p <= b.len())?;
                Payload::Fixed
            }
            2 => {
                let n = usize::try_from(varint(b, &mut pos)?).ok()?;
                let end = pos.checked_add(n).filter(|e| *e <= b.len())?;
                let s = &b[pos..end];
                pos = end;
                Payload::Len(s)
            }
            5 => {
                pos = pos.checked_add(4).filter(|p| *p <= b.len())?;
                Payload::Fixed
            }
            _ => return None,
        };
        out.push((field, p));
    }
    Some(out)
}

/// Non-empty `\n`-separated lines (written independently of the parser's).
fn split_lines(t: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 0..=t.len() {
        if i == t.len() || t[i] == b'\n' {
            if i > start {
                out.push(&t[start..i]);
            }
            start = i + 1;
        }
    }
    out
}

/// Words separated by runs of spaces and tabs.
fn split_words(l: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, &c) in l.iter().enumerate() {
        let blank = c == b' ' || c == b'\t';
        match (blank, start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                out.push(&l[s..i]);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(&l[s..]);
    }
    out
}
