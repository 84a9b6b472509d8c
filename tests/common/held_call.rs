//! A unary gRPC call held in flight: its HEADERS are sent and seen by the server, its message
//! is not, so the call runs for as long as the test wants — through a SIGTERM, say — and is
//! then finished or left to the server's grace period.

use std::path::Path;

use bytes::Bytes;

/// One call in flight on a connection of its own.
pub struct HeldCall {
    _client: h2::client::SendRequest<Bytes>,
    response: h2::client::ResponseFuture,
    body: h2::SendStream<Bytes>,
}

/// How the server answered: the gRPC status code and message (from the trailers, or from the
/// headers of a trailers-only answer).
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    pub grpc_status: String,
    pub message: String,
}

impl HeldCall {
    /// Opens the call `method` (`/package.Service/Method`) on the socket at `socket`.
    pub async fn open(socket: &Path, method: &str) -> Self {
        let io = tokio::net::UnixStream::connect(socket).await.unwrap();
        let (mut client, mut connection) = h2::client::handshake(io).await.unwrap();
        let mut ping_pong = connection.ping_pong().expect("a ping handle");
        tokio::spawn(connection);
        let request = http::Request::post(format!("http://localhost{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (response, body) = client.send_request(request, false).unwrap();
        // The gate: the server reads frames in order, so its PONG means it has the HEADERS.
        ping_pong.ping(h2::Ping::opaque()).await.expect("a PONG");
        Self {
            _client: client,
            response,
            body,
        }
    }

    /// Sends the request message (an empty one: every field at its default) and waits for the
    /// answer.
    pub async fn finish(mut self) -> Answer {
        let empty_message = Bytes::from_static(&[0, 0, 0, 0, 0]);
        self.body
            .send_data(empty_message, true)
            .expect("send the message");
        self.answer().await
    }

    /// Waits for the answer without sending the message.
    pub async fn answer(self) -> Answer {
        let response = self.response.await.expect("an answer");
        let status_of = |headers: &http::HeaderMap| {
            let text = |name: &str| {
                headers
                    .get(name)
                    .map(|v| v.to_str().unwrap_or_default().to_owned())
            };
            text("grpc-status").map(|grpc_status| Answer {
                grpc_status,
                message: text("grpc-message").unwrap_or_default(),
            })
        };
        if let Some(answer) = status_of(response.headers()) {
            return answer;
        }
        let mut body = response.into_body();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("the answer's message");
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        let trailers = body.trailers().await.expect("trailers").expect("trailers");
        status_of(&trailers).expect("a grpc-status trailer")
    }
}
