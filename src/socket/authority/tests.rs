use super::frame::{
    CONTINUATION, DATA, END_HEADERS, END_STREAM, HEADER_LEN as FRAME_HEADER, HEADERS, MAX_FRAME,
    PADDED, PREFACE, PRIORITY, SETTINGS, headers_fragment, push_frame_header,
};
use super::*;
use loona_hpack::{Decoder, Encoder};
use proptest::prelude::*;

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

const PATH: &str = "/var/lib/kubelet/plugins_registry/x.csi-reg.sock";

fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    push_frame_header(&mut out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
    out
}

fn request(authority: &str, method: &str) -> Fields {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", method),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", "grpc-python/1.60.0 grpc-c/37.0.0"),
    ]
    .iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

/// What a client writes: preface, SETTINGS, and requests whose headers are encoded with
/// indexing, as real encoders do (later blocks refer to entries earlier blocks inserted).
struct Client {
    encoder: Encoder<'static>,
    bytes: Vec<u8>,
    stream: u32,
}

impl Client {
    fn new() -> Self {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame_bytes(SETTINGS, 0, 0, &[]));
        Self {
            encoder: Encoder::new(),
            bytes,
            stream: 1,
        }
    }

    fn block(&mut self, fields: &Fields) -> Vec<u8> {
        self.encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
    }

    /// One unary call: HEADERS, then DATA with END_STREAM.
    fn call(&mut self, fields: &Fields) -> &mut Self {
        let block = self.block(fields);
        let stream = self.stream;
        self.stream += 2;
        self.bytes
            .extend(frame_bytes(HEADERS, END_HEADERS, stream, &block));
        self.bytes.extend(frame_bytes(
            DATA,
            END_STREAM,
            stream,
            b"\0\0\0\0\x02\x08\x01",
        ));
        self
    }
}

/// What h2 reads: the header lists, decoded with one decoder as h2 keeps one, and every
/// other frame as it is.
fn server_view(bytes: &[u8]) -> (Vec<Fields>, Vec<Vec<u8>>) {
    assert!(bytes.starts_with(PREFACE));
    let mut rest = &bytes[PREFACE.len()..];
    let mut decoder = Decoder::new();
    let (mut lists, mut others, mut fragment) = (Vec::new(), Vec::new(), Vec::new());
    while !rest.is_empty() {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let (kind, flags) = (rest[3], rest[4]);
        let (whole, tail) = rest.split_at(FRAME_HEADER + len);
        rest = tail;
        let payload = &whole[FRAME_HEADER..];
        match kind {
            HEADERS => fragment.extend(headers_fragment(payload, flags).unwrap().1),
            CONTINUATION => fragment.extend(payload),
            _ => {
                others.push(whole.to_vec());
                continue;
            }
        }
        assert!(len <= MAX_FRAME, "a frame of {len} bytes");
        if flags & END_HEADERS != 0 {
            lists.push(decoder.decode(&fragment).expect("h2 can decode the block"));
            fragment.clear();
        }
    }
    (lists, others)
}

fn rewrite(bytes: &[u8], chunk: usize) -> Vec<u8> {
    let mut rewriter = Rewriter::default();
    let mut out = Vec::new();
    for piece in bytes.chunks(chunk) {
        rewriter.feed(piece, &mut out);
    }
    rewriter.finish(&mut out);
    out
}

fn with_authority(fields: &Fields, authority: &str) -> Fields {
    let mut fields = fields.clone();
    for (name, value) in &mut fields {
        if name == b":authority" {
            *value = authority.as_bytes().to_vec();
        }
    }
    fields
}

#[test]
fn a_connection_with_valid_authorities_passes_byte_for_byte() {
    let mut client = Client::new();
    client
        .call(&request("localhost", "/csi.v1.Identity/Probe"))
        .call(&request("localhost", "/csi.v1.Identity/Probe"))
        .call(&request("[::1]:50051", "/csi.v1.Node/NodeGetInfo"));
    client
        .bytes
        .extend(frame_bytes(0x8, 0, 0, &[0, 0, 0x10, 0]));
    for chunk in [1, 7, 9, 100, usize::MAX] {
        assert_eq!(rewrite(&client.bytes, chunk), client.bytes, "chunk {chunk}");
    }
}

#[test]
fn after_a_first_request_with_a_valid_authority_the_connection_passes_unread() {
    let mut client = Client::new();
    client
        .call(&request("localhost", "/csi.v1.Identity/Probe"))
        .call(&request(PATH, "/csi.v1.Identity/Probe"));
    let mut rewriter = Rewriter::default();
    let mut out = Vec::new();
    rewriter.feed(&client.bytes, &mut out);
    assert!(
        rewriter.is_raw(),
        "nothing is decoded after the first block"
    );
    assert_eq!(out, client.bytes);
}

#[test]
fn a_path_authority_becomes_localhost_and_everything_else_is_kept() {
    let mut client = Client::new();
    let calls = [
        request(PATH, "/pluginregistration.Registration/GetInfo"),
        request(PATH, "/pluginregistration.Registration/GetInfo"),
        request("localhost", "/csi.v1.Identity/Probe"),
        request(PATH, "/csi.v1.Identity/Probe"),
    ];
    for call in &calls {
        client.call(call);
    }
    let (lists, others) = server_view(&rewrite(&client.bytes, 5));
    let expected: Vec<Fields> = calls
        .iter()
        .map(|c| with_authority(c, "localhost"))
        .collect();
    assert_eq!(lists, expected);
    let (_, sent) = server_view(&client.bytes);
    assert_eq!(others, sent, "SETTINGS and DATA frames are untouched");
}

