//! Perfetto's IPC framing: a stream of `[u32 LE payload length][IpcFrame]`
//! over a unix stream socket. A frame, header included, is at most
//! [`MAX_FRAME_BYTES`], so a payload is at most [`MAX_PAYLOAD_BYTES`]
//! (ARCHITECTURE.md §9.2).
//!
//! ```text
//!  ┌──────────────┬──────────────────────────────┬──────────────┬───
//!  │ len (u32 LE) │ IpcFrame (len bytes)         │ len (u32 LE) │ …
//!  └──────────────┴──────────────────────────────┴──────────────┴───
//!    4 + len ≤ 131072; len 0 is skipped
//! ```
//!
//! Everything a peer sends is untrusted: an oversized length or bytes that
//! are not an `IpcFrame` are a refusal ([`FrameError`]); the connection
//! owner counts it and drops the connection. The decoder holds at most one
//! frame's bytes, so a peer cannot make it grow.

use prost::Message;

use crate::protos::IpcFrame;

/// Header plus payload of one frame, at most (Perfetto's receive buffer).
pub const MAX_FRAME_BYTES: usize = 128 * 1024;
/// The length prefix.
pub(crate) const HEADER_BYTES: usize = 4;
/// The largest payload a frame may carry.
pub(crate) const MAX_PAYLOAD_BYTES: usize = MAX_FRAME_BYTES - HEADER_BYTES;

/// Capacity a decoder keeps between frames; a larger buffer is given back
/// once its frame is taken.
const IDLE_CAPACITY: usize = 4096;

/// Why a byte stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A length prefix (from the peer, or of a frame about to be sent)
    /// over [`MAX_PAYLOAD_BYTES`].
    #[error("frame length {len_untrusted} over the {MAX_PAYLOAD_BYTES}-byte limit")]
    TooLarge {
        /// The length declared (saturated at `u32::MAX` for an outgoing
        /// frame).
        len_untrusted: u32,
    },
    /// A whole frame arrived whose payload does not decode as an
    /// `IpcFrame`.
    #[error("frame of {len} bytes is not an IPCFrame: {source}")]
    Garbage {
        /// The payload's length.
        len: usize,
        /// What the protobuf decoder refused.
        #[source]
        source: prost::DecodeError,
    },
    /// Encoding an outgoing `IpcFrame` failed (not expected: the frame is
    /// encoded into a growable buffer).
    #[error("frame of {len} bytes is not an IPCFrame: {source}")]
    Unencodable {
        /// The payload's encoded length.
        len: usize,
        /// What the protobuf encoder reported.
        #[source]
        source: prost::EncodeError,
    },
}

/// Cuts a byte stream into frames.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    /// A decoder holding no bytes, at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for the next read: how many bytes the decoder can take without
    /// holding more than one whole frame (at least 1 while a frame is due).
    pub fn room(&self) -> usize {
        MAX_FRAME_BYTES.saturating_sub(self.buf.len()).max(1)
    }

    /// Appends bytes read from the socket.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held that belong to no complete frame yet.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame, `None` until one is whole, or the refusal
    /// (after which the stream is unusable: drop the connection).
    pub fn next_frame(&mut self) -> Result<Option<IpcFrame>, FrameError> {
        loop {
            let Some(head) = self.buf.first_chunk::<HEADER_BYTES>() else {
                return Ok(None);
            };
            let len_untrusted = u32::from_le_bytes(*head);
            let len = len_untrusted as usize;
            if len > MAX_PAYLOAD_BYTES {
                return Err(FrameError::TooLarge { len_untrusted });
            }
            if self.buf.len() < HEADER_BYTES + len {
                return Ok(None);
            }
            let decoded = IpcFrame::decode(&self.buf[HEADER_BYTES..HEADER_BYTES + len]);
            self.buf.drain(..HEADER_BYTES + len);
            // An idle connection holds no frame-sized buffer.
            if self.buf.is_empty() && self.buf.capacity() > IDLE_CAPACITY {
                self.buf = Vec::new();
            }
            if len == 0 {
                continue;
            }
            return decoded
                .map(Some)
                .map_err(|source| FrameError::Garbage { len, source });
        }
    }
}

/// One frame as bytes on the wire; refused when it would exceed the limit
/// (a peer drops the connection on an oversized frame).
pub fn encode_frame(frame: &IpcFrame) -> Result<Vec<u8>, FrameError> {
    let len = frame.encoded_len();
    if len > MAX_PAYLOAD_BYTES {
        return Err(FrameError::TooLarge {
            len_untrusted: u32::try_from(len).unwrap_or(u32::MAX),
        });
    }
    let mut out = Vec::with_capacity(HEADER_BYTES + len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    frame
        .encode(&mut out)
        .map_err(|source| FrameError::Unencodable { len, source })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protos::ipc_frame::{BindService, Msg};

    fn bind(id: u64, name: &str) -> IpcFrame {
        IpcFrame {
            request_id: Some(id),
            msg: Some(Msg::MsgBindService(BindService {
                service_name: Some(name.into()),
            })),
            data_for_testing: vec![],
        }
    }

    #[test]
    fn frames_come_out_whole_however_the_bytes_are_cut() {
        let mut wire = Vec::new();
        for i in 0..5 {
            wire.extend(encode_frame(&bind(i, "ProducerPort")).expect("encode"));
            wire.extend(0u32.to_le_bytes()); // an empty frame: skipped
        }
        for step in [1, 3, 7, wire.len()] {
            let mut d = FrameDecoder::new();
            let mut got = Vec::new();
            for piece in wire.chunks(step) {
                d.feed(piece);
                while let Some(f) = d.next_frame().expect("valid") {
                    got.push(f.request_id);
                }
            }
            assert_eq!(got, (0..5).map(Some).collect::<Vec<_>>(), "step {step}");
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn an_oversized_length_is_refused_before_any_byte_of_it_arrives() {
        let mut d = FrameDecoder::new();
        d.feed(&(MAX_PAYLOAD_BYTES as u32 + 1).to_le_bytes());
        assert_eq!(
            d.next_frame(),
            Err(FrameError::TooLarge {
                len_untrusted: MAX_PAYLOAD_BYTES as u32 + 1
            })
        );
        let mut d = FrameDecoder::new();
        d.feed(&u32::MAX.to_le_bytes());
        assert!(d.next_frame().is_err());
    }

    #[test]
    fn the_largest_payload_passes_and_one_more_byte_does_not() {
        let mut f = bind(1, "");
        let base = f.encoded_len();
        // data_for_testing: tag (1) + length varint (3) + bytes.
        f.data_for_testing = vec![vec![0; MAX_PAYLOAD_BYTES - base - 4]];
        assert_eq!(f.encoded_len(), MAX_PAYLOAD_BYTES);
        let wire = encode_frame(&f).expect("fits");
        let mut d = FrameDecoder::new();
        d.feed(&wire);
        assert_eq!(d.next_frame().expect("valid"), Some(f.clone()));
        f.data_for_testing[0].push(0);
        assert!(encode_frame(&f).is_err());
    }

    #[test]
    fn garbage_is_a_refusal_not_a_panic() {
        let mut d = FrameDecoder::new();
        d.feed(&3u32.to_le_bytes());
        d.feed(&[0xff, 0xff, 0xff]);
        assert!(matches!(d.next_frame(), Err(FrameError::Garbage { .. })));
    }

    #[test]
    fn the_decoder_never_holds_more_than_a_frame() {
        let d = FrameDecoder::new();
        assert_eq!(d.room(), MAX_FRAME_BYTES);
    }
}
