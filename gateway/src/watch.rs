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
//! Connections are served up to a number at once; more wait in the listen queue, so that what
//! clients hold (a body up to `--max-body` each) has a bound the operator sets. A connection is
//! unproven until one of its requests carries a known token (`Proven`), and then counts among
//! that token's connections until it closes (`--max-requests-per-token` of them): past a short grace,
//! unproven ones hold at most half the places (the oldest closed when a new one comes) and are
//! closed when no place is free, and each has the login timeout to prove itself; so that
//! clients without a token, idle or trickling their headers, cannot keep the gateway from those
//! with one.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
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
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Fires when the request's connection is gone.
#[derive(Clone)]
pub struct ClientGone(pub CancellationToken);

/// Fired by the login check when a request of the connection carries a known token; `held`
/// keeps the client (token fingerprint) the connection counts for and its place among that
/// client's connections (`admission::requests`), for as long as the connection lives.
#[derive(Clone)]
pub struct Proven {
    pub proof: CancellationToken,
    pub held: Arc<std::sync::Mutex<Option<HeldPlace>>>,
}

/// A client's fingerprint, and what it holds while the connection lives.
pub type HeldPlace = (String, Box<dyn std::any::Any + Send + Sync>);

/// The address the request's connection came from (for the access log).
#[derive(Clone, Copy)]
pub struct Peer(pub std::net::SocketAddr);

/// The unproven connections, oldest first: when each came, its proof, and what closes it.
#[derive(Default)]
struct Unproven {
    waiting: std::collections::VecDeque<(std::time::Instant, CancellationToken, CancellationToken)>,
}

/// How long a new connection has to send its first request's headers before a newer one may
/// close it: a client sends them at once, and a flood must open that many connections per
/// `GRACE` to keep one out.
const GRACE: Duration = Duration::from_millis(250);

impl Unproven {
    /// Takes a new connection in, closing the oldest unproven ones past `at_most` that had
    /// their `GRACE`.
    fn admit(&mut self, proven: CancellationToken, close: CancellationToken, at_most: usize) {
        let now = std::time::Instant::now();
        self.waiting
            .retain(|(_, proven, close)| !proven.is_cancelled() && !close.is_cancelled());
        while self.waiting.len() >= at_most.max(1) {
            match self.waiting.front() {
                Some((came, _, oldest)) if now.duration_since(*came) >= GRACE => {
                    oldest.cancel();
                    self.waiting.pop_front();
                }
                _ => break,
            }
        }
        self.waiting.push_back((now, proven, close));
    }

    /// Closes every unproven connection that had its `GRACE`: when no place is free, those are
    /// what holds them (a client with a token sends it at once).
    fn close_aged(&mut self) {
        let now = std::time::Instant::now();
        self.waiting.retain(|(came, proven, close)| {
            let aged = now.duration_since(*came) >= GRACE;
            if aged && !proven.is_cancelled() {
                close.cancel();
            }
            !aged && !proven.is_cancelled() && !close.is_cancelled()
        });
    }
}

/// A place for the next connection; while none is free, the unproven connections that had
/// their grace are closed to make one.
async fn place(
    places: &Arc<Semaphore>,
    unproven: &std::sync::Mutex<Unproven>,
) -> Result<tokio::sync::OwnedSemaphorePermit, tokio::sync::AcquireError> {
    loop {
        match tokio::time::timeout(GRACE, Arc::clone(places).acquire_owned()).await {
            Ok(place) => return place,
            Err(_) => {
                if let Ok(mut unproven) = unproven.lock() {
                    unproven.close_aged();
                }
            }
        }
    }
}

pub struct WatchedStream {
    inner: TcpStream,
    gone: CancellationToken,
    write_timeout: Duration,
    /// A write waiting for the client to read: until when, and the bytes the socket still had
    /// to deliver when the wait began.
    stalled: Option<Stall>,
}

struct Stall {
    deadline: Pin<Box<tokio::time::Sleep>>,
    queued: Option<usize>,
}

