//! A borrowing walk over the top-level fields of one message. Bytes from a
//! file, a socket or a config are untrusted: anything that is not protobuf
//! ends the walk with a [`WireError`] naming the offset, never a panic.
//!
//! ```text
//!  message := field*
//!  field   := key value
//!  value   := varint | 8 bytes | varint len, len bytes | 4 bytes
//!           | group: field* up to the matching end-group key
//! ```

use super::key::{self, KeyError, WireType};
use super::varint::{self, VarintError};

/// Groups nested deeper than this are refused (prost's recursion limit), so
/// hostile input cannot make a walk arbitrarily deep.
pub(crate) const MAX_GROUP_DEPTH: usize = 100;

/// A malformed protobuf byte string; offsets are into the walked message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, serde::Serialize)]
pub enum WireError {
    /// A varint ran past the end of the input or over 10 bytes.
    #[error("truncated or overlong varint at byte {0}")]
    BadVarint(usize),
    /// A length-delimited, fixed-size or group field ran past the end.
    #[error("field at byte {0} runs past the end of the message")]
    Truncated(usize),
    /// Field number 0, or a key past 32 bits.
    #[error("invalid field number at byte {0}")]
    BadFieldNumber(usize),
    /// Wire types 6 and 7, a stray or mismatched end-group key, or groups
    /// nested past [`MAX_GROUP_DEPTH`].
    #[error("unsupported wire type {wire_type} at byte {at}")]
    WireType {
        /// The wire type found.
        wire_type: u8,
        /// Offset of the key.
        at: usize,
    },
}

impl WireError {
    /// Where in the message the problem was found.
    pub fn offset(&self) -> usize {
        match *self {
            WireError::BadVarint(at)
            | WireError::Truncated(at)
            | WireError::BadFieldNumber(at)
            | WireError::WireType { at, .. } => at,
        }
    }
}

/// One field's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Wire type 0: an integer, bool or enum, still zigzag-encoded for
    /// `sint` fields.
    Varint(u64),
    /// Wire type 1: eight little-endian bytes (`fixed64`, `sfixed64`,
    /// `double`).
    Fixed64(u64),
    /// Wire type 5: four little-endian bytes (`fixed32`, `sfixed32`,
    /// `float`).
    Fixed32(u32),
    /// A string, bytes, nested message or packed repeated field.
    Len(&'a [u8]),
    /// The fields of a group (without its end-group key).
    Group(&'a [u8]),
}

/// One top-level field of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    /// The field number from the key (1 to 2^29 - 1).
    pub number: u32,
    /// What follows the key, as its wire type reads.
    pub value: Value<'a>,
    /// Offset of the field's key in the message.
    pub start: usize,
    /// Offset just past the field (past the end-group key for a group).
    pub end: usize,
}

impl Field<'_> {
    #[cfg(test)]
    pub(crate) fn wire_type(&self) -> WireType {
        match self.value {
            Value::Varint(_) => WireType::Varint,
            Value::Fixed64(_) => WireType::Fixed64,
            Value::Fixed32(_) => WireType::Fixed32,
            Value::Len(_) => WireType::Len,
            Value::Group(_) => WireType::StartGroup,
        }
    }
}

/// Iterates the fields of a message; after the first error it yields
/// nothing more.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    data: &'a [u8],
    pos: usize,
}

/// The top-level fields of `message`.
pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields {
        data: message,
        pos: 0,
    }
}

/// Calls `f` with each field of `message`, stopping at the first malformed
/// one.
pub fn for_each<'a>(message: &'a [u8], mut f: impl FnMut(Field<'a>)) -> Result<(), WireError> {
    for field in fields(message) {
        f(field?);
    }
    Ok(())
}

/// Reads a varint at `*pos`, naming `at` as where it starts.
fn varint_at(data: &[u8], pos: &mut usize) -> Result<u64, WireError> {
    let at = *pos;
    varint::read(data, pos).map_err(|e| match e {
        VarintError::Truncated | VarintError::Overlong => WireError::BadVarint(at),
    })
}

