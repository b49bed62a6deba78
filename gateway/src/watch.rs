//! Serving connections, and knowing when a client has gone away. When an HTTP/1 client closes
//! its connection in the middle of a long question, hyper drops the connection but goes on
//! running the handler until it has an answer to write. So each accepted connection carries a
//! token that fires when the connection is dropped; handlers see it as `ClientGone` and drop
//! (and so cancel) their database call when it fires. A connection must send each request's
//! headers within the header timeout (counted from when the server is ready to read them, so
//! an idle connection is closed too): no client holds a connection, or a descriptor, without
//! asking anything.

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
        let io = TokioIo::new(WatchedStream { inner, gone });
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
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