impl WatchedStream {
    /// A write could not go on: pending until the client reads, an error once it has read
    /// too little for the write timeout. The socket accepts more only once the client has read
    /// a good part of what it holds, which a client reading slowly but steadily may take longer
    /// than the timeout to do: what it reads meanwhile (the socket's send queue shrinking by
    /// `MIN_PROGRESS`, or to nothing) counts as progress; a byte now and then does not, or a
    /// client could keep its answer in the gateway's memory for as long as it liked.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        // Each turn sets a new deadline after progress; the queue only shrinks while the
        // write waits, so the turns are bounded by the bytes it holds.
        loop {
            let queued = send_queue(&self.inner);
            let timeout = self.write_timeout;
            let stall = self.stalled.get_or_insert_with(|| Stall {
                deadline: Box::pin(tokio::time::sleep(timeout)),
                queued,
            });
            if stall.deadline.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if !progressed(stall.queued, queued) {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client read too little of the response for the write timeout",
                )));
            }
            self.stalled = None;
        }
    }
}

/// Whether the client read enough of a stalled write's queue (`then` bytes when the wait
/// began, `now` at its end): `MIN_PROGRESS`, or all of it when it held less.
fn progressed(then: Option<usize>, now: Option<usize>) -> bool {
    match (then, now) {
        (Some(then), Some(now)) => now < then && then - now >= then.min(MIN_PROGRESS),
        _ => false,
    }
}

/// What a client must read of a stalled write's queue within the write timeout to go on.
const MIN_PROGRESS: usize = 16 * 1024;

/// The bytes a socket has not yet delivered to its peer (sent and not acknowledged, or not
/// sent): Linux's SIOCOUTQ; `None` elsewhere.
fn send_queue(stream: &TcpStream) -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (SIOCOUTQ for a socket) writes one int, to a local that outlives
        // the call, for a descriptor the stream owns.
        let done = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
        (done == 0).then(|| usize::try_from(queued).ok()).flatten()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = stream;
        None
    }
}

impl Drop for WatchedStream {
    fn drop(&mut self) {
        self.gone.cancel();
    }
}

/// How connections are served: the timeouts, and how many at once.
pub struct Limits {
    pub header_timeout: Duration,
    pub write_timeout: Duration,
    /// How long a connection may go without a request that carries a known token.
    pub login_timeout: Duration,
    pub max_connections: usize,
}

/// Serves `router` on `listener` (HTTP/1.1) until `shutdown` completes, then waits for the
/// connections in progress to end, at most `SHUTDOWN_WAIT`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let Limits {
        header_timeout,
        write_timeout,
        login_timeout,
        max_connections,
    } = limits;
    let unproven = Arc::new(std::sync::Mutex::new(Unproven::default()));
    let max_unproven = max_connections.div_ceil(2);
    let graceful = GracefulShutdown::new();
    // Every connection's token is a child: at the end of the wait, what still runs is told its
    // client is gone, and so cancels its query.
    let every = CancellationToken::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let places = Arc::new(Semaphore::new(max_connections.max(1)));
    loop {
        // A place first: at the limit, new connections wait in the listen queue.
        let place = tokio::select! {
            place = place(&places, &unproven) => place,
            () = &mut shutdown => break,
        };
        let Ok(place) = place else { break };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (inner, peer) = match accepted {
            Ok(accepted) => accepted,
            // Out of file descriptors and the like: wait, as axum's own listener does.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = inner.set_nodelay(true);
        let gone = every.child_token();
        let (proven, close) = (CancellationToken::new(), CancellationToken::new());
        if let Ok(mut unproven) = unproven.lock() {
            unproven.admit(proven.clone(), close.clone(), max_unproven);
        }
        // Each request of the connection carries its tokens (what axum's ConnectInfo reads,
        // and the proof the login check gives).
        // What the proof takes is given back when the connection is dropped: the service
        // below, which owns this, is dropped with it.
        let proof = Proven {
            proof: proven.clone(),
            held: Arc::default(),
        };
        let (router, token) = (router.clone(), gone.clone());
        let service = service_fn(move |mut request: Request<Incoming>| {
            request
                .extensions_mut()
                .insert(ConnectInfo(ClientGone(token.clone())));
            request.extensions_mut().insert(proof.clone());
            request.extensions_mut().insert(Peer(peer));
            router.clone().oneshot(request)
        });
        watch_for_close(&inner, gone.clone());
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
            let mut connection = std::pin::pin!(connection);
            // Until it is proven, dropping the connection (closed as the oldest unproven one,
            // or past the login timeout) closes it.
            let proving = tokio::select! {
                // A proof that came with a close (the queue closing it as the request's token
                // is checked) wins: its request runs.
                biased;
                () = proven.cancelled() => true,
                _ = connection.as_mut() => false,
                () = close.cancelled() => false,
                () = tokio::time::sleep(login_timeout) => false,
            };
            if proving {
                let _ = connection.await;
            }
            close.cancel();
            drop(place);
        });
    }
    drop(listener);
    // An event stream a client keeps open would hold the exit forever.
    if tokio::time::timeout(SHUTDOWN_WAIT, graceful.shutdown())
        .await
        .is_err()
    {
        every.cancel();
        // Time for the cancel requests of the calls that end so to reach the database.
        tokio::time::sleep(CANCEL_WAIT).await;
    }
}

