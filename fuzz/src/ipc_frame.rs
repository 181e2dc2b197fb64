//! Oracle for the IPC frame decoder: any byte stream yields well-formed
//! frames (each re-encodes and decodes to itself) up to the first refusal;
//! the same stream cut into other pieces yields the same frames and the
//! same refusal; the decoder never holds more than one frame. Never a panic.

use recorder::transport::frame::{FrameDecoder, FrameError, MAX_FRAME_BYTES, encode_frame};
use recorder::protos::IpcFrame;

fn decode_all(data: &[u8], step: usize) -> (Vec<IpcFrame>, Option<FrameError>) {
    let mut d = FrameDecoder::new();
    let mut frames = Vec::new();
    for piece in data.chunks(step.max(1)) {
        d.feed(piece);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => return (frames, Some(e)),
            }
        }
        assert!(
            d.pending() <= MAX_FRAME_BYTES,
            "decoder holds more than a frame"
        );
    }
    (frames, None)
}

pub fn check(data: &[u8]) {
    let whole = decode_all(data, data.len());
    let step = data.first().map_or(1, |b| usize::from(*b % 17) + 1);
    let cut = decode_all(data, step);
    assert_eq!(
        whole, cut,
        "cutting the stream differently changed the result"
    );
    for f in &whole.0 {
        let wire = encode_frame(f).expect("a decoded frame fits when encoded again");
        let (again, err) = decode_all(&wire, wire.len());
        assert_eq!(err, None);
        // A frame of unknown fields only re-encodes empty, and an empty
        // frame is skipped on the wire.
        let expect: &[IpcFrame] = if wire.len() == 4 {
            &[]
        } else {
            std::slice::from_ref(f)
        };
        assert_eq!(again.as_slice(), expect, "round trip");
    }
}
