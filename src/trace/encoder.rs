//! A small protobuf writer that encodes straight into a caller's byte slice
//! (a ring-buffer chunk), with no allocation: the hot-path encoder of data
//! sources. Nested messages reserve a 4-byte redundant varint for their
//! length and patch it when they end, as protobuf allows non-minimal varints.
//!
//! ```text
//!  tag | len (4 bytes: 0x80|b0 0x80|b1 0x80|b2 b3) | nested fields ...
//! ```
//!
//! Every write checks bounds; once a write does not fit the encoder is marked
//! overflowed and further writes are ignored, so callers check once at the end
//! ([`ProtoEncoder::finish`]) instead of after every field. A message known to
//! be small (a typed ftrace event) is written in a [`Window`] instead: room is
//! checked once for all of it.

use crate::wire::{PackedKey, WireType, key, varint};

/// Bytes reserved for the length of a nested message.
pub(crate) const NESTED_LEN_BYTES: usize = varint::REDUNDANT4_LEN;
/// Largest length a 4-byte redundant varint can hold.
pub(crate) const MAX_NESTED_LEN: usize = varint::REDUNDANT4_MAX as usize;

/// The encoder ran out of room (or a nested message outgrew 2^28 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("encoded message does not fit in the space given")]
pub struct Overflow;

/// Position of an open nested message, returned by [`ProtoEncoder::begin_nested`].
#[derive(Clone, Copy, Debug)]
#[must_use = "a nested message must be closed with end_nested"]
pub struct Nested(usize);

/// An open nested message with a one-byte length (see [`ProtoEncoder::begin_short`]).
#[must_use = "close it with end_short"]
pub struct Short(usize);

/// Encodes protobuf fields into `buf`, starting at offset 0.
pub struct ProtoEncoder<'a> {
    buf: &'a mut [u8],
    pos: usize,
    overflow: bool,
}

