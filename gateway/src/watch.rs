//! Serving connections, and knowing when a client has gone away. When an HTTP/1 client closes
//! its connection in the middle of a long question, hyper drops the connection but goes on
//! running the handler until it has an answer to write. So each accepted connection carries a
//! token that fires when the connection is dropped; handlers see it as `ClientGone` and drop
//! (and so cancel) their database call when it fires. A connection must send each request's
//! headers within the header timeout (counted from when the server is ready to read them, so
//! an idle connection is closed too): no client holds a connection, or a descriptor, without
//! asking anything. And a client must read what it asked for: a response write that makes no
//! progress for the write timeout closes the connection, so that a client that never reads
//! does not hold the answer in the gateway's memory (up to `max_result_bytes` of rows) for ever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Fires when the request's connection is gone.
#[derive(Clone)]
pub struct ClientGone(pub CancellationToken);

pub struct WatchedStream {
    inner: TcpStream,
    gone: CancellationToken,
    write_timeout: Duration,
    /// Since when a write has been waiting for the client to read (its deadline).
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl WatchedStream {
    /// A write could not go on: pending until the client reads, an error once it has read
    /// nothing for the write timeout.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let timeout = self.write_timeout;
        let deadline = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of the response for the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for WatchedStream {
    fn drop(&mut self) {
        self.gone.cancel();
    }
}

/// Serves `router` on `listener` (HTTP/1.1) until `shutdown` completes, then waits for the
/// connections in progress to end.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    header_timeout: Duration,
    write_timeout: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let inner = match accepted {
            Ok((inner, _)) => inner,
            // Out of file descriptors and the like: wait, as axum's own listener does.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = inner.set_nodelay(true);
        let gone = CancellationToken::new();
        // Each request of the connection carries its token (what axum's ConnectInfo reads).
        let (router, token) = (router.clone(), gone.clone());
        let service = service_fn(move |mut request: Request<Incoming>| {
            request
                .extensions_mut()
                .insert(ConnectInfo(ClientGone(token.clone())));
            router.clone().oneshot(request)
        });
        let io = TokioIo::new(WatchedStream {
            inner,
            gone,
            write_timeout,
            stalled: None,
        });
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(io, service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
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
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Pending => this.stalled(cx),
            written => {
                this.stalled = None;
                written
            }
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Pending => this.stalled(cx),
            flushed => {
                this.stalled = None;
                flushed
            }
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
