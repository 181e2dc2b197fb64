//! The layouts the kernel publishes in tracefs, parsed at run time so that no
//! offset is hard-coded: `events/header_page` (the ring-buffer page header),
//! `events/header_event` (the event header bit split) and each event's
//! `events/GROUP/NAME/format` (id and field layout).
//!
//! ```text
//!  field:unsigned short common_type;  offset:0;  size:2;  signed:0;
//!  field:char prev_comm[16];          offset:8;  size:16; signed:0;   fixed char array
//!  field:__data_loc char[] filename;  offset:8;  size:4;  signed:0;   u32: len<<16 | offset
//!  field:char buf[];                  offset:16; size:0;  signed:0;   rest of the record
//! ```

/// Why a tracefs layout file could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    /// A `field:` line lacks its declaration, `offset:` or `size:`.
    #[error("line {line}: malformed field description: {text:?}")]
    BadField {
        /// The line's number in the file, from 1.
        line: usize,
        /// The line as read.
        text: String,
    },
    /// A field or line the file must have is absent (`name:`, `ID:`,
    /// `common_type`, or a page header field).
    #[error("missing `{0}`")]
    Missing(&'static str),
    /// A field has a size the walker does not implement (a page timestamp
    /// other than 8 bytes, a commit other than 4 or 8, a `common_type` other than
    /// 1, 2 or 4).
    #[error("unsupported layout: {what} of {size} bytes")]
    Size {
        /// Which field (`page commit`, `common_type`, …).
        what: &'static str,
        /// Its size in bytes, as the file gives it.
        size: usize,
    },
    /// `header_page` puts the page's data before the end of its commit field, or
    /// gives it no room.
    #[error("unsupported layout: page data before its header")]
    DataBeforeHeader,
    /// `header_event` does not describe the event header the page walker
    /// implements (what it lacks).
    #[error("unsupported layout: header_event lacks `{0}`")]
    HeaderEventLacks(&'static str),
}

/// Where the page header fields live (from `events/header_page`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageLayout {
    /// Where the page's u64 timestamp sits in the page header.
    pub timestamp_offset: usize,
    /// Where the commit word (data length and loss flags) sits.
    pub commit_offset: usize,
    /// 8 on 64-bit kernels (`local_t`), 4 on 32-bit ones.
    pub commit_size: usize,
    /// Where the event data starts: the header's size.
    pub data_offset: usize,
    /// Bytes of event data a page has room for.
    pub data_size: usize,
}

impl PageLayout {
    /// Bytes of one whole page: header plus data area.
    pub fn page_size(&self) -> usize {
        self.data_offset + self.data_size
    }
}

/// How a field's bytes are to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldKind {
    /// A 1, 2, 4 or 8 byte integer.
    Int,
    /// `char name[N]`: NUL-padded text of at most `size` bytes.
    CharArray,
    /// `__data_loc char[] name`: a u32 holding `len << 16 | offset` from the
    /// record start.
    DataLoc,
    /// `char name[]` of size 0: text running to the end of the record.
    TailString,
    /// Any other array or size: kept in the layout, not decoded.
    Opaque,
}

/// One field of an event record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The field's name in the declaration (`prev_comm`).
    pub name: String,
    pub(crate) type_name: String,
    /// Byte offset in the record (`offset:`).
    pub offset: usize,
    /// Bytes it takes (`size:`); for `__data_loc`, those of the u32 locator.
    pub size: usize,
    /// Whether the format file says `signed:1`.
    pub signed: bool,
    /// How its bytes are read.
    pub kind: FieldKind,
}

/// One event's id and layout (from `events/GROUP/NAME/format`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventFormat {
    /// The event's group (`sched` of `sched/sched_switch`).
    pub group: String,
    /// The event's name (`name:`).
    pub name: String,
    /// The kernel's id of the event (`ID:`), which each record leads with
    /// (`common_type`).
    pub id: u16,
    /// The `common_*` fields shared by every event.
    pub common: Vec<Field>,
    /// The event's own fields.
    pub fields: Vec<Field>,
}

impl EventFormat {
    /// The field named `name`, common or own.
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields
            .iter()
            .chain(self.common.iter())
            .find(|f| f.name == name)
    }
}

/// Splits `key:value;` pairs of one `field:` line into (declaration, offset,
/// size, signed).
fn parse_field_line(line: &str) -> Option<(String, usize, usize, bool)> {
    let mut decl = None;
    let mut offset = None;
    let mut size = None;
    let mut signed = None;
    for part in line.split(';') {
        let part = part.trim();
        if let Some(v) = part.strip_prefix("field:") {
            decl = Some(v.trim().to_string());
        } else if let Some(v) = part.strip_prefix("offset:") {
            offset = v.trim().parse().ok();
        } else if let Some(v) = part.strip_prefix("size:") {
            size = v.trim().parse().ok();
        } else if let Some(v) = part.strip_prefix("signed:") {
            signed = v.trim().parse::<u8>().ok().map(|s| s != 0);
        }
    }
    // header_page has no `signed:` on some kernels; default to unsigned.
    Some((decl?, offset?, size?, signed.unwrap_or(false)))
}