impl<'a> ProtoEncoder<'a> {
    /// An encoder writing from the start of `buf` (typically the free part
    /// of a chunk); the message may take at most `buf.len()` bytes.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self {
            buf,
            pos: 0,
            overflow: false,
        }
    }

    /// Bytes written so far.
    #[inline]
    pub fn len(&self) -> usize {
        self.pos
    }

    /// Whether nothing has been written yet.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }

    /// Bytes still free.
    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Whether some write did not fit.
    #[inline]
    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// The encoded length, or [`Overflow`] if any write did not fit.
    pub fn finish(self) -> Result<usize, Overflow> {
        if self.overflow {
            Err(Overflow)
        } else {
            Ok(self.pos)
        }
    }

    /// Rewinds to `len` bytes (drops what was written after it), clearing an
    /// overflow: lets a caller try to add an element and back out if it fails.
    pub fn truncate(&mut self, len: usize) {
        if len <= self.pos {
            self.pos = len;
            self.overflow = false;
        }
    }

    /// Every field writes at least one: kept inline, its rare tail apart.
    #[inline(always)]
    fn varint(&mut self, v: u64) {
        // Bytes past the varint in the window are left as scratch: nothing
        // before `pos` is touched, and what lies after it is not output.
        if !self.overflow
            && let Some(w) = self.buf[self.pos..].first_chunk_mut::<{ varint::MAX_LEN }>()
        {
            self.pos += varint::put_max(w, v);
            return;
        }
        self.varint_near_end(v);
    }

    /// [`varint`](Self::varint) within ten bytes of the end, or overflowed.
    #[cold]
    fn varint_near_end(&mut self, v: u64) {
        if self.overflow {
            return;
        }
        match varint::put(&mut self.buf[self.pos..], v) {
            Some(n) => self.pos += n,
            None => self.overflow = true,
        }
    }

    #[inline]
    fn bytes_raw(&mut self, b: &[u8]) {
        if self.overflow {
            return;
        }
        match self.buf.get_mut(self.pos..self.pos + b.len()) {
            Some(dst) => {
                dst.copy_from_slice(b);
                self.pos += b.len();
            }
            None => self.overflow = true,
        }
    }

    /// A field key alone; the caller writes the value that its wire type
    /// announces.
    #[inline]
    pub fn tag(&mut self, field: u32, wt: WireType) {
        self.varint(key(field, wt));
    }

    /// A key encoded beforehand: five bytes copied where there is room
    /// (a fixed-size copy), the key's length kept.
    #[inline(always)]
    fn packed_key(&mut self, k: &PackedKey) {
        if self.overflow {
            return;
        }
        let (bytes, n) = k.padded();
        if let Some(w) = self.buf[self.pos..].first_chunk_mut::<5>() {
            *w = *bytes;
            self.pos += n;
            return;
        }
        self.bytes_raw(k.as_bytes());
    }

    /// A varint field under a key encoded beforehand (hot paths).
    #[inline]
    pub(crate) fn uint_at(&mut self, k: &PackedKey, v: u64) {
        self.packed_key(k);
        self.varint(v);
    }

    /// A `bytes`/`string` field under a key encoded beforehand.
    #[inline]
    pub(crate) fn bytes_at(&mut self, k: &PackedKey, b: &[u8]) {
        self.packed_key(k);
        self.varint(b.len() as u64);
        self.bytes_raw(b);
    }

    /// A `bytes`/`string` field of the first `n` (≤ 16) bytes of `word`
    /// (short text such as a comm): with room, all 16 are copied at once
    /// and `n` kept.
    #[inline]
    pub(crate) fn bytes16_at(&mut self, k: &PackedKey, word: &[u8; 16], n: usize) {
        self.packed_key(k);
        self.varint(n as u64);
        if self.overflow {
            return;
        }
        if let Some(w) = self.buf[self.pos..].first_chunk_mut::<16>() {
            *w = *word;
            self.pos += n.min(16);
            return;
        }
        self.bytes_raw(&word[..n.min(16)]);
    }

    /// [`begin_short`](Self::begin_short) under a key encoded beforehand.
    #[inline]
    pub(crate) fn begin_short_at(&mut self, k: &PackedKey) -> Short {
        self.packed_key(k);
        let at = self.pos;
        self.bytes_raw(&[0]);
        Short(at)
    }

    /// A `uint32`/`uint64`/`bool`/enum field, or an `int32`/`int64` holding a
    /// non-negative value.
    #[inline]
    pub(crate) fn uint(&mut self, field: u32, v: u64) {
        self.tag(field, WireType::Varint);
        self.varint(v);
    }

    /// An `int32`/`int64` field (negative values take 10 bytes, as protobuf
    /// requires for these types).
    #[inline]
    pub fn int(&mut self, field: u32, v: i64) {
        self.uint(field, v as u64);
    }

    /// A `bool` field, as a one-byte varint.
    #[inline]
    pub fn bool(&mut self, field: u32, v: bool) {
        self.uint(field, v as u64);
    }

    #[inline]
    pub(crate) fn fixed64(&mut self, field: u32, v: u64) {
        self.tag(field, WireType::Fixed64);
        self.bytes_raw(&v.to_le_bytes());
    }

    #[inline]
    pub(crate) fn double(&mut self, field: u32, v: f64) {
        self.fixed64(field, v.to_bits());
    }

    /// A `bytes` or `string` field.
    #[inline]
    pub fn bytes(&mut self, field: u32, b: &[u8]) {
        self.tag(field, WireType::Len);
        self.varint(b.len() as u64);
        self.bytes_raw(b);
    }

    /// A `string` field: the UTF-8 bytes, length-delimited.
    #[inline]
    pub fn string(&mut self, field: u32, s: &str) {
        self.bytes(field, s.as_bytes());
    }

    /// Raw, already-encoded bytes (for example a pre-encoded field).
    #[inline]
    pub fn raw(&mut self, b: &[u8]) {
        self.bytes_raw(b);
    }

    /// Opens a nested message (or a packed repeated field) under `field`.
    #[inline]
    pub(crate) fn begin_nested(&mut self, field: u32) -> Nested {
        self.tag(field, WireType::Len);
        let at = self.pos;
        self.bytes_raw(&[0; NESTED_LEN_BYTES]);
        Nested(at)
    }

    /// Closes a nested message, patching its length.
    #[inline]
    pub(crate) fn end_nested(&mut self, n: Nested) {
        if self.overflow {
            return;
        }
        let len = self.pos - n.0 - NESTED_LEN_BYTES;
        if len > MAX_NESTED_LEN {
            self.overflow = true;
            return;
        }
        let slot: &mut [u8; 4] = match (&mut self.buf[n.0..n.0 + NESTED_LEN_BYTES]).try_into() {
            Ok(s) => s,
            Err(_) => {
                self.overflow = true;
                return;
            }
        };
        varint::put_redundant4(slot, len as u32);
    }

    /// Opens a nested message expected to stay under 128 bytes: its length
    /// gets one byte. Close it with [`end_short`](Self::end_short), which
    /// moves a body that grew longer to make room for a longer length (rare,
    /// so small ftrace events are encoded without the 3 wasted bytes of a
    /// four-byte length and without a copy).
    #[inline]
    pub(crate) fn begin_short(&mut self, field: u32) -> Short {
        self.tag(field, WireType::Len);
        let at = self.pos;
        self.bytes_raw(&[0]);
        Short(at)
    }

    /// Closes a message opened with [`begin_short`](Self::begin_short).
    /// Positions taken inside it are stale afterwards (its body may move).
    #[inline]
    pub(crate) fn end_short(&mut self, n: Short) {
        if self.overflow {
            return;
        }
        let body = n.0 + 1;
        let len = self.pos - body;
        if len < 0x80 {
            self.buf[n.0] = len as u8;
            return;
        }
        self.end_short_long(n.0, len);
    }

    #[cold]
    fn end_short_long(&mut self, at: usize, len: usize) {
        let (hdr, n) = varint::encode(len as u64);
        let extra = n - 1;
        if self.remaining() < extra {
            self.overflow = true;
            return;
        }
        let body = at + 1;
        self.buf.copy_within(body..self.pos, body + extra);
        self.buf[at..at + n].copy_from_slice(&hdr[..n]);
        self.pos += extra;
    }
}