/// Reads a key at `*pos`.
fn key_at(data: &[u8], pos: &mut usize) -> Result<(u32, WireType), WireError> {
    let at = *pos;
    let k = varint_at(data, pos)?;
    key::split(k).map_err(|e| match e {
        KeyError::BadNumber => WireError::BadFieldNumber(at),
        KeyError::BadWireType(wire_type) => WireError::WireType { wire_type, at },
    })
}

/// `n` bytes at `*pos`, moving past them; `Truncated(at)` if they run out.
fn take<'a>(data: &'a [u8], pos: &mut usize, n: u64, at: usize) -> Result<&'a [u8], WireError> {
    let end = usize::try_from(n)
        .ok()
        .and_then(|n| pos.checked_add(n))
        .filter(|e| *e <= data.len())
        .ok_or(WireError::Truncated(at))?;
    let s = &data[*pos..end];
    *pos = end;
    Ok(s)
}

/// Skips the body of group `number` starting at `*pos`; returns the body's
/// end (the offset of its end-group key) and leaves `*pos` past that key.
fn skip_group(data: &[u8], pos: &mut usize, number: u32) -> Result<usize, WireError> {
    let body = *pos;
    let mut open = vec![number];
    while let Some(&innermost) = open.last() {
        if *pos >= data.len() {
            return Err(WireError::Truncated(body));
        }
        let at = *pos;
        let (n, wt) = key_at(data, pos)?;
        match wt {
            WireType::Varint => {
                varint_at(data, pos)?;
            }
            WireType::Fixed64 => {
                take(data, pos, 8, at)?;
            }
            WireType::Fixed32 => {
                take(data, pos, 4, at)?;
            }
            WireType::Len => {
                let len = varint_at(data, pos)?;
                take(data, pos, len, at)?;
            }
            WireType::StartGroup if open.len() < MAX_GROUP_DEPTH => open.push(n),
            WireType::EndGroup if n == innermost => {
                open.pop();
                if open.is_empty() {
                    return Ok(at);
                }
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err(WireError::WireType {
                    wire_type: wt as u8,
                    at,
                });
            }
        }
    }
    Ok(*pos)
}

/// Whether `message` is well-formed at the top level, holds no group and no
/// field `refused` names: the check of every packet a producer commits,
/// so it walks without building [`Field`]s and takes one-byte keys and
/// lengths (nearly all of them) without the general varint decoder. Agrees
/// with [`fields`] (checked by a property test).
pub(crate) fn plain_without(message: &[u8], refused: impl Fn(u32) -> bool) -> bool {
    let mut pos = 0;
    while let Some(&b) = message.get(pos) {
        let key = if b < 0x80 {
            pos += 1;
            u64::from(b)
        } else {
            match varint::read(message, &mut pos) {
                Ok(k) => k,
                Err(_) => return false,
            }
        };
        let Ok((number, wt)) = key::split(key) else {
            return false;
        };
        if refused(number) {
            return false;
        }
        let skip = match wt {
            WireType::Varint => match varint::read(message, &mut pos) {
                Ok(_) => 0,
                Err(_) => return false,
            },
            WireType::Fixed64 => 8,
            WireType::Fixed32 => 4,
            WireType::Len => match message.get(pos) {
                Some(&n) if n < 0x80 => {
                    pos += 1;
                    u64::from(n)
                }
                _ => match varint::read(message, &mut pos) {
                    Ok(n) => n,
                    Err(_) => return false,
                },
            },
            WireType::StartGroup | WireType::EndGroup => return false,
        };
        match usize::try_from(skip).ok().and_then(|n| pos.checked_add(n)) {
            Some(end) if end <= message.len() => pos = end,
            _ => return false,
        }
    }
    true
}