/// Turns a C declaration (`unsigned char common_flags`, `char comm[16]`,
/// `__data_loc char[] name`) into (type, name, kind).
fn classify(decl: &str, size: usize) -> (String, String, FieldKind) {
    let decl = decl.trim();
    let (type_part, last) = match decl.rfind(char::is_whitespace) {
        Some(i) => (decl[..i].trim(), decl[i..].trim()),
        None => ("", decl),
    };
    let (name, array) = match last.find('[') {
        Some(i) => (&last[..i], Some(&last[i..])),
        None => (last, None),
    };
    let type_name = type_part.to_string();
    let is_char = matches!(
        type_part
            .trim_start_matches("unsigned ")
            .trim_start_matches("signed "),
        "char" | "u8" | "s8" | "const char"
    );
    let kind = if type_part.starts_with("__data_loc") {
        FieldKind::DataLoc
    } else if let Some(arr) = array {
        if is_char && (arr == "[]" || size == 0) {
            FieldKind::TailString
        } else if is_char {
            FieldKind::CharArray
        } else {
            FieldKind::Opaque
        }
    } else if matches!(size, 1 | 2 | 4 | 8) {
        FieldKind::Int
    } else {
        FieldKind::Opaque
    };
    (type_name, name.to_string(), kind)
}

fn parse_fields(text: &str) -> Result<Vec<Field>, FormatError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if !t.starts_with("field:") && !t.starts_with("field ") {
            continue;
        }
        // header_page spells it `field: u64 timestamp;`.
        let norm = t.replacen("field ", "field:", 1);
        let (decl, offset, size, signed) =
            parse_field_line(&norm).ok_or_else(|| FormatError::BadField {
                line: i + 1,
                text: line.to_string(),
            })?;
        let (type_name, name, kind) = classify(&decl, size);
        out.push(Field {
            name,
            type_name,
            offset,
            size,
            signed,
            kind,
        });
    }
    Ok(out)
}

/// Parses `events/header_page`.
pub fn parse_header_page(text: &str) -> Result<PageLayout, FormatError> {
    let fields = parse_fields(text)?;
    let get = |n: &'static str| {
        fields
            .iter()
            .find(|f| f.name == n)
            .ok_or(FormatError::Missing(n))
    };
    let ts = get("timestamp")?;
    let commit = get("commit")?;
    let data = get("data")?;
    if ts.size != 8 {
        return Err(FormatError::Size {
            what: "page timestamp",
            size: ts.size,
        });
    }
    if !matches!(commit.size, 4 | 8) {
        return Err(FormatError::Size {
            what: "page commit",
            size: commit.size,
        });
    }
    if data.offset < commit.offset + commit.size || data.size == 0 {
        return Err(FormatError::DataBeforeHeader);
    }
    Ok(PageLayout {
        timestamp_offset: ts.offset,
        commit_offset: commit.offset,
        commit_size: commit.size,
        data_offset: data.offset,
        data_size: data.size,
    })
}

/// Checks `events/header_event` describes the layout the page walker
/// implements: a 32-bit header of 5-bit type_len and 27-bit time_delta, with
/// padding 29, time extend 30, absolute time stamp 31 and data up to 28.
pub(crate) fn check_header_event(text: &str) -> Result<(), FormatError> {
    let squash: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    for (needle, what) in [
        ("type_len : 5 bits", "type_len : 5 bits"),
        ("time_delta : 27 bits", "time_delta : 27 bits"),
        ("padding : type == 29", "padding : type == 29"),
        ("time_extend : type == 30", "time_extend : type == 30"),
        ("data max type_len == 28", "data max type_len == 28"),
    ] {
        if !squash.contains(needle) {
            return Err(FormatError::HeaderEventLacks(what));
        }
    }
    // Older kernels name the absolute stamp differently or lack it; 31 is
    // then never produced, so it is not required here.
    Ok(())
}

/// Parses one `events/GROUP/NAME/format` file.
pub fn parse_event_format(group: &str, text: &str) -> Result<EventFormat, FormatError> {
    let mut name = None;
    let mut id = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("name:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("ID:") {
            id = v.trim().parse::<u16>().ok();
        }
    }
    let name = name.ok_or(FormatError::Missing("name:"))?;
    let id = id.ok_or(FormatError::Missing("ID:"))?;
    let all = parse_fields(text)?;
    let (common, fields): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|f| f.name.starts_with("common_"));
    let ct = common
        .iter()
        .find(|f| f.name == "common_type")
        .ok_or(FormatError::Missing("common_type"))?;
    if !matches!(ct.size, 1 | 2 | 4) {
        return Err(FormatError::Size {
            what: "common_type",
            size: ct.size,
        });
    }
    Ok(EventFormat {
        group: group.to_string(),
        name,
        id,
        common,
        fields,
    })
}

/// Reads an unsigned little-endian integer of `size` bytes at `offset`.
#[inline(always)]
pub(crate) fn read_uint(rec: &[u8], offset: usize, size: usize) -> Option<u64> {
    let b = rec.get(offset..offset.checked_add(size)?)?;
    Some(match size {
        1 => b[0] as u64,
        2 => u16::from_le_bytes([b[0], b[1]]) as u64,
        4 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64,
        8 => u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        _ => return None,
    })
}

