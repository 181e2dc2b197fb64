//! Field keys: `field_number << 3 | wire_type`, itself a varint.
//!
//! ```text
//!  key = (number << 3) | wire type     0 varint   1 fixed64   2 length-delimited
//!                                      3 group start   4 group end   5 fixed32
//! ```

use super::varint;

/// Smallest valid field number.
pub(crate) const MIN_FIELD: u32 = 1;
/// Largest valid field number (keys fit in 32 bits).
pub(crate) const MAX_FIELD: u32 = (1 << 29) - 1;

/// Protobuf wire types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WireType {
    /// A varint: integers, bools and enums.
    Varint = 0,
    /// Eight little-endian bytes.
    Fixed64 = 1,
    /// A varint length, then that many bytes: strings, bytes, nested
    /// messages and packed repeated fields.
    Len = 2,
    /// Opens a group (a deprecated nested message without a length).
    StartGroup = 3,
    /// Closes the group its field number opened.
    EndGroup = 4,
    /// Four little-endian bytes.
    Fixed32 = 5,
}

impl WireType {
    /// The wire type of a key's low three bits (`None` for 6 and 7).
    pub(crate) const fn from_bits(bits: u8) -> Option<WireType> {
        Some(match bits {
            0 => WireType::Varint,
            1 => WireType::Fixed64,
            2 => WireType::Len,
            3 => WireType::StartGroup,
            4 => WireType::EndGroup,
            5 => WireType::Fixed32,
            _ => return None,
        })
    }
}

/// The key of `field` with wire type `wt`.
#[inline(always)]
pub const fn key(field: u32, wt: WireType) -> u64 {
    ((field as u64) << 3) | wt as u64
}

/// Bytes the key of `field` takes.
#[inline(always)]
pub const fn key_len(field: u32) -> usize {
    varint::len((field as u64) << 3)
}

/// The single byte of a key that fits in one (fields 1–15), for byte-level
/// matching such as the `0x0A` of `Trace.packet`.
pub(crate) const fn key_byte(field: u32, wt: WireType) -> u8 {
    assert!(field >= MIN_FIELD && field < 16, "a one-byte key");
    key(field, wt) as u8
}

/// A field's key, varint-encoded once: hot encoders copy its bytes instead
/// of encoding the same key for every message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedKey {
    bytes: [u8; 5],
    len: u8,
}

impl PackedKey {
    /// The key of `field` (at most [`MAX_FIELD`]) with wire type `wt`.
    pub fn new(field: u32, wt: WireType) -> Self {
        let mut bytes = [0u8; 5];
        // A key of at most 32 bits takes at most five bytes.
        let len = varint::put(&mut bytes, key(field.min(MAX_FIELD), wt)).unwrap_or(5) as u8;
        Self { bytes, len }
    }

    /// The encoded key.
    #[inline(always)]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// The encoded key zero-padded to five bytes, and its length: a writer
    /// with room copies all five (a fixed-size copy) and keeps `len`.
    #[inline(always)]
    pub fn padded(&self) -> (&[u8; 5], usize) {
        (&self.bytes, self.len as usize)
    }
}

/// Why a key is not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// Field number 0, or a key past 32 bits.
    BadNumber,
    /// Wire type 6 or 7.
    BadWireType(u8),
}

/// Splits a decoded key into its field number and wire type.
#[inline]
pub(crate) fn split(key: u64) -> Result<(u32, WireType), KeyError> {
    let key = u32::try_from(key).map_err(|_| KeyError::BadNumber)?;
    let bits = (key & 7) as u8;
    let wt = WireType::from_bits(bits).ok_or(KeyError::BadWireType(bits))?;
    let number = key >> 3;
    if number < MIN_FIELD {
        return Err(KeyError::BadNumber);
    }
    Ok((number, wt))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_keys() {
        assert_eq!(key_byte(1, WireType::Len), 0x0A);
        assert_eq!(key(900, WireType::Len), 7202);
        assert_eq!(split(0x0A), Ok((1, WireType::Len)));
        assert_eq!(split(0x07), Err(KeyError::BadWireType(7)));
        assert_eq!(split(0x02), Err(KeyError::BadNumber));
        assert_eq!(split(1 << 32), Err(KeyError::BadNumber));
    }

    proptest! {
        // Oracle: prost's key encoder and decoder.
        #[test]
        fn keys_agree_with_prost(field in MIN_FIELD..=MAX_FIELD, bits in 0u8..6, raw in any::<u64>()) {
            let wt = WireType::from_bits(bits).expect("0..6");
            let pwt = prost::encoding::WireType::try_from(u64::from(bits)).expect("0..6");
            let mut want = Vec::new();
            prost::encoding::encode_key(field, pwt, &mut want);
            let (got, n) = varint::encode(key(field, wt));
            prop_assert_eq!(&got[..n], &want[..]);
            prop_assert_eq!(key_len(field), prost::encoding::key_len(field));
            let packed = PackedKey::new(field, wt);
            prop_assert_eq!(packed.as_bytes(), &want[..]);
            prop_assert_eq!(split(key(field, wt)), Ok((field, wt)));
            // Any value as a key: valid exactly when prost takes it.
            let (bytes, n) = varint::encode(raw);
            let mut buf = &bytes[..n];
            let want = prost::encoding::decode_key(&mut buf).ok().map(|(f, w)| (f, w as u8));
            prop_assert_eq!(split(raw).ok().map(|(f, w)| (f, w as u8)), want);
        }
    }
}