/// How often a connection is looked at for a client that has closed it.
const CLOSE_CHECK: Duration = Duration::from_millis(500);

/// The event of a peer that closed its side (Linux's POLLRDHUP; elsewhere only a full hang-up
/// is seen).
#[cfg(target_os = "linux")]
const PEER_CLOSED: libc::c_short = libc::POLLRDHUP;
#[cfg(not(target_os = "linux"))]
const PEER_CLOSED: libc::c_short = libc::POLLHUP;

/// Fires `gone` when the client closes its side of the connection. hyper notices a close while
/// a response is pending only when it has nothing of the client's buffered: a byte sent after
/// the body (a pipelined request, or just one) would keep a closed connection's question
/// running until its answer. The check asks the socket itself, reading nothing; it ends when
/// the connection is dropped (which fires `gone` first, and only then closes the socket: a
/// check of a descriptor reused since can only fire a token already fired).
fn watch_for_close(stream: &TcpStream, gone: CancellationToken) {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CLOSE_CHECK);
        loop {
            tokio::select! {
                () = gone.cancelled() => return,
                _ = tick.tick() => {}
            }
            let mut watched = libc::pollfd {
                fd,
                events: PEER_CLOSED,
                revents: 0,
            };
            // The descriptor is the connection's until it is dropped, which fires `gone` before
            // it closes the socket; a drop between the check above and this poll may leave a
            // closed descriptor (POLLNVAL, not looked at) or one reused since, whose close can
            // only fire this token again, which changes nothing.
            // SAFETY: polls one pollfd on the stack, without waiting.
            let ready = unsafe { libc::poll(&mut watched, 1, 0) };
            let closed = PEER_CLOSED | libc::POLLHUP | libc::POLLERR;
            if ready > 0 && watched.revents & closed != 0 {
                gone.cancel();
                return;
            }
        }
    });
}

/// How long the calls cancelled at shutdown are given to send their cancel requests.
const CANCEL_WAIT: Duration = Duration::from_secs(2);

