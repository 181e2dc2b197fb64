//! The ConsumerPort on the wire: the service's name, its methods in the
//! order clients number them, and the reply frames.

use prost::Message;

use crate::protos::IpcFrame;
use crate::protos::ipc_frame::{BindServiceReply, InvokeMethodReply, Msg, bind_service_reply};
use crate::transport::frame::{self, FrameError};

/// The service a consumer binds.
pub(crate) const SERVICE_NAME: &str = "ConsumerPort";
/// Its id in our replies (0 means "not connected" to a client).
pub(crate) const SERVICE_ID: u32 = 1;

/// The methods, by id (1-based, declaration order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    EnableTracing = 1,
    DisableTracing,
    ReadBuffers,
    FreeBuffers,
    Flush,
    StartTracing,
    ChangeTraceConfig,
    Detach,
    Attach,
    GetTraceStats,
    ObserveEvents,
    QueryServiceState,
    QueryCapabilities,
    SaveTraceForBugreport,
    CloneSession,
}

/// Every method with its name, in id order.
pub(crate) const METHODS: [(Method, &str); 15] = [
    (Method::EnableTracing, "EnableTracing"),
    (Method::DisableTracing, "DisableTracing"),
    (Method::ReadBuffers, "ReadBuffers"),
    (Method::FreeBuffers, "FreeBuffers"),
    (Method::Flush, "Flush"),
    (Method::StartTracing, "StartTracing"),
    (Method::ChangeTraceConfig, "ChangeTraceConfig"),
    (Method::Detach, "Detach"),
    (Method::Attach, "Attach"),
    (Method::GetTraceStats, "GetTraceStats"),
    (Method::ObserveEvents, "ObserveEvents"),
    (Method::QueryServiceState, "QueryServiceState"),
    (Method::QueryCapabilities, "QueryCapabilities"),
    (Method::SaveTraceForBugreport, "SaveTraceForBugreport"),
    (Method::CloneSession, "CloneSession"),
];

impl Method {
    /// The method with wire id `id`, if any.
    pub(crate) fn from_id(id: u32) -> Option<Method> {
        METHODS.get((id as usize).checked_sub(1)?).map(|m| m.0)
    }
}

/// `ObservableEvents.Type` flags.
pub(crate) const EVENT_ALL_DATA_SOURCES_STARTED: i32 = 2;
pub(crate) const EVENT_CLONE_TRIGGER_HIT: i32 = 4;

/// Bytes of reply payload (slices) per ReadBuffers frame: the frame, its
/// header and the reply's own fields must stay under the 128 KiB a client
/// accepts.
pub(crate) const MAX_READ_REPLY_BYTES: usize = frame::MAX_PAYLOAD_BYTES - 1024;

/// The reply to BindService: our methods for `ConsumerPort`, a failure for
/// any other name.
pub(crate) fn bind_reply(request_id: u64, name: &str) -> IpcFrame {
    let reply = if name == SERVICE_NAME {
        BindServiceReply {
            success: Some(true),
            service_id: Some(SERVICE_ID),
            methods: METHODS
                .iter()
                .map(|(m, n)| bind_service_reply::MethodInfo {
                    id: Some(*m as u32),
                    name: Some((*n).to_string()),
                })
                .collect(),
        }
    } else {
        BindServiceReply {
            success: Some(false),
            service_id: None,
            methods: Vec::new(),
        }
    };
    IpcFrame {
        request_id: Some(request_id),
        msg: Some(Msg::MsgBindServiceReply(reply)),
        data_for_testing: Vec::new(),
    }
}

/// A successful reply carrying `reply`.
pub(crate) fn reply(request_id: u64, reply: &impl Message, has_more: bool) -> IpcFrame {
    invoke_reply(request_id, Some(reply.encode_to_vec()), has_more)
}

/// A failed call: the client runs its failure path.
pub(crate) fn failure(request_id: u64) -> IpcFrame {
    invoke_reply(request_id, None, false)
}

fn invoke_reply(request_id: u64, reply_proto: Option<Vec<u8>>, has_more: bool) -> IpcFrame {
    IpcFrame {
        request_id: Some(request_id),
        msg: Some(Msg::MsgInvokeMethodReply(InvokeMethodReply {
            success: reply_proto.is_some().then_some(true),
            has_more: Some(has_more),
            reply_proto,
        })),
        data_for_testing: Vec::new(),
    }
}

/// A frame as bytes on the wire.
pub(crate) fn encode(f: &IpcFrame) -> Result<Vec<u8>, FrameError> {
    frame::encode_frame(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_declaration_order_from_one() {
        for (i, (m, _)) in METHODS.iter().enumerate() {
            assert_eq!(*m as usize, i + 1);
            assert_eq!(Method::from_id(i as u32 + 1), Some(*m));
        }
        assert_eq!(Method::from_id(0), None);
        assert_eq!(Method::from_id(16), None);
    }

    #[test]
    fn only_the_consumer_port_binds() {
        let Some(Msg::MsgBindServiceReply(r)) = bind_reply(3, "ConsumerPort").msg else {
            panic!("not a bind reply");
        };
        assert_eq!((r.success, r.service_id), (Some(true), Some(SERVICE_ID)));
        assert_eq!(r.methods.len(), 15);
        let Some(Msg::MsgBindServiceReply(r)) = bind_reply(3, "ProducerPort").msg else {
            panic!("not a bind reply");
        };
        assert_eq!(r.success, Some(false));
    }
}
