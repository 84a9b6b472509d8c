//! Any `:authority` on our gRPC Unix sockets, as the Go servers accept it.
//!
//! Kubelets before 1.26, Python's grpcio and other clients that dial a bare path send that path
//! (`/var/lib/kubelet/plugins_registry/x-reg.sock`) as the HTTP/2 `:authority`. h2, under
//! tonic, resets such a stream with PROTOCOL_ERROR and has no option to allow it (the change
//! that would, hyperium/h2 pull request #487 "Do not require authority for UNIX domain
//! sockets", has been open since 2020; hyperium/hyper#3750 asked the same of hyper and was
//! closed without a change), so
//! [`AnyAuthority`] sits between the accepted socket and tonic and rewrites an authority that is
//! not a valid one to `localhost` in the client's header blocks. Nothing else changes: every
//! other frame, and every header block of a client that sends a valid authority (tonic,
//! grpc-go's `localhost`), passes byte for byte.
//!
//! A client names its authority once per connection (grpc-go, grpcio, tonic and the kubelets
//! take it from the address they dial), so the first request decides: a valid `:authority`
//! there, and the rest of the connection passes unread, at no cost per call; a client that
//! switched to a path later on the same connection would be refused by h2 as without us.
//!
//! To rewrite, the client's header blocks are decoded with a decoder that mirrors the client's
//! HPACK table (every block, so the mirror stays exact). From the first rewritten block on,
//! every block is re-encoded as literals without indexing: h2's table is then never referred
//! to again, so it cannot disagree with the client's. Memory is bounded: only one header block
//! is held, at most [`MAX_BLOCK`] bytes. Anything we do not understand is passed on untouched
//! (or, once h2's table differs from the client's, as a block h2 must reject), so h2 reports
//! the protocol error itself.
//!
//! [`frame`] holds HTTP/2's framing, `rewriter` the rewriting itself ([`Rewriter`]); this file
//! is the adapter tonic reads through.
//!
//! When h2 accepts a path as `:authority` on its own (h2#487 merged, or an option for it),
//! this adapter can go: the tests that send a path (`tests/transport/grpc_any_authority.rs`, Python grpcio)
//! then pass with `socket::grpc_incoming` yielding the plain stream.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub mod frame;
mod rewriter;

pub use rewriter::Rewriter;

/// The largest header block held, on the wire and decoded; gRPC metadata is far smaller.
pub const MAX_BLOCK: usize = 64 * 1024;

/// An accepted connection whose client bytes go through a [`Rewriter`]; writes pass straight
/// through.
pub struct AnyAuthority<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes not yet read by h2, from `start`.
    pending: Vec<u8>,
    start: usize,
}

impl<S> AnyAuthority<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::default(),
            pending: Vec::new(),
            start: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AnyAuthority<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.start < this.pending.len() {
                let n = buf.remaining().min(this.pending.len() - this.start);
                buf.put_slice(&this.pending[this.start..this.start + n]);
                this.start += n;
                if this.start == this.pending.len() {
                    this.pending.clear();
                    this.start = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.is_raw() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                this.rewriter.finish(&mut this.pending);
                if this.pending.is_empty() {
                    return Poll::Ready(Ok(()));
                }
            } else {
                this.rewriter.feed(read.filled(), &mut this.pending);
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AnyAuthority<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AnyAuthority<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The connections of a gRPC server's Unix listener, each accepting any `:authority`.
pub fn grpc_incoming(
    listener: tokio::net::UnixListener,
) -> impl tokio_stream::Stream<Item = io::Result<AnyAuthority<tokio::net::UnixStream>>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::UnixListenerStream::new(listener)
        .map(|accepted| accepted.map(AnyAuthority::new))
}

#[cfg(test)]
mod tests;