/// How long connections in progress are waited for at shutdown.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn unproven_connections_past_the_bound_close_the_oldest_after_its_grace() {
        let mut unproven = Unproven::default();
        let connection = || (CancellationToken::new(), CancellationToken::new());
        let (first, second, third) = (connection(), connection(), connection());
        unproven.admit(first.0.clone(), first.1.clone(), 2);
        unproven.admit(second.0.clone(), second.1.clone(), 2);
        // The second proves itself: it no longer counts, and is never closed as unproven.
        second.0.cancel();
        unproven.admit(third.0.clone(), third.1.clone(), 2);
        assert!(!first.1.is_cancelled() && !third.1.is_cancelled());
        // Within its grace, the oldest stays (the bound is passed for a moment).
        let fourth = connection();
        unproven.admit(fourth.0.clone(), fourth.1.clone(), 2);
        assert!(!first.1.is_cancelled());
        std::thread::sleep(GRACE);
        let fifth = connection();
        unproven.admit(fifth.0.clone(), fifth.1.clone(), 2);
        assert!(
            first.1.is_cancelled() && third.1.is_cancelled(),
            "the oldest are closed"
        );
        assert!(!second.1.is_cancelled() && !fourth.1.is_cancelled());
        assert_eq!(unproven.waiting.len(), 2);
    }

    /// Writes `total` bytes to a watched connection whose client, with small socket buffers,
    /// reads `chunk` bytes every `pause` (`None`: reads nothing until the write is over).
    /// Returns what the client received and whether the write failed.
    fn serve_to(
        reader: Option<(usize, Duration)>,
        total: usize,
        timeout: Duration,
    ) -> (usize, bool) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.set_send_buffer_size(128 * 1024).unwrap();
            socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let listener = socket.listen(1).unwrap();
            let address = listener.local_addr().unwrap();
            // Sent when the write is over: whether it failed.
            let (done_tx, done_rx) = std::sync::mpsc::channel::<bool>();
            let client = std::thread::spawn(move || {
                let connected = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(async {
                        let socket = tokio::net::TcpSocket::new_v4().unwrap();
                        socket.set_recv_buffer_size(16 * 1024).unwrap();
                        socket.connect(address).await.unwrap()
                    });
                let mut stream = connected.into_std().unwrap();
                stream.set_nonblocking(false).unwrap();
                if reader.is_none() {
                    let _ = done_rx.recv();
                }
                let (chunk, pause) = reader.unwrap_or((64 * 1024, Duration::ZERO));
                let mut buffer = vec![0u8; chunk];
                let mut received = 0;
                while let Ok(n @ 1..) = stream.read(&mut buffer) {
                    received += n;
                    // What a cut connection's socket still holds says nothing more.
                    if done_rx.try_recv() == Ok(true) {
                        break;
                    }
                    std::thread::sleep(pause);
                }
                received
            });
            let (inner, _) = listener.accept().await.unwrap();
            let mut stream = WatchedStream {
                inner,
                gone: CancellationToken::new(),
                write_timeout: timeout,
                stalled: None,
            };
            let data = vec![b'x'; total];
            let mut written = 0;
            let failed = loop {
                if written == total {
                    break false;
                }
                let wrote = std::future::poll_fn(|cx| {
                    Pin::new(&mut stream).poll_write(cx, &data[written..])
                })
                .await;
                match wrote {
                    Ok(n) => written += n,
                    Err(_) => break true,
                }
            };
            drop(stream);
            let _ = done_tx.send(failed);
            (client.join().unwrap(), failed)
        })
    }

    #[test]
    fn a_client_that_reads_slowly_but_steadily_gets_the_whole_response() {
        // 80 kB/s: the socket takes more only after about a second each time, longer than
        // the timeout, but the client reads all along.
        let total = 512 * 1024;
        let (received, failed) = serve_to(
            Some((8 * 1024, Duration::from_millis(100))),
            total,
            Duration::from_millis(500),
        );
        assert!(!failed, "cut after {received} bytes");
        assert_eq!(received, total);
    }

    #[test]
    fn only_a_read_of_16_kb_or_of_everything_queued_is_progress() {
        assert!(progressed(Some(100_000), Some(80_000)));
        assert!(!progressed(Some(100_000), Some(99_000)), "a trickle");
        assert!(progressed(Some(4_000), Some(0)), "a small queue read whole");
        assert!(!progressed(Some(4_000), Some(1)));
        assert!(!progressed(Some(100_000), Some(100_000)));
        assert!(!progressed(None, None), "no queue to read elsewhere");
    }

    #[test]
    fn a_client_that_reads_nothing_is_disconnected() {
        let total = 8 << 20;
        let (received, failed) = serve_to(None, total, Duration::from_millis(300));
        assert!(failed);
        assert!(received < total, "{received}");
    }
}