/// Reads an integer field, sign-extending signed ones.
#[inline(always)]
pub(crate) fn read_int(rec: &[u8], f: &Field) -> Option<i64> {
    let v = read_uint(rec, f.offset, f.size)?;
    Some(if f.signed && f.size < 8 {
        let shift = 64 - 8 * f.size as u32;
        ((v << shift) as i64) >> shift
    } else {
        v as i64
    })
}

/// The bytes of a text field, up to its first NUL.
#[inline]
pub(crate) fn read_str<'r>(rec: &'r [u8], f: &Field) -> Option<&'r [u8]> {
    let raw = match f.kind {
        FieldKind::CharArray => rec.get(f.offset..f.offset.checked_add(f.size)?)?,
        FieldKind::TailString => rec.get(f.offset..)?,
        FieldKind::DataLoc => {
            let loc = read_uint(rec, f.offset, 4)? as u32;
            let off = (loc & 0xffff) as usize;
            let len = (loc >> 16) as usize;
            rec.get(off..off + len)?
        }
        FieldKind::Int | FieldKind::Opaque => return None,
    };
    Some(until_nul(raw))
}

/// `raw` up to its first NUL, looked for eight bytes at a time (comms and
/// other char arrays are read on every event).
#[inline]
pub(crate) fn until_nul(raw: &[u8]) -> &[u8] {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut words = raw.chunks_exact(8);
    let mut base = 0;
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        let v = u64::from_le_bytes(b);
        // The lowest set bit of this mask marks the first zero byte (the
        // classic haszero test; borrows only run upwards, past it).
        let zero = v.wrapping_sub(LO) & !v & HI;
        if zero != 0 {
            return &raw[..base + (zero.trailing_zeros() / 8) as usize];
        }
        base += 8;
    }
    let tail = words.remainder();
    let end = tail.iter().position(|&c| c == 0).unwrap_or(tail.len());
    &raw[..base + end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The word-at-a-time NUL search agrees with a byte scan, wherever
        /// the NULs (and bytes ≥ 0x80, which upset naive versions) are.
        #[test]
        fn until_nul_matches_a_byte_scan(
            raw in proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), Just(0x80u8), Just(0xffu8), any::<u8>()], 0..40)
        ) {
            let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
            prop_assert_eq!(until_nul(&raw), &raw[..end]);
        }
    }

    const HEADER_PAGE: &str = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n";

    #[test]
    fn header_page_layout() {
        let l = parse_header_page(HEADER_PAGE).expect("parses");
        assert_eq!(
            l,
            PageLayout {
                timestamp_offset: 0,
                commit_offset: 8,
                commit_size: 8,
                data_offset: 16,
                data_size: 4080
            }
        );
        assert_eq!(l.page_size(), 4096);
    }

    #[test]
    fn field_kinds() {
        let text = "name: x\nID: 7\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\tfield:__data_loc char[] f;\toffset:24;\tsize:4;\tsigned:0;\n\tfield:char buf[];\toffset:28;\tsize:0;\tsigned:0;\n\tfield:unsigned long args[6];\toffset:32;\tsize:48;\tsigned:0;\n\tfield:int v;\toffset:80;\tsize:4;\tsigned:1;\n";
        let e = parse_event_format("g", text).expect("parses");
        assert_eq!(e.id, 7);
        assert_eq!(e.common.len(), 2);
        let kinds: Vec<_> = e.fields.iter().map(|f| (f.name.as_str(), f.kind)).collect();
        assert_eq!(
            kinds,
            [
                ("comm", FieldKind::CharArray),
                ("f", FieldKind::DataLoc),
                ("buf", FieldKind::TailString),
                ("args", FieldKind::Opaque),
                ("v", FieldKind::Int)
            ]
        );
        let v = e.field("v").expect("v");
        let mut rec = [0u8; 84];
        rec[80..84].copy_from_slice(&(-5i32).to_le_bytes());
        assert_eq!(read_int(&rec, v), Some(-5));
    }

    #[test]
    fn strings() {
        let mut rec = vec![0u8; 40];
        rec[8..11].copy_from_slice(b"abc");
        let loc: u32 = (3 << 16) | 30;
        rec[24..28].copy_from_slice(&loc.to_le_bytes());
        rec[30..33].copy_from_slice(b"xy\0");
        let arr = Field {
            name: "c".into(),
            type_name: "char".into(),
            offset: 8,
            size: 16,
            signed: false,
            kind: FieldKind::CharArray,
        };
        let dl = Field {
            kind: FieldKind::DataLoc,
            offset: 24,
            size: 4,
            ..arr.clone()
        };
        assert_eq!(read_str(&rec, &arr), Some(&b"abc"[..]));
        assert_eq!(read_str(&rec, &dl), Some(&b"xy"[..]));
        // A data_loc pointing outside the record is refused, not read.
        rec[24..28].copy_from_slice(&((100u32 << 16) | 30).to_le_bytes());
        assert_eq!(read_str(&rec, &dl), None);
    }
}