impl<'a> Fields<'a> {
    fn step(&mut self) -> Result<Field<'a>, WireError> {
        let data = self.data;
        let pos = &mut self.pos;
        let start = *pos;
        let (number, wt) = key_at(data, pos)?;
        let value = match wt {
            WireType::Varint => Value::Varint(varint_at(data, pos)?),
            WireType::Fixed64 => {
                let b = take(data, pos, 8, start)?;
                Value::Fixed64(u64::from_le_bytes(
                    b.try_into().map_err(|_| WireError::Truncated(start))?,
                ))
            }
            WireType::Fixed32 => {
                let b = take(data, pos, 4, start)?;
                Value::Fixed32(u32::from_le_bytes(
                    b.try_into().map_err(|_| WireError::Truncated(start))?,
                ))
            }
            WireType::Len => {
                let len = varint_at(data, pos)?;
                Value::Len(take(data, pos, len, start)?)
            }
            // A group (deprecated, but valid protobuf): kept whole, as an
            // unknown field must be.
            WireType::StartGroup => {
                let body = *pos;
                let body_end = skip_group(data, pos, number)?;
                Value::Group(&data[body..body_end])
            }
            WireType::EndGroup => {
                return Err(WireError::WireType {
                    wire_type: wt as u8,
                    at: start,
                });
            }
        };
        Ok(Field {
            number,
            value,
            start,
            end: *pos,
        })
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.data.len() {
            return None;
        }
        let r = self.step();
        if r.is_err() {
            // Fused: nothing after a malformed field can be trusted.
            self.pos = self.data.len();
        }
        Some(r)
    }
}

