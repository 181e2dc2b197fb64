//! Base-128 varints: seven bits a byte, least significant group first, the
//! high bit set on every byte but the last.
//!
//! ```text
//!  300 = 0b10_0101100  →  1010_1100  0000_0010
//!                          └ 0x80|0x2c └ 0x02
//! ```
//!
//! Decoding follows protobuf's rules exactly (checked against prost by the
//! tests): at most ten bytes, and the tenth may only hold the 64th bit.

/// Most bytes a varint of a `u64` takes.
pub(crate) const MAX_LEN: usize = 10;

/// Bytes of a four-byte redundant varint (see [`put_redundant4`]).
pub(crate) const REDUNDANT4_LEN: usize = 4;

/// Largest value a four-byte redundant varint holds.
pub(crate) const REDUNDANT4_MAX: u32 = (1 << 28) - 1;

/// Bytes `v` takes as a minimal varint.
#[inline(always)]
pub(crate) const fn len(v: u64) -> usize {
    // One byte per 7 significant bits, at least one.
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// [`len`] of a `usize` (lengths of buffers and packets).
#[inline(always)]
pub(crate) const fn len_usize(v: usize) -> usize {
    len(v as u64)
}

/// Writes `v` as a minimal varint at the start of `out`; the bytes used, or
/// `None` (nothing useful written) when `out` is too short.
#[inline]
pub(crate) fn put(out: &mut [u8], mut v: u64) -> Option<usize> {
    let mut i = 0;
    loop {
        let byte = out.get_mut(i)?;
        if v < 0x80 {
            *byte = v as u8;
            return Some(i + 1);
        }
        *byte = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
}

/// [`put`] into a window known to hold any varint: the loop is bounded by
/// the window, so it runs without a length check per byte.
#[inline(always)]
pub(crate) fn put_max(out: &mut [u8; MAX_LEN], mut v: u64) -> usize {
    for (i, b) in out.iter_mut().enumerate().take(MAX_LEN - 1) {
        if v < 0x80 {
            *b = v as u8;
            return i + 1;
        }
        *b = (v as u8) | 0x80;
        v >>= 7;
    }
    // The tenth byte holds the 64th bit.
    out[MAX_LEN - 1] = v as u8;
    MAX_LEN
}

/// Appends `v` as a minimal varint; the bytes it took.
#[inline]
pub(crate) fn push(out: &mut Vec<u8>, mut v: u64) -> usize {
    // Byte pushes: cheaper than staging and copying a 1–3 byte slice.
    let mut n = 1;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
        n += 1;
    }
    out.push(v as u8);
    n
}

/// `v` as a minimal varint in a fixed array, with its length.
#[inline]
pub(crate) fn encode(v: u64) -> ([u8; MAX_LEN], usize) {
    let mut b = [0u8; MAX_LEN];
    let n = put(&mut b, v).unwrap_or(MAX_LEN);
    (b, n)
}

/// Writes `v` as a varint of exactly `width` bytes (a redundant varint when
/// wider than needed) into `out[..width]`; padding packets use it to hit any
/// length exactly. The caller keeps `len_usize(v) <= width <= MAX_LEN`.
pub(crate) fn put_width(out: &mut [u8], v: usize, width: usize) {
    for (i, b) in out[..width].iter_mut().enumerate() {
        let more = i + 1 < width;
        *b = ((v >> (7 * i)) & 0x7F) as u8 | if more { 0x80 } else { 0 };
    }
}

/// Writes `v` (at most [`REDUNDANT4_MAX`]) as a varint of exactly four bytes,
/// padding with continuation bytes: protobuf accepts non-minimal varints, so
/// a length can be reserved before the body it measures is written.
#[inline]
pub(crate) fn put_redundant4(out: &mut [u8; REDUNDANT4_LEN], v: u32) {
    out[0] = (v as u8 & 0x7f) | 0x80;
    out[1] = ((v >> 7) as u8 & 0x7f) | 0x80;
    out[2] = ((v >> 14) as u8 & 0x7f) | 0x80;
    out[3] = (v >> 21) as u8 & 0x7f;
}

/// Why a varint could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VarintError {
    /// The data ends inside the varint.
    Truncated,
    /// More than ten bytes, or a tenth byte with bits past the 64th.
    Overlong,
}

/// Reads the varint at the start of `data`: its value and length.
#[inline]
pub(crate) fn decode(data: &[u8]) -> Result<(u64, usize), VarintError> {
    let mut v = 0u64;
    for i in 0..MAX_LEN {
        let Some(&b) = data.get(i) else {
            return Err(VarintError::Truncated);
        };
        if i == MAX_LEN - 1 && b > 1 {
            return Err(VarintError::Overlong);
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((v, i + 1));
        }
    }
    Err(VarintError::Overlong)
}