/// Bytes a [`Window`] may take: every message in it has a one-byte length.
pub(crate) const WINDOW_MAX_LEN: usize = 127;
/// The window's span, the room [`ProtoEncoder::window`] needs: its limit
/// plus the widest single write (16 bytes of text), so that no write needs
/// a check of its own.
pub(crate) const WINDOW_SPAN: usize = WINDOW_MAX_LEN + 1 + 16;

/// Room for one small message, checked once ([`ProtoEncoder::window`]): a
/// caller that knows its message takes at most [`WINDOW_MAX_LEN`] bytes
/// writes it field by field with no bounds or overflow test per field.
///
/// Each write lands at the window's position masked to its first 128 bytes,
/// so it stays in the span whatever the caller wrote; a caller that wrote
/// more than the limit gets an overflow at [`close`](Window::close), never
/// bytes outside the window.
pub struct Window<'e> {
    buf: &'e mut [u8; WINDOW_SPAN],
    len: usize,
    end: &'e mut usize,
    overflow: &'e mut bool,
}

impl Window<'_> {
    /// Where the next write starts: `len` while within the limit.
    #[inline(always)]
    fn at(&self) -> usize {
        self.len & WINDOW_MAX_LEN
    }

    #[inline(always)]
    fn key(&mut self, k: &PackedKey) {
        let (bytes, n) = k.padded();
        let at = self.at();
        if let Some(w) = self.buf[at..].first_chunk_mut::<5>() {
            *w = *bytes;
        }
        self.len += n;
    }

    #[inline(always)]
    fn varint(&mut self, v: u64) {
        let at = self.at();
        if let Some(w) = self.buf[at..].first_chunk_mut::<{ varint::MAX_LEN }>() {
            self.len += varint::put_max(w, v);
        }
    }

    #[inline(always)]
    fn open(&mut self) -> Short {
        let at = self.at();
        self.len += 1;
        Short(at)
    }

    /// Keeps what was written; an overflow if it passed the limit.
    #[inline(always)]
    pub fn close(self) {
        if self.len > WINDOW_MAX_LEN {
            *self.overflow = true;
        } else {
            *self.end += self.len;
        }
    }
}