#[test]
fn padding_priority_and_continuations_are_understood() {
    let mut client = Client::new();
    let fields = request(PATH, "/csi.v1.Identity/GetPluginInfo");
    let block = client.block(&fields);
    let (a, b) = block.split_at(10);
    let mut payload = vec![3]; // pad length
    payload.extend([0x80, 0, 0, 1, 200]); // exclusive dependency on stream 1, weight 200
    payload.extend(a);
    payload.extend([0; 3]);
    let flags = PADDED | PRIORITY | END_STREAM;
    client
        .bytes
        .extend(frame_bytes(HEADERS, flags, 3, &payload));
    client
        .bytes
        .extend(frame_bytes(CONTINUATION, END_HEADERS, 3, b));
    let out = rewrite(&client.bytes, 3);
    let (lists, _) = server_view(&out);
    assert_eq!(lists, [with_authority(&fields, "localhost")]);
    let head = &out[PREFACE.len() + FRAME_HEADER..][..FRAME_HEADER + 5];
    assert_eq!(head[3..5], [HEADERS, END_STREAM | PRIORITY | END_HEADERS]);
    assert_eq!(head[FRAME_HEADER..], [0x80, 0, 0, 1, 200], "priority kept");
}

#[test]
fn a_rewritten_block_larger_than_a_frame_goes_out_in_continuations() {
    let mut client = Client::new();
    let mut fields = request(PATH, "/csi.v1.Node/NodePublishVolume");
    fields.push((b"x-big".to_vec(), vec![b'v'; 40_000]));
    client.call(&fields);
    let (lists, _) = server_view(&rewrite(&client.bytes, 4096));
    assert_eq!(lists, [with_authority(&fields, "localhost")]);
}

#[test]
fn what_is_not_http2_passes_untouched() {
    let http1 = b"GET /healthz HTTP/1.1\r\nHost: /var/run/x.sock\r\n\r\n";
    assert_eq!(rewrite(http1, 4), http1);
}

#[test]
fn an_oversized_block_passes_through_without_being_held() {
    let mut input = PREFACE.to_vec();
    input.extend(frame_bytes(
        HEADERS,
        END_HEADERS,
        1,
        &vec![0x82; MAX_BLOCK + 1],
    ));
    let mut rewriter = Rewriter::default();
    let mut out = Vec::new();
    rewriter.feed(&input[..PREFACE.len() + FRAME_HEADER + 10], &mut out);
    assert!(rewriter.is_raw() && out.len() == PREFACE.len() + FRAME_HEADER + 10);
    rewriter.feed(&input[PREFACE.len() + FRAME_HEADER + 10..], &mut out);
    assert_eq!(out, input);
}

#[test]
fn an_undecodable_block_reaches_h2_as_it_came() {
    let mut input = Client::new().bytes;
    input.extend(frame_bytes(
        HEADERS,
        END_HEADERS,
        1,
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    ));
    input.extend(frame_bytes(DATA, END_STREAM, 1, b"rest"));
    assert_eq!(rewrite(&input, 2), input);
}

#[test]
fn after_a_rewrite_an_undecodable_block_becomes_one_h2_must_reject() {
    let mut client = Client::new();
    client.call(&request(PATH, "/csi.v1.Identity/Probe"));
    client
        .bytes
        .extend(frame_bytes(HEADERS, END_HEADERS, 3, &[0xbf, 0xff, 0xff]));
    let out = rewrite(&client.bytes, 64);
    let tail = &out[out.len() - FRAME_HEADER - 1..];
    assert_eq!(tail, frame_bytes(HEADERS, END_HEADERS, 3, &[0x80]));
    assert!(Decoder::new().decode(&[0x80]).is_err());
}

#[test]
fn a_frame_between_headers_and_continuation_is_left_to_h2() {
    let mut client = Client::new();
    let block = client.block(&request("localhost", "/p"));
    client.bytes.extend(frame_bytes(HEADERS, 0, 1, &block));
    client.bytes.extend(frame_bytes(DATA, 0, 1, b"x"));
    assert_eq!(rewrite(&client.bytes, 1), client.bytes);
}

proptest! {
    #[test]
    fn the_rewrite_does_not_depend_on_how_reads_split_the_bytes(chunk in 1usize..200) {
        let mut client = Client::new();
        client.call(&request("localhost", "/a")).call(&request(PATH, "/b")).call(&request(PATH, "/c"));
        prop_assert_eq!(rewrite(&client.bytes, chunk), rewrite(&client.bytes, usize::MAX));
    }

    #[test]
    fn arbitrary_frames_never_panic_and_stay_bounded(
        frames in proptest::collection::vec(
            (prop::sample::select(vec![0u8, 1, 4, 5, 8, 9]), any::<u8>(), 0u32..4,
             proptest::collection::vec(any::<u8>(), 0..80)),
            0..12),
        chunk in 1usize..50,
    ) {
        let mut input = PREFACE.to_vec();
        for (kind, flags, stream, payload) in &frames {
            input.extend(frame_bytes(*kind, *flags, *stream, payload));
        }
        let out = rewrite(&input, chunk);
        prop_assert!(out.len() <= 2 * input.len() + 64);
    }
}