/// Reads the varint at `*pos` and moves past it (`*pos` is left alone on
/// error).
#[inline]
pub(crate) fn read(data: &[u8], pos: &mut usize) -> Result<u64, VarintError> {
    let (v, n) = decode(data.get(*pos..).unwrap_or_default())?;
    *pos += n;
    Ok(v)
}

/// How many varints end in `packed` (the values of a packed repeated
/// field), without decoding them.
#[inline]
pub(crate) fn count(packed: &[u8]) -> usize {
    packed.iter().filter(|&&b| b & 0x80 == 0).count()
}

/// `sint32`/`sint64` zigzag: small magnitudes of either sign stay short.
#[inline]
#[cfg(test)]
pub(crate) const fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// The inverse of [`zigzag`].
#[inline]
#[cfg(test)]
pub(crate) const fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lengths_at_the_boundaries() {
        for (v, n) in [
            (0u64, 1),
            (127, 1),
            (128, 2),
            (16383, 2),
            (16384, 3),
            (u64::MAX, 10),
        ] {
            assert_eq!(len(v), n, "{v}");
            let mut b = [0u8; 10];
            assert_eq!(put(&mut b, v), Some(n));
        }
        assert_eq!(put(&mut [0u8; 1], 300), None);
    }

    #[test]
    fn malformed_varints_are_errors() {
        assert_eq!(decode(&[]), Err(VarintError::Truncated));
        assert_eq!(decode(&[0x80, 0x80]), Err(VarintError::Truncated));
        // Ten bytes whose last holds more than the 64th bit.
        let mut over = [0xffu8; 10];
        over[9] = 0x02;
        assert_eq!(decode(&over), Err(VarintError::Overlong));
        assert_eq!(decode(&[0x80; 11]), Err(VarintError::Overlong));
        over[9] = 0x01;
        assert_eq!(decode(&over), Ok((u64::MAX, 10)));
        let mut pos = 1;
        assert_eq!(read(&[0, 0x80], &mut pos), Err(VarintError::Truncated));
        assert_eq!(pos, 1);
    }

    #[test]
    fn redundant_varints_read_back() {
        for v in [0, 1, 127, 128, 300, REDUNDANT4_MAX] {
            let mut b = [0u8; 4];
            put_redundant4(&mut b, v);
            assert_eq!(decode(&b), Ok((u64::from(v), 4)));
        }
    }

    proptest! {
        // Oracle: prost's encoder and decoder.
        #[test]
        fn agrees_with_prost(v in any::<u64>(), shift in 0u32..64) {
            for v in [v, v >> shift] {
                let mut want = Vec::new();
                prost::encoding::encode_varint(v, &mut want);
                let mut got = Vec::new();
                prop_assert_eq!(push(&mut got, v), want.len());
                prop_assert_eq!(&got, &want);
                prop_assert_eq!(len(v), prost::encoding::encoded_len_varint(v));
                let (arr, n) = encode(v);
                prop_assert_eq!(&arr[..n], &want[..]);
                let mut window = [0u8; MAX_LEN];
                let n = put_max(&mut window, v);
                prop_assert_eq!(&window[..n], &want[..]);
                prop_assert_eq!(decode(&want), Ok((v, want.len())));
            }
        }

        #[test]
        fn decodes_any_bytes_as_prost_does(bytes in proptest::collection::vec(any::<u8>(), 0..14)) {
            let mut buf: &[u8] = &bytes;
            let want = prost::encoding::decode_varint(&mut buf).ok().map(|v| (v, bytes.len() - buf.len()));
            prop_assert_eq!(decode(&bytes).ok(), want);
        }

        #[test]
        fn counts_packed_values(values in proptest::collection::vec(any::<u64>(), 0..20)) {
            let mut packed = Vec::new();
            for v in &values {
                prost::encoding::encode_varint(*v, &mut packed);
            }
            prop_assert_eq!(count(&packed), values.len());
        }

        #[test]
        fn zigzag_round_trips(v in any::<i64>()) {
            prop_assert_eq!(unzigzag(zigzag(v)), v);
            let mut want = Vec::new();
            prost::encoding::sint64::encode(1, &v, &mut want);
            let mut got = vec![0x08];
            push(&mut got, zigzag(v));
            prop_assert_eq!(got, want);
        }
    }
}
