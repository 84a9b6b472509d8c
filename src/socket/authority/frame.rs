//! HTTP/2 framing (RFC 9113 §4, §6): the client preface, frame types and flags, and the two
//! pieces of a frame the rewriter reads and writes: a frame header, and the header block
//! fragment inside a HEADERS payload.

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const HEADER_LEN: usize = 9;
/// The frame size every HTTP/2 peer must accept (the least SETTINGS_MAX_FRAME_SIZE).
pub const MAX_FRAME: usize = 16_384;
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
/// On SETTINGS and PING.
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

/// Writes a frame header: payload length, type, flags and stream.
pub(super) fn push_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = (len as u32).to_be_bytes();
    out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// The header block fragment of a HEADERS payload, and its priority fields; `None` when the
/// padding does not fit (a protocol error for h2 to report).
pub(super) fn headers_fragment(payload: &[u8], flags: u8) -> Option<(Option<[u8; 5]>, &[u8])> {
    let (pad, rest) = if flags & PADDED != 0 {
        let (&pad, rest) = payload.split_first()?;
        (usize::from(pad), rest)
    } else {
        (0, payload)
    };
    let (priority, rest) = if flags & PRIORITY != 0 {
        let (priority, rest) = rest.split_first_chunk::<5>()?;
        (Some(*priority), rest)
    } else {
        (None, rest)
    };
    Some((priority, rest.get(..rest.len().checked_sub(pad)?)?))
}