/// The writes of a message whose nested parts have one-byte lengths (a
/// typed ftrace event), by the checked [`ProtoEncoder`] or by a [`Window`]:
/// code written once against it emits the same bytes through either.
pub(crate) trait ShortWriter {
    /// Writes only bounded fields: at most 16 bytes of text each (a
    /// [`Window`]); callers keep longer text for the checked encoder.
    const BOUNDED: bool;
    /// Opens a nested message under `field`.
    fn begin(&mut self, field: u32) -> Short;
    /// [`begin`](Self::begin) under a key encoded beforehand.
    fn begin_at(&mut self, k: &PackedKey) -> Short;
    /// Closes a message opened by this writer.
    fn end(&mut self, s: Short);
    /// A varint field.
    fn uint(&mut self, field: u32, v: u64);
    /// A varint field under a key encoded beforehand.
    fn uint_at(&mut self, k: &PackedKey, v: u64);
    /// A `bytes` field of the first `n` (≤ 16) bytes of `word`.
    fn bytes16_at(&mut self, k: &PackedKey, word: &[u8; 16], n: usize);
    /// A `bytes` field (at most 16 bytes where [`BOUNDED`](Self::BOUNDED)).
    fn bytes_at(&mut self, k: &PackedKey, b: &[u8]);
}

impl ShortWriter for ProtoEncoder<'_> {
    const BOUNDED: bool = false;
    #[inline(always)]
    fn begin(&mut self, field: u32) -> Short {
        self.begin_short(field)
    }
    #[inline(always)]
    fn begin_at(&mut self, k: &PackedKey) -> Short {
        self.begin_short_at(k)
    }
    #[inline(always)]
    fn end(&mut self, s: Short) {
        self.end_short(s)
    }
    #[inline(always)]
    fn uint(&mut self, field: u32, v: u64) {
        ProtoEncoder::uint(self, field, v)
    }
    #[inline(always)]
    fn uint_at(&mut self, k: &PackedKey, v: u64) {
        ProtoEncoder::uint_at(self, k, v)
    }
    #[inline(always)]
    fn bytes16_at(&mut self, k: &PackedKey, word: &[u8; 16], n: usize) {
        ProtoEncoder::bytes16_at(self, k, word, n)
    }
    #[inline(always)]
    fn bytes_at(&mut self, k: &PackedKey, b: &[u8]) {
        ProtoEncoder::bytes_at(self, k, b)
    }
}

impl ShortWriter for Window<'_> {
    const BOUNDED: bool = true;

    /// `field` < 16: its key is one byte.
    #[inline(always)]
    fn begin(&mut self, field: u32) -> Short {
        self.varint(key(field, WireType::Len));
        self.open()
    }

    #[inline(always)]
    fn begin_at(&mut self, k: &PackedKey) -> Short {
        self.key(k);
        self.open()
    }

    #[inline(always)]
    fn end(&mut self, s: Short) {
        let body = (self.len - s.0 - 1) & WINDOW_MAX_LEN;
        self.buf[s.0 & WINDOW_MAX_LEN] = body as u8;
    }

    #[inline(always)]
    fn uint(&mut self, field: u32, v: u64) {
        self.varint(key(field, WireType::Varint));
        self.varint(v);
    }

    #[inline(always)]
    fn uint_at(&mut self, k: &PackedKey, v: u64) {
        self.key(k);
        self.varint(v);
    }

    #[inline(always)]
    fn bytes16_at(&mut self, k: &PackedKey, word: &[u8; 16], n: usize) {
        self.key(k);
        let n = n.min(16);
        self.varint(n as u64);
        let at = self.at();
        if let Some(w) = self.buf[at..].first_chunk_mut::<16>() {
            *w = *word;
        }
        self.len += n;
    }

    /// Cut at 16 bytes.
    fn bytes_at(&mut self, k: &PackedKey, b: &[u8]) {
        let mut word = [0u8; 16];
        let n = b.len().min(16);
        word[..n].copy_from_slice(&b[..n]);
        self.bytes16_at(k, &word, n);
    }
}