impl std::iter::FusedIterator for Fields<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    fn walk(m: &[u8]) -> Result<Vec<Field<'_>>, WireError> {
        fields(m).collect()
    }

    #[test]
    fn malformed_input_is_an_error_at_its_offset() {
        assert_eq!(walk(&[0x0a, 0x05, 1]), Err(WireError::Truncated(0)));
        assert_eq!(walk(&[0x08]), Err(WireError::BadVarint(1)));
        assert_eq!(walk(&[0x08, 0x01, 0x80]), Err(WireError::BadVarint(2)));
        assert_eq!(walk(&[0x00, 0x01]), Err(WireError::BadFieldNumber(0)));
        assert_eq!(
            walk(&[0x0f]),
            Err(WireError::WireType {
                wire_type: 7,
                at: 0
            })
        );
        assert_eq!(walk(&[0x09, 1, 2, 3]), Err(WireError::Truncated(0)));
        assert_eq!(walk(&[0x0d, 1, 2, 3]), Err(WireError::Truncated(0)));
        // Groups: unterminated, stray end, mismatched end.
        assert_eq!(walk(&[0x2b, 0x08, 0x01]), Err(WireError::Truncated(1)));
        assert!(walk(&[0x2c]).is_err());
        assert!(walk(&[0x2b, 0x34]).is_err());
        // Deeper than the limit.
        let mut deep = vec![0x0b; MAX_GROUP_DEPTH + 1];
        deep.extend(vec![0x0c; MAX_GROUP_DEPTH + 1]);
        assert!(walk(&deep).is_err());
        // Fused after an error.
        let mut it = fields(&[0x08]);
        assert!(matches!(it.next(), Some(Err(_))));
        assert!(it.next().is_none());
    }

    #[test]
    fn values_and_offsets() {
        // 1: varint 300, 2: "ab", 3: fixed32, 4: fixed64, group 5 { 1: 1 }
        let m = [
            0x08, 0xac, 0x02, 0x12, 2, b'a', b'b', 0x1d, 1, 0, 0, 0, 0x21, 2, 0, 0, 0, 0, 0, 0, 0,
            0x2b, 0x08, 0x01, 0x2c,
        ];
        let f = walk(&m).expect("well-formed");
        assert_eq!(f[0].value, Value::Varint(300));
        assert_eq!(f[1].value, Value::Len(b"ab"));
        assert_eq!((f[1].start, f[1].end), (3, 7));
        assert_eq!(f[2].value, Value::Fixed32(1));
        assert_eq!(f[3].value, Value::Fixed64(2));
        assert_eq!(f[4].value, Value::Group(&[0x08, 0x01]));
        assert_eq!((f[4].number, f[4].start, f[4].end), (5, 21, 25));
        assert_eq!(f[4].wire_type(), WireType::StartGroup);
    }

    /// A field as prost would encode it.
    #[derive(Debug, Clone)]
    enum Gen {
        Varint(u32, u64),
        Fixed64(u32, u64),
        Fixed32(u32, u32),
        Len(u32, Vec<u8>),
    }

    fn gen_field() -> impl Strategy<Value = Gen> {
        let number = prop_oneof![1u32..20, 1u32..=key::MAX_FIELD];
        (
            number,
            0u8..4,
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(|(n, kind, v, b)| match kind {
                0 => Gen::Varint(n, v),
                1 => Gen::Fixed64(n, v),
                2 => Gen::Fixed32(n, v as u32),
                _ => Gen::Len(n, b),
            })
    }

    proptest! {
        // Oracle: prost encodes the fields; the walk gives them back.
        #[test]
        fn walks_what_prost_encodes(spec in proptest::collection::vec(gen_field(), 0..12)) {
            use prost::encoding::{bytes, fixed32, fixed64, uint64};
            let mut m = Vec::new();
            for g in &spec {
                match g {
                    Gen::Varint(n, v) => uint64::encode(*n, v, &mut m),
                    Gen::Fixed64(n, v) => fixed64::encode(*n, v, &mut m),
                    Gen::Fixed32(n, v) => fixed32::encode(*n, v, &mut m),
                    Gen::Len(n, b) => bytes::encode(*n, b, &mut m),
                }
            }
            let got = walk(&m).expect("prost's output is well-formed");
            prop_assert_eq!(got.len(), spec.len());
            let mut at = 0;
            for (f, g) in got.iter().zip(&spec) {
                prop_assert_eq!(f.start, at);
                at = f.end;
                let same = match (g, f.value) {
                    (Gen::Varint(n, v), Value::Varint(x)) => *n == f.number && *v == x,
                    (Gen::Fixed64(n, v), Value::Fixed64(x)) => *n == f.number && *v == x,
                    (Gen::Fixed32(n, v), Value::Fixed32(x)) => *n == f.number && *v == x,
                    (Gen::Len(n, b), Value::Len(x)) => *n == f.number && b[..] == *x,
                    _ => false,
                };
                prop_assert!(same, "{:?} walked as {:?}", g, f);
            }
            prop_assert_eq!(at, m.len());
        }

        // Oracle: the general walk; the fast check says yes exactly when
        // the walk finds every field whole, no group, no refused number.
        #[test]
        fn the_fast_check_agrees_with_the_walk(
            m in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..40),
                proptest::collection::vec(prop_oneof![Just(0x08u8), Just(0x0b), Just(0x0c), Just(0x13), Just(0x0a), Just(0x01), Just(0x02), Just(0x80), Just(0x00), Just(0x7f), Just(0xff), Just(0x4a)], 0..40),
            ],
            refused in 1u32..12,
        ) {
            let walk_says = fields(&m).all(|f| {
                f.is_ok_and(|f| f.number != refused && !matches!(f.value, Value::Group(_)))
            });
            prop_assert_eq!(plain_without(&m, |n| n == refused), walk_says, "{:?}", m);
        }

        // Oracle: prost's decoder of an empty message (which skips every
        // field, groups included) accepts exactly what the walk accepts.
        #[test]
        fn accepts_what_prost_accepts(
            m in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..24),
                proptest::collection::vec(prop_oneof![Just(0x08u8), Just(0x0b), Just(0x0c), Just(0x13), Just(0x14), Just(0x0a), Just(0x01), Just(0x02), Just(0x80), Just(0x00)], 0..24),
            ]
        ) {
            let ours = walk(&m);
            let prost_ok = <() as Message>::decode(&m[..]).is_ok();
            prop_assert_eq!(ours.is_ok(), prost_ok, "{:?}: ours {:?}", m, ours);
            if let Ok(fs) = ours {
                prop_assert_eq!(fs.last().map_or(0, |f| f.end), m.len());
            }
        }
    }
}
