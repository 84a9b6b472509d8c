//! [`Rewriter`]: the client-to-server bytes of one HTTP/2 connection, with an `:authority` h2
//! refuses rewritten to `localhost` (see the [module above](super) for why and how). It holds
//! at most one header block, decodes every block with a mirror of the client's HPACK table,
//! and from the first rewritten block on re-encodes every block as literals.

use super::MAX_BLOCK;
use super::frame::{
    CONTINUATION, END_HEADERS, END_STREAM, HEADER_LEN as FRAME_HEADER, HEADERS, MAX_FRAME, PREFACE,
    PRIORITY, PUSH_PROMISE, headers_fragment, push_frame_header,
};

/// h2's SETTINGS_HEADER_TABLE_SIZE (the protocol default): the most the client may use.
const TABLE_SIZE: usize = 4096;
const REPLACEMENT: &[u8] = b"localhost";

/// Whether h2 would refuse this `:authority` (it parses it as a URI authority).
fn is_invalid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_err()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// How many bytes of the client preface have passed.
    Preface(usize),
    FrameHeader,
    /// Payload bytes of a frame that passes as it is.
    Forward(usize),
    /// Payload bytes of a HEADERS or CONTINUATION frame being held.
    Block(usize),
    /// Everything passes untouched from here on.
    Raw,
}

/// The header block being held until END_HEADERS.
struct Held {
    /// The original frames, headers included, to pass on unchanged.
    bytes: Vec<u8>,
    /// Where the frame now arriving starts in `bytes`.
    frame_start: usize,
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The client-to-server byte stream of one HTTP/2 connection, rewritten as described above.
pub struct Rewriter {
    state: State,
    head: [u8; FRAME_HEADER],
    head_len: usize,
    held: Option<Held>,
    decoder: loona_hpack::Decoder<'static>,
    /// A block was re-encoded: h2's HPACK table no longer matches the client's.
    rewriting: bool,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Self {
            state: State::Preface(0),
            head: [0; FRAME_HEADER],
            head_len: 0,
            held: None,
            decoder,
            rewriting: false,
        }
    }
}

impl Rewriter {
    /// True once everything passes untouched.
    pub fn is_raw(&self) -> bool {
        self.state == State::Raw
    }