impl ProtoEncoder<'_> {
    /// A [`Window`] at the end of what is written, when the encoder has
    /// room for its whole span and has not overflowed. Dropping it without
    /// [`close`](Window::close) keeps nothing.
    #[inline(always)]
    pub fn window(&mut self) -> Option<Window<'_>> {
        if self.overflow {
            return None;
        }
        let buf = self
            .buf
            .get_mut(self.pos..)?
            .first_chunk_mut::<WINDOW_SPAN>()?;
        Some(Window {
            buf,
            len: 0,
            end: &mut self.pos,
            overflow: &mut self.overflow,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The pre-keyed writes give the bytes (and the overflow) of the
        /// plain ones, wherever the buffer ends.
        #[test]
        fn packed_key_writes_match_plain_writes(
            field in 1u32..2000,
            v in any::<u64>(),
            text in proptest::collection::vec(1u8..0x80, 0..=16),
            room in 0usize..48,
        ) {
            let mut word = [0u8; 16];
            word[..text.len()].copy_from_slice(&text);
            let k = PackedKey::new(field, WireType::Varint);
            let kl = PackedKey::new(field, WireType::Len);
            let mut a = vec![0xeeu8; room];
            let mut b = vec![0xeeu8; room];
            let mut ea = ProtoEncoder::new(&mut a);
            let mut eb = ProtoEncoder::new(&mut b);
            ea.uint(field, v);
            eb.uint_at(&k, v);
            ea.bytes(field, &text);
            eb.bytes16_at(&kl, &word, text.len());
            ea.bytes(field + 1, &text);
            eb.bytes_at(&PackedKey::new(field + 1, WireType::Len), &text);
            let s1 = ea.begin_short(field);
            let s2 = eb.begin_short_at(&kl);
            ea.end_short(s1);
            eb.end_short(s2);
            let (ra, rb) = (ea.finish(), eb.finish());
            prop_assert_eq!(ra, rb);
            if let Ok(n) = ra {
                prop_assert_eq!(&a[..n], &b[..n]);
            }
        }
    }

    /// One message of every kind of write, through either writer.
    fn sample<W: ShortWriter>(
        w: &mut W,
        ts: u64,
        vals: &[u64],
        word: &[u8; 16],
        text: &[u8],
        kv: &PackedKey,
        kl: &PackedKey,
    ) {
        let o = w.begin(2);
        w.uint(1, ts);
        let i = w.begin_at(kl);
        for &v in vals {
            w.uint_at(kv, v);
        }
        w.bytes16_at(kl, word, text.len());
        w.bytes_at(kl, text);
        w.end(i);
        w.end(o);
    }

    proptest! {
        /// A window writes the bytes of the checked writes, nested lengths
        /// included, after whatever the encoder held before it.
        #[test]
        fn window_writes_match_checked_writes(
            before in 0usize..40,
            field in 1u32..2000,
            ts in any::<u64>(),
            vals in proptest::collection::vec(any::<u64>(), 0..4),
            text in proptest::collection::vec(any::<u8>(), 0..=16),
        ) {
            let mut word = [0u8; 16];
            word[..text.len()].copy_from_slice(&text);
            let kv = PackedKey::new(field, WireType::Varint);
            let kl = PackedKey::new(field + 1, WireType::Len);
            let mut a = vec![0u8; 512];
            let mut b = vec![0u8; 512];
            let mut ea = ProtoEncoder::new(&mut a);
            let mut eb = ProtoEncoder::new(&mut b);
            for e in [&mut ea, &mut eb] {
                e.raw(&vec![0x5a; before]);
            }
            sample(&mut ea, ts, &vals, &word, &text, &kv, &kl);
            let mut w = eb.window().expect("room");
            sample(&mut w, ts, &vals, &word, &text, &kv, &kl);
            w.close();
            let (ra, rb) = (ea.finish(), eb.finish());
            prop_assert_eq!(ra, rb);
            let n = ra.expect("fits");
            prop_assert_eq!(&a[..n], &b[..n]);
        }
    }

    /// A window needs room for its whole span; one written past its limit
    /// overflows at close, and one dropped unclosed keeps nothing.
    #[test]
    fn window_room_limit_and_drop() {
        let mut small = [0u8; WINDOW_SPAN - 1];
        assert!(ProtoEncoder::new(&mut small).window().is_none());
        let mut buf = [0u8; 300];
        let mut e = ProtoEncoder::new(&mut buf);
        e.uint(1, 1);
        {
            let mut w = e.window().expect("room");
            w.uint(1, 7);
        }
        assert_eq!(e.len(), 2, "an unclosed window keeps nothing");
        let mut w = e.window().expect("room");
        for _ in 0..13 {
            w.uint(1, u64::MAX);
        }
        w.close();
        assert!(e.overflowed(), "143 bytes is past the limit");
        assert!(e.window().is_none(), "no window after an overflow");
    }

    #[test]
    fn nested_and_overflow() {
        let mut buf = [0u8; 64];
        let mut e = ProtoEncoder::new(&mut buf);
        let n = e.begin_nested(1);
        e.uint(2, 300);
        e.string(3, "ab");
        e.end_nested(n);
        let len = e.finish().expect("fits");
        // tag 0x0a, len 4 bytes redundant (7), then 0x10 0xac 0x02, 0x1a 0x02 'a' 'b'
        assert_eq!(
            &buf[..len],
            &[
                0x0a, 0x87, 0x80, 0x80, 0x00, 0x10, 0xac, 0x02, 0x1a, 2, b'a', b'b'
            ]
        );
        // Short messages: one length byte, a long body moved to fit more.
        let mut buf = [0u8; 200];
        let mut e = ProtoEncoder::new(&mut buf);
        let outer = e.begin_short(1);
        let inner = e.begin_short(2);
        e.uint(1, 5);
        e.end_short(inner);
        e.uint(3, 7);
        e.end_short(outer);
        let len = e.finish().expect("fits");
        assert_eq!(&buf[..len], &[0x0a, 6, 0x12, 2, 0x08, 5, 0x18, 7]);
        let mut e = ProtoEncoder::new(&mut buf);
        let outer = e.begin_short(1);
        e.bytes(2, &[1u8; 130]);
        e.end_short(outer);
        e.uint(3, 1);
        let len = e.finish().expect("fits");
        // 133-byte body: length 0x85 0x01, then the body, then field 3.
        assert_eq!(len, 1 + 2 + 133 + 2);
        assert_eq!(&buf[..6], &[0x0a, 0x85, 0x01, 0x12, 0x82, 0x01]);
        assert_eq!(&buf[len - 3..len], &[1, 0x18, 1]);
        // No room to grow the length: overflow, not a torn message.
        let mut tight = [0u8; 134];
        let mut e = ProtoEncoder::new(&mut tight);
        let n = e.begin_short(1);
        e.bytes(2, &[1u8; 129]);
        e.end_short(n);
        assert!(e.overflowed());
        let mut small = [0u8; 3];
        let mut e = ProtoEncoder::new(&mut small);
        e.string(1, "hello");
        assert!(e.overflowed());
        assert_eq!(e.finish(), Err(Overflow));
    }
}
