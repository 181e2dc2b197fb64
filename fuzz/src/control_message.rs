//! Oracle for the control-message decoder: any input is either a
//! well-formed request, which re-encodes to a line that decodes to the same
//! request, or a refusal. Never a panic.

use recorder::control::wire::{Endpoint, decode_request, encode_request};

pub fn check(data: &[u8]) {
    for endpoint in [Endpoint::Trigger, Endpoint::Control] {
        if let Ok(req) = decode_request(data, endpoint) {
            let again = decode_request(&encode_request(&req), endpoint);
            assert_eq!(
                again.as_ref(),
                Ok(&req),
                "re-encoded request must decode the same"
            );
        }
    }
}
