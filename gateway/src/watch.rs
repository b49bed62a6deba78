//! Knowing when a client has gone away. When an HTTP/1 client closes its connection in the
//! middle of a long question, hyper drops the connection but goes on running the handler until
//! it has an answer to write. So each accepted connection carries a token that fires when the
//! connection is dropped; handlers see it as `ClientGone` and drop (and so cancel) their
//! database call when it fires.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Fires when the request's connection is gone.
#[derive(Clone)]
pub struct ClientGone(pub CancellationToken);

pub struct WatchedListener(pub TcpListener);

pub struct WatchedStream {
    inner: TcpStream,
    gone: CancellationToken,
}

impl Drop for WatchedStream {
    fn drop(&mut self) {
        self.gone.cancel();
    }
}

impl Listener for WatchedListener {
    type Io = WatchedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (WatchedStream, SocketAddr) {
        loop {
            match self.0.accept().await {
                Ok((inner, address)) => {
                    let _ = inner.set_nodelay(true);
                    let gone = CancellationToken::new();
                    return (WatchedStream { inner, gone }, address);
                }
                // Out of file descriptors and the like: wait, as axum's own listener does.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

impl Connected<IncomingStream<'_, WatchedListener>> for ClientGone {
    fn connect_info(stream: IncomingStream<'_, WatchedListener>) -> Self {
        ClientGone(stream.io().gone.clone())
    }
}

impl AsyncRead for WatchedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for WatchedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
