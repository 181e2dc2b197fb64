//! The ConsumerPort spoken by hand, as the Perfetto UI and other consumer
//! API users speak it: frames over a byte transport (the consumer socket,
//! or the websocket bridge in front of it).

use prost::Message;
use recorder::protos::{self, IpcFrame, ipc_frame::Msg};
use recorder::transport::frame::{FrameDecoder, encode_frame};
use std::collections::HashMap;

/// Moves whole messages of bytes each way.
pub trait Transport {
    fn send(&mut self, bytes: &[u8]);
    /// The next bytes the peer sent; panics on a closed transport.
    fn recv(&mut self) -> Vec<u8>;
}

impl Transport for std::os::unix::net::UnixStream {
    fn send(&mut self, bytes: &[u8]) {
        std::io::Write::write_all(self, bytes).expect("send");
    }
    fn recv(&mut self) -> Vec<u8> {
        let mut buf = vec![0u8; 256 * 1024];
        let n = std::io::Read::read(self, &mut buf).expect("read");
        assert!(n > 0, "the service closed the connection");
        buf.truncate(n);
        buf
    }
}

/// A reply to one method call.
#[derive(Debug)]
pub struct Reply {
    pub success: bool,
    pub has_more: bool,
    pub proto: Vec<u8>,
}

pub struct Consumer<T: Transport> {
    pub t: T,
    dec: FrameDecoder,
    next: u64,
    methods: HashMap<String, u32>,
    service: u32,
    /// Replies that arrived for a request other than the awaited one.
    early: Vec<(u64, Reply)>,
}

impl<T: Transport> Consumer<T> {
    /// Binds the ConsumerPort over `t`.
    pub fn bind(t: T) -> Self {
        let mut c = Consumer {
            t,
            dec: FrameDecoder::new(),
            next: 0,
            methods: HashMap::new(),
            service: 0,
            early: Vec::new(),
        };
        let id = c.frame(Msg::MsgBindService(protos::ipc_frame::BindService {
            service_name: Some("ConsumerPort".into()),
        }));
        let f = c.next_frame();
        assert_eq!(f.request_id, Some(id));
        let Some(Msg::MsgBindServiceReply(r)) = f.msg else {
            panic!("not a bind reply: {f:?}");
        };
        assert_eq!(r.success, Some(true));
        c.service = r.service_id.unwrap_or(0);
        for m in r.methods {
            c.methods
                .insert(m.name.unwrap_or_default(), m.id.unwrap_or(0));
        }
        c
    }

    fn frame(&mut self, msg: Msg) -> u64 {
        self.next += 1;
        let f = IpcFrame {
            request_id: Some(self.next),
            msg: Some(msg),
            data_for_testing: Vec::new(),
        };
        let bytes = encode_frame(&f).expect("encode");
        self.t.send(&bytes);
        self.next
    }

    fn next_frame(&mut self) -> IpcFrame {
        loop {
            if let Some(f) = self.dec.next_frame().expect("a well-formed frame") {
                return f;
            }
            let b = self.t.recv();
            self.dec.feed(&b);
        }
    }

    /// Sends `method(args)`; returns the request id.
    pub fn call(&mut self, method: &str, args: &impl Message) -> u64 {
        let method_id = *self
            .methods
            .get(method)
            .expect("the service has the method");
        self.frame(Msg::MsgInvokeMethod(protos::ipc_frame::InvokeMethod {
            service_id: Some(self.service),
            method_id: Some(method_id),
            args_proto: Some(args.encode_to_vec()),
            drop_reply: None,
        }))
    }

    /// The next reply to request `id`.
    pub fn reply(&mut self, id: u64) -> Reply {
        if let Some(i) = self.early.iter().position(|(r, _)| *r == id) {
            return self.early.remove(i).1;
        }
        loop {
            let f = self.next_frame();
            let Some(Msg::MsgInvokeMethodReply(r)) = f.msg else {
                panic!("not a method reply: {f:?}");
            };
            let reply = Reply {
                success: r.success == Some(true),
                has_more: r.has_more == Some(true),
                proto: r.reply_proto.unwrap_or_default(),
            };
            if f.request_id == Some(id) {
                return reply;
            }
            self.early.push((f.request_id.unwrap_or(0), reply));
        }
    }

    /// Calls and waits for the (single) reply.
    pub fn ask(&mut self, method: &str, args: &impl Message) -> Reply {
        let id = self.call(method, args);
        self.reply(id)
    }

    /// The bytes written into this session's buffers so far
    /// (GetTraceStats).
    pub fn bytes_written(&mut self) -> u64 {
        let r = self.ask("GetTraceStats", &protos::GetTraceStatsRequest {});
        assert!(r.success, "GetTraceStats failed");
        protos::GetTraceStatsResponse::decode(r.proto.as_slice())
            .expect("stats")
            .trace_stats
            .map_or(0, |ts| {
                ts.buffer_stats
                    .iter()
                    .map(|b| b.bytes_written.unwrap_or(0))
                    .sum()
            })
    }

    /// ReadBuffers: every packet returned, as `0x0a <len> <packet>`
    /// records (what the `perfetto` client writes).
    pub fn read_buffers(&mut self) -> Vec<u8> {
        let id = self.call("ReadBuffers", &protos::ReadBuffersRequest {});
        let mut out = Vec::new();
        let mut packet = Vec::new();
        loop {
            let r = self.reply(id);
            assert!(r.success, "ReadBuffers failed");
            let rb = protos::ReadBuffersResponse::decode(r.proto.as_slice()).expect("reply");
            for s in rb.slices {
                packet.extend_from_slice(s.data());
                if s.last_slice_for_packet() {
                    out.extend(recorder::wire::framing::record(&packet));
                    packet.clear();
                }
            }
            if !r.has_more {
                assert!(packet.is_empty(), "a packet left unfinished");
                return out;
            }
        }
    }
}
