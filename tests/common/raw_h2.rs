//! A gRPC client written at the HTTP/2 frame level, for what real clients put on the wire that
//! tonic and the h2 crate cannot: a socket path as `:authority` (kubelets before 1.26, Python's
//! grpcio). Header blocks are HPACK-encoded with indexing, as real encoders do, so later calls
//! on one connection refer to table entries that earlier ones inserted.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use csi_nodekit::socket::frame::{
    ACK, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PING, PREFACE, RST_STREAM, SETTINGS,
};

/// Why a unary call got no reply: what the server did instead.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("write the call: {0}")]
    Write(#[source] std::io::Error),
    #[error("GOAWAY with error code {0}")]
    GoAway(u32),
    #[error("RST_STREAM with error code {0}")]
    Reset(u32),
}

/// HTTP/2's PROTOCOL_ERROR (RFC 9113 §7): what h2 resets a stream with for a bad `:authority`.
pub const PROTOCOL_ERROR: u32 = 0x1;

/// A unary call's outcome.
#[derive(Debug)]
pub struct Reply {
    pub status: String,
    pub grpc_status: String,
    pub message: Vec<u8>,
}

pub struct RawH2 {
    stream: UnixStream,
    encoder: loona_hpack::Encoder<'static>,
    decoder: loona_hpack::Decoder<'static>,
    next_stream: u32,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// The 32-bit error code a GOAWAY or RST_STREAM payload carries at `bytes`.
fn error_code(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

impl RawH2 {
    pub fn connect(path: &Path) -> Self {
        let mut stream = UnixStream::connect(path).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(PREFACE).unwrap();
        stream.write_all(&frame(SETTINGS, 0, 0, &[])).unwrap();
        Self {
            stream,
            encoder: loona_hpack::Encoder::new(),
            decoder: loona_hpack::Decoder::new(),
            next_stream: 1,
        }
    }

    fn read_frame(&mut self) -> (u8, u8, u32, Vec<u8>) {
        let mut head = [0u8; 9];
        self.stream.read_exact(&mut head).expect("read a frame");
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        self.stream
            .read_exact(&mut payload)
            .expect("read a payload");
        (head[3], head[4], stream, payload)
    }

    /// One unary call of `method` with a protobuf-encoded `message`, sending `authority`
    /// (`None`: no `:authority` at all).
    pub fn unary(
        &mut self,
        authority: Option<&str>,
        method: &str,
        message: &[u8],
    ) -> Result<Reply, Refused> {
        let id = self.next_stream;
        self.next_stream += 2;
        let mut fields = vec![
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", method.as_bytes()),
        ];
        if let Some(authority) = authority {
            fields.push((b":authority", authority.as_bytes()));
        }
        fields.extend([
            (&b"content-type"[..], &b"application/grpc"[..]),
            (b"te", b"trailers"),
            (b"user-agent", b"raw-h2-test grpc-c/37.0.0"),
        ]);
        let block = self.encoder.encode(fields);
        let mut body = vec![0];
        body.extend((message.len() as u32).to_be_bytes());
        body.extend(message);
        let mut out = frame(HEADERS, END_HEADERS, id, &block);
        out.extend(frame(DATA, END_STREAM, id, &body));
        self.stream.write_all(&out).map_err(Refused::Write)?;
        let mut reply = Reply {
            status: String::new(),
            grpc_status: String::new(),
            message: Vec::new(),
        };
        loop {
            let (kind, flags, stream, payload) = self.read_frame();
            match kind {
                SETTINGS if flags & ACK == 0 => self
                    .stream
                    .write_all(&frame(SETTINGS, ACK, 0, &[]))
                    .unwrap(),
                PING if flags & ACK == 0 => self
                    .stream
                    .write_all(&frame(PING, ACK, 0, &payload))
                    .unwrap(),
                GOAWAY => return Err(Refused::GoAway(error_code(&payload[4..8]))),
                RST_STREAM if stream == id => return Err(Refused::Reset(error_code(&payload))),
                HEADERS if stream == id => {
                    assert!(flags & END_HEADERS != 0, "replies fit one frame");
                    let headers = self.decoder.decode(&payload).expect("decode reply headers");
                    for (name, value) in headers {
                        let value = String::from_utf8_lossy(&value).into_owned();
                        match name.as_slice() {
                            b":status" => reply.status = value,
                            b"grpc-status" => reply.grpc_status = value,
                            _ => {}
                        }
                    }
                }
                DATA if stream == id => reply.message.extend(payload),
                _ => {}
            }
            if stream == id && flags & END_STREAM != 0 && matches!(kind, HEADERS | DATA) {
                if reply.message.len() >= 5 {
                    reply.message.drain(..5);
                }
                return Ok(reply);
            }
        }
    }
}