    /// Takes bytes from the client; appends what h2 is to read to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        while !input.is_empty() {
            match self.state {
                State::Raw => {
                    out.extend_from_slice(input);
                    return;
                }
                State::Preface(seen) => {
                    let n = input.len().min(PREFACE.len() - seen);
                    let matches = input[..n] == PREFACE[seen..seen + n];
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = match (matches, seen + n) {
                        (false, _) => State::Raw,
                        (true, done) if done == PREFACE.len() => State::FrameHeader,
                        (true, seen) => State::Preface(seen),
                    };
                }
                State::FrameHeader => {
                    let n = input.len().min(FRAME_HEADER - self.head_len);
                    self.head[self.head_len..self.head_len + n].copy_from_slice(&input[..n]);
                    self.head_len += n;
                    input = &input[n..];
                    if self.head_len == FRAME_HEADER {
                        self.head_len = 0;
                        self.frame_header(out);
                    }
                }
                State::Forward(left) => {
                    let n = input.len().min(left);
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.state = if n == left {
                        State::FrameHeader
                    } else {
                        State::Forward(left - n)
                    };
                }
                State::Block(left) => {
                    let Some(held) = self.held.as_mut() else {
                        self.state = State::Raw;
                        continue;
                    };
                    let n = input.len().min(left);
                    held.bytes.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if n == left {
                        self.frame_payload(out);
                    } else {
                        self.state = State::Block(left - n);
                    }
                }
            }
        }
    }

    /// The client closed: whatever is held goes on as it came.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if let Some(held) = self.held.take()
            && !self.rewriting
        {
            out.extend_from_slice(&held.bytes);
        }
        out.extend_from_slice(&self.head[..self.head_len]);
        self.head_len = 0;
        self.state = State::Raw;
    }

    fn frame_header(&mut self, out: &mut Vec<u8>) {
        let head = self.head;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let continuing = self.held.as_ref().map(|held| held.stream);
        match (continuing, kind) {
            (Some(held), CONTINUATION) if held == stream => {}
            (None, HEADERS) => {
                self.held = Some(Held {
                    bytes: Vec::new(),
                    frame_start: 0,
                    stream,
                    end_stream: flags & END_STREAM != 0,
                    priority: None,
                    fragment: Vec::new(),
                })
            }
            // Another frame inside a header block, a stray CONTINUATION, a PUSH_PROMISE from
            // a client: all protocol errors that h2 is to see and report.
            (Some(_), _) | (None, CONTINUATION | PUSH_PROMISE) => {
                return self.give_up(Some(&head), out);
            }
            (None, _) => {
                out.extend_from_slice(&head);
                self.state = if len == 0 {
                    State::FrameHeader
                } else {
                    State::Forward(len)
                };
                return;
            }
        }
        let Some(held) = self.held.as_mut() else {
            return;
        };
        if held.bytes.len() + FRAME_HEADER + len > MAX_BLOCK {
            return self.give_up(Some(&head), out);
        }
        held.frame_start = held.bytes.len();
        held.bytes.extend_from_slice(&head);
        if len == 0 {
            self.frame_payload(out);
        } else {
            self.state = State::Block(len);
        }
    }

    /// A held frame is complete: take its fragment; at END_HEADERS, the block.
    fn frame_payload(&mut self, out: &mut Vec<u8>) {
        self.state = State::FrameHeader;
        let Some(held) = self.held.as_mut() else {
            return;
        };
        let frame = &held.bytes[held.frame_start..];
        let (kind, flags, payload) = (frame[3], frame[4], &frame[FRAME_HEADER..]);
        let fragment = if kind == HEADERS {
            match headers_fragment(payload, flags) {
                Some((priority, fragment)) => {
                    held.priority = priority;
                    fragment
                }
                None => return self.give_up(None, out),
            }
        } else {
            payload
        };
        held.fragment.extend_from_slice(fragment);
        if flags & END_HEADERS == 0 {
            return;
        }
        if let Some(held) = self.held.take() {
            self.block(held, out);
        }
    }

    /// One whole header block: passed on, or re-encoded.
    fn block(&mut self, held: Held, out: &mut Vec<u8>) {
        let mut fields = Vec::new();
        let mut size = 0;
        let decoded = self.decoder.decode_with_cb(&held.fragment, |name, value| {
            size += name.len() + value.len() + 32;
            if size <= MAX_BLOCK {
                fields.push((name.into_owned(), value.into_owned()));
            }
        });
        if decoded.is_err() || size > MAX_BLOCK {
            self.held = Some(held);
            return self.give_up(None, out);
        }
        let invalid = |(name, value): &(Vec<u8>, Vec<u8>)| {
            name == b":authority" && is_invalid_authority(value)
        };
        if !self.rewriting && !fields.iter().any(invalid) {
            out.extend_from_slice(&held.bytes);
            if fields.iter().any(|(name, _)| name == b":authority") {
                // A client names one authority per connection: this one's is valid, so the
                // rest passes unread (decoding every block cost a fifth of a call's CPU).
                self.state = State::Raw;
            }
            return;
        }
        if !self.rewriting {
            log::debug!("gRPC client sent an :authority h2 refuses; passing it on as localhost");
            self.rewriting = true;
        }
        let mut block = Vec::with_capacity(held.fragment.len() + 64);
        for field in &fields {
            let value = if invalid(field) {
                REPLACEMENT
            } else {
                &field.1
            };
            literal_without_indexing(&field.0, value, &mut block);
        }
        write_block(&held, &block, out);
    }

    /// Stops understanding the stream: what is held, and the frame header just read, go on as
    /// they came, or — once h2's table differs from the client's, when the client's bytes could
    /// decode to the wrong headers — as a block that h2 must reject as a compression error.
    fn give_up(&mut self, head: Option<&[u8; FRAME_HEADER]>, out: &mut Vec<u8>) {
        let held = self.held.take();
        if self.rewriting {
            let stream = held.as_ref().map_or(1, |h| h.stream);
            push_frame_header(out, 1, HEADERS, END_HEADERS, stream);
            out.push(0x80); // index 0: a decoding error by definition (RFC 7541 §6.1)
        } else if let Some(held) = held {
            out.extend_from_slice(&held.bytes);
        }
        if let Some(head) = head {
            out.extend_from_slice(head);
        }
        self.state = State::Raw;
    }
}

/// RFC 7541 §6.2.2 with a literal name; strings without Huffman coding. (The crate's encoder
/// indexes every literal, which would put entries in h2's table.)
fn literal_without_indexing(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    for string in [name, value] {
        // Writing into a Vec cannot fail.
        let _ = loona_hpack::encoder::encode_integer_into(string.len(), 7, 0, out);
        out.extend_from_slice(string);
    }
}

/// A re-encoded block as HEADERS (keeping END_STREAM and the priority fields, without
/// padding) and as many CONTINUATION frames as it needs.
fn write_block(held: &Held, block: &[u8], out: &mut Vec<u8>) {
    let priority_len = if held.priority.is_some() { 5 } else { 0 };
    let (first, mut rest) = block.split_at(block.len().min(MAX_FRAME - priority_len));
    let mut flags = if held.end_stream { END_STREAM } else { 0 };
    if held.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    push_frame_header(out, first.len() + priority_len, HEADERS, flags, held.stream);
    if let Some(priority) = held.priority {
        out.extend_from_slice(&priority);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        push_frame_header(out, chunk.len(), CONTINUATION, flags, held.stream);
        out.extend_from_slice(chunk);
    }
}
