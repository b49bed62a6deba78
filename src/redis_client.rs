//! The optional Redis connection (`sql_query_engine.redis_url`): conversations, progress events
//! and the value index's reads, shared by every connection to every node of a deployment.
//!
//! Redis is never required. Every call is bounded by `sql_query_engine.redis_timeout` and waits
//! interruptibly (query cancel still works); when Redis is unreachable, slow or restarting, the
//! call returns `None`, the caller falls back to backend memory, a WARNING is given once per
//! backend, and Redis is tried again a few seconds later.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::settings;
use crate::wait::{run_interruptible, WaitError};

/// How long an unavailable Redis is left alone before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

type Shared = Arc<Mutex<Option<Connection>>>;

/// Roles whose view of Redis a backend keeps, at most (a pooled backend serves many).
const MAX_ROLES_SEEN: usize = 256;

#[derive(Default)]
struct State {
    /// The URL the connection belongs to.
    url: Option<String>,
    connection: Shared,
    /// Until when Redis is left alone, by the role whose call found it unavailable: a role
    /// that lowered its own `redis_timeout` judges Redis by its own measure, and a failure
    /// says nothing of Redis for the other roles this backend serves.
    down_until: HashMap<pgrx::pg_sys::Oid, Instant>,
    /// The roles told that Redis is unavailable (once each per connection).
    warned: HashSet<pgrx::pg_sys::Oid>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Whether Redis is configured at all.
pub fn configured() -> bool {
    settings::redis_url().is_some()
}

/// Runs `command` on Redis. `None` when Redis is not configured or not available in time.
pub fn call<T, F>(command: F) -> Option<T>
where
    T: Send + 'static,
    F: FnOnce(&mut Connection) -> ::redis::RedisResult<T> + Send + 'static,
{
    let url = settings::redis_url()?;
    let timeout = Duration::from_millis(settings::redis_timeout_ms());
    let role = crate::subxact::acting_role();
    let shared = STATE.with_borrow_mut(|state| {
        if state.url.as_deref() != Some(url.as_str()) {
            *state = State {
                url: Some(url.clone()),
                ..State::default()
            };
        }
        match state.down_until.get(&role) {
            Some(until) if Instant::now() < *until => None,
            _ => Some(Arc::clone(&state.connection)),
        }
    })?;
    let target = url.clone();
    // An error is Redis's (unreachable, slow, gone: `true`) or the call's own (a reply larger
    // than a call may read: `false`, which says nothing of Redis for the next call).
    let work = move || -> Result<T, (String, bool)> {
        // A call abandoned by an earlier cancel may still hold the connection: then give up
        // (this call's misfortune, not Redis's).
        let mut slot = match shared.try_lock() {
            Ok(slot) => slot,
            // An earlier call panicked holding it: its connection is in no known state.
            Err(std::sync::TryLockError::Poisoned(poisoned)) => {
                let mut slot = poisoned.into_inner();
                *slot = None;
                slot
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(("busy with an earlier call".to_string(), false))
            }
        };
        // A kept connection the server has closed since (its idle timeout) or that holds
        // bytes nobody asked for is left for a new one: nothing was sent on it.
        if slot.as_ref().is_some_and(Connection::has_stray_bytes) {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(Connection::open(&target, timeout).map_err(|e| (e.to_string(), true))?);
        }
        let connection = slot.as_mut().ok_or(("no connection".to_string(), true))?;
        connection.reader.get_mut().deadline = Instant::now() + timeout;
        let result = command(connection);
        let down = !connection.oversized;
        result.map_err(|e| {
            *slot = None;
            (e.to_string(), down)
        })
    };
    let outcome =
        match run_interruptible(Instant::now() + timeout + Duration::from_millis(200), work) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(failed)) => Err(failed),
            // No helper was free: the call's, not Redis's.
            Err(WaitError::Busy) => Err(("no helper thread was free".to_string(), false)),
            Err(_) => Err((format!("no answer within {} ms", timeout.as_millis()), true)),
        };
    match outcome {
        Ok(value) => {
            STATE.with_borrow_mut(|state| state.down_until.remove(&role));
            Some(value)
        }
        Err((cause, false)) => {
            crate::error::debug(format!(
                "sql_query_engine: a Redis reply was not read: {cause}"
            ));
            None
        }
        Err((cause, true)) => {
            let first = STATE.with_borrow_mut(|state| {
                let now = Instant::now();
                if state.down_until.len() >= MAX_ROLES_SEEN {
                    state.down_until.retain(|_, until| now < *until);
                }
                if state.down_until.len() < MAX_ROLES_SEEN {
                    state.down_until.insert(role, now + RETRY_AFTER);
                }
                // The connection may be half-used by the abandoned call: start afresh.
                state.connection = Shared::default();
                state.warned.len() < MAX_ROLES_SEEN && state.warned.insert(role)
            });
            if first {
                // Where Redis is, and why it failed, is for the server log alone: the setting
                // is hidden from other roles.
                crate::error::tell(
                    pgrx::PgLogLevel::LOG_SERVER_ONLY,
                    pgrx::PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
                    format!(
                        "sql_query_engine: Redis at {} is unavailable ({})",
                        crate::urls::redact_url(&url),
                        crate::text::escaped_line(&crate::urls::redact(&cause, &url))
                    ),
                );
                crate::error::warning(
                    "sql_query_engine: Redis is unavailable (the server log says why); \
                     conversation context, progress events and the schema cache use backend \
                     memory"
                        .to_string(),
                );
            }
            None
        }
    }
}

/// A Redis key (or channel) namespaced by cluster, database and role: one role never reads
/// another's data, and a role that is dropped and created again under the same name, or
/// renamed, is still told apart (OIDs). The cluster is its system identifier, which a primary
/// shares with its standbys: OIDs repeat between clusters (two made from one dump), and two
/// that share a Redis would otherwise share their keys. A copy of a cluster's files (a base
/// backup, a snapshot) keeps it, and shares its keys with the original (README, "Scaling
/// out").
pub fn key(kind: &str, name: &str) -> String {
    // SAFETY: reads of backend state.
    let role = unsafe { pgrx::pg_sys::GetUserId() };
    format!("{}:{}:{kind}:{name}", database_prefix(), role.to_u32())
}

/// Bytes a role may write to Redis in `BUDGET_WINDOW_S`, at most, for each kind of write
/// (`Share`): a Redis is shared by every role, and what one role fills it with (a table
/// re-created for each new read, a session per question) would evict or refuse every other
/// role's, or exhaust its host.
pub const BUDGET_BYTES: u64 = 64 << 20;
pub const BUDGET_WINDOW_S: u64 = 600;

/// Adds ARGV[1] to the role's count, which starts (and expires) with the window's first write.
const SPEND_SCRIPT: &str = r"
local spent = redis.call('INCRBY', KEYS[1], ARGV[1])
if redis.call('TTL', KEYS[1]) < 0 then
    redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return spent
";

/// What a write to Redis is counted against: a role's turns apart from the value reads it
/// shares (which another role's tables, re-created, may make it read and share again).
#[derive(Clone, Copy)]
pub enum Share {
    Turns,
    Values,
}

/// The key that counts what the current role wrote of `share` in the window.
pub fn budget_key(share: Share) -> String {
    key(
        "budget",
        match share {
            Share::Turns => "turns",
            Share::Values => "values",
        },
    )
}

/// Whether the current role may write `bytes` more of `share` to Redis now (counted either
/// way); `None` when Redis is not available. For writes that live `BUDGET_WINDOW_S` at most
/// (turns pay inside their own script: `session`).
pub fn spend(share: Share, bytes: usize) -> Option<bool> {
    let key = budget_key(share);
    let bytes = bytes as u64;
    let spent: Option<u64> = call(move |c| {
        ::redis::cmd("EVAL")
            .arg(SPEND_SCRIPT)
            .arg(1)
            .arg(&key)
            .arg(bytes)
            .arg(BUDGET_WINDOW_S)
            .query(c)
    });
    spent.map(|spent| spent <= BUDGET_BYTES)
}

/// What a role's share of Redis is, for each kind of write, as messages say it.
pub const SHARE: &str = "64 MB in 10 minutes";

/// A Redis key for what every role of a database shares (the value index's reads of relations
/// whose read is the same for every role that may read them): namespaced by the cluster and
/// the database alone, and never equal to a role's key (`key`), whose fourth part is a number.
pub fn database_key(kind: &str, name: &str) -> String {
    format!("{}:shared:{kind}:{name}", database_prefix())
}

/// `sql_query_engine:<system identifier>:<database OID>`.
fn database_prefix() -> String {
    // SAFETY: reads of backend state (the identifier is read from pg_control at start).
    let (system, database) = unsafe {
        (
            pgrx::pg_sys::GetSystemIdentifier(),
            pgrx::pg_sys::MyDatabaseId,
        )
    };
    format!("sql_query_engine:{system}:{}", database.to_u32())
}

/// Bytes of replies one call may read: what a Redis (or whoever answers at its address) sends
/// beyond it is not read into the backend's memory.
const MAX_REPLY_BYTES: usize = 64 << 20;
/// What a reply refused for its size is called.
const TOO_LARGE: &str = "a reply larger than allowed";
/// Longest line of a reply (a type and length, a status, an error).
const MAX_LINE_BYTES: usize = 64 << 10;
/// Deepest nesting of arrays in a reply (the extension's own replies nest two deep).
const MAX_DEPTH: usize = 8;
/// Bytes each element of an array is charged beyond its own: what it costs decoded (a
/// `redis::Value`, then the Rust value it is read as).
const ELEMENT_COST: usize = 64;

/// A connection to Redis (RESP2, over TCP or a Unix socket) whose replies are bounded: in
/// bytes (`MAX_REPLY_BYTES` per call, an array's elements charged what they cost decoded), in
/// nesting, and in time (every read and write ends by the call's deadline). The `redis`
/// crate's own connection reads a reply of whatever length it announces, also in a helper
/// thread the call has given up on; this one uses that crate only to write commands and to
/// decode the bytes of a reply it has bounded.
pub struct Connection {
    reader: BufReader<Timed>,
    db: i64,
    open: bool,
    /// Whether the last reply was refused for its size (the call's fault, not Redis's).
    oversized: bool,
    /// Bytes the next exchange's replies may take (`limit_next`), then `MAX_REPLY_BYTES` again.
    next_limit: usize,
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// The socket, each read and write of which ends by `deadline` (a socket's own timeout counts
/// per call: a server sending a byte now and then would hold a read of many for ever).
struct Timed {
    stream: Stream,
    deadline: Instant,
}

impl Timed {
    /// Sets the socket's timeouts to what is left until the deadline; `TimedOut` once past it.
    fn arm(&self) -> io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        match &self.stream {
            Stream::Tcp(s) => {
                s.set_read_timeout(Some(left))?;
                s.set_write_timeout(Some(left))
            }
            Stream::Unix(s) => {
                s.set_read_timeout(Some(left))?;
                s.set_write_timeout(Some(left))
            }
        }
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        match &mut self.stream {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        match &mut self.stream {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Connects to the Unix socket `path` without waiting: a server that accepts no connection
/// (stopped, its backlog full) would hold a blocking connect, and the helper thread it runs in,
/// for ever.
fn connect_unix(path: &std::path::Path) -> io::Result<UnixStream> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data, valid zeroed.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= address.sun_path.len() {
        return Err(invalid("the Redis socket's path is too long"));
    }
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, from) in address.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    // Close-on-exec from the start where the system can (a fork between two calls would
    // otherwise inherit it).
    #[cfg(target_os = "linux")]
    let flags = libc::SOCK_CLOEXEC;
    #[cfg(not(target_os = "linux"))]
    let flags = 0;
    // SAFETY: socket has no memory arguments; it returns a new descriptor or -1.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | flags, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor socket just opened, owned by nothing else (closed on every path).
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // SAFETY: sets the close-on-exec flag of the descriptor `stream` owns.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    stream.set_nonblocking(true)?;
    // SAFETY: connects the descriptor to an address of its own size, which it only reads.
    let connected = unsafe {
        libc::connect(
            fd,
            (&address as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    // A Unix socket connects at once or not at all (EAGAIN: the backlog is full).
    if connected != 0 {
        return Err(io::Error::last_os_error());
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl Connection {
    /// Connects to `url` (`redis://[user:password@]host[:port][/db]` or
    /// `redis+unix:///path[?db=N]`) within `timeout`, authenticates and selects the database.
    fn open(url: &str, timeout: Duration) -> ::redis::RedisResult<Connection> {
        use ::redis::{ConnectionAddr, IntoConnectionInfo};
        let info = url.into_connection_info()?;
        let stream = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let mut last = invalid(format!("{host} has no address"));
                let mut connected = None;
                for address in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&address, timeout) {
                        Ok(stream) => {
                            connected = Some(stream);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let stream = connected.ok_or(last)?;
                stream.set_nodelay(true)?;
                Stream::Tcp(stream)
            }
            ConnectionAddr::Unix(path) => Stream::Unix(connect_unix(path)?),
            _ => return Err(invalid("TLS connections to Redis are not supported").into()),
        };
        let settings = info.redis_settings();
        let mut connection = Connection {
            reader: BufReader::new(Timed {
                stream,
                deadline: Instant::now() + timeout,
            }),
            db: settings.db(),
            open: true,
            oversized: false,
            next_limit: MAX_REPLY_BYTES,
        };
        if let Some(password) = settings.password() {
            let mut auth = ::redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password).exec(&mut connection)?;
        }
        if settings.db() != 0 {
            ::redis::cmd("SELECT")
                .arg(settings.db())
                .exec(&mut connection)?;
        }
        Ok(connection)
    }

    /// Whether bytes nobody asked for wait on the connection: a reply left over (a proxy that
    /// sent one twice) would be read as the next command's.
    fn has_stray_bytes(&self) -> bool {
        use std::os::fd::AsRawFd;
        if !self.reader.buffer().is_empty() {
            return true;
        }
        let fd = match &self.reader.get_ref().stream {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        };
        let mut byte = 0u8;
        // SAFETY: peeks at most one byte into `byte` from a socket this connection owns,
        // without waiting.
        let peeked = unsafe {
            libc::recv(
                fd,
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        // A byte waiting, the peer gone (0) or the connection broken (an error other than
        // "nothing to read now"): not a connection to ask.
        if peeked >= 0 {
            return true;
        }
        let error = io::Error::last_os_error().kind();
        !matches!(
            error,
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        )
    }

    /// Reads one reply whole, as its bytes, taking them from `budget`.
    fn reply(&mut self, budget: &mut usize) -> io::Result<Vec<u8>> {
        let mut raw = Vec::new();
        self.value(&mut raw, budget, 0)?;
        Ok(raw)
    }

    /// Reads one value of a reply onto `raw`.
    fn value(&mut self, raw: &mut Vec<u8>, budget: &mut usize, depth: usize) -> io::Result<()> {
        let start = raw.len();
        self.line(raw, budget)?;
        let line = &raw[start..raw.len() - 2];
        let Some((&kind, rest)) = line.split_first() else {
            return Err(invalid("an empty line"));
        };
        let number = || -> io::Result<i64> {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| invalid("a length that is no number"))
        };
        match kind {
            b'+' | b'-' | b':' => Ok(()),
            b'$' => {
                let Ok(length) = usize::try_from(number()?) else {
                    return Ok(()); // $-1: nil
                };
                let wanted = length.checked_add(2).filter(|n| *n <= *budget);
                let mut left = wanted.ok_or_else(|| invalid(TOO_LARGE))?;
                *budget -= left;
                // Grown as the bytes arrive, not by what the server announced.
                while left > 0 {
                    let available = self.reader.fill_buf()?;
                    if available.is_empty() {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    let taken = available.len().min(left);
                    raw.extend_from_slice(&available[..taken]);
                    self.reader.consume(taken);
                    left -= taken;
                }
                if !raw.ends_with(b"\r\n") {
                    return Err(invalid("a bulk string not ended by CRLF"));
                }
                Ok(())
            }
            b'*' => {
                let Ok(count) = usize::try_from(number()?) else {
                    return Ok(()); // *-1: nil
                };
                if depth >= MAX_DEPTH {
                    return Err(invalid("a reply nested too deeply"));
                }
                // Each element takes three bytes at least ("+\r\n") and becomes a value of its
                // own once decoded: it is charged what that value costs too.
                if count.saturating_mul(3 + ELEMENT_COST) > *budget {
                    return Err(invalid(TOO_LARGE));
                }
                for _ in 0..count {
                    *budget = budget
                        .checked_sub(ELEMENT_COST)
                        .ok_or_else(|| invalid(TOO_LARGE))?;
                    self.value(raw, budget, depth + 1)?;
                }
                Ok(())
            }
            _ => Err(invalid("a reply of a type RESP2 does not have")),
        }
    }

    /// Reads one line, with its CRLF, onto `raw`.
    fn line(&mut self, raw: &mut Vec<u8>, budget: &mut usize) -> io::Result<()> {
        let limit = MAX_LINE_BYTES.min(*budget);
        let start = raw.len();
        loop {
            let available = self.reader.fill_buf()?;
            if available.is_empty() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let (taken, done) = match available.iter().position(|&b| b == b'\n') {
                Some(at) => (at + 1, true),
                None => (available.len(), false),
            };
            raw.extend_from_slice(&available[..taken]);
            self.reader.consume(taken);
            if raw.len() - start > limit {
                // Past what is left of the call's bytes, the call's fault; past the longest
                // line, the server's.
                return Err(invalid(if limit < MAX_LINE_BYTES {
                    TOO_LARGE
                } else {
                    "a reply line longer than allowed"
                }));
            }
            if done {
                break;
            }
        }
        *budget -= raw.len() - start;
        // A type byte and CRLF at least, the CRLF this line's own.
        let line = &raw[start..];
        if line.len() < 3 || !line.ends_with(b"\r\n") {
            return Err(invalid("a line not ended by CRLF"));
        }
        Ok(())
    }

    /// Bounds the replies of the next command (or pipeline) to `bytes`, below `MAX_REPLY_BYTES`:
    /// for a caller that keeps what it reads across calls and bounds it in all. A reply past it
    /// is refused unread, as one past `MAX_REPLY_BYTES` is.
    pub fn limit_next(&mut self, bytes: usize) -> &mut Self {
        self.next_limit = bytes.min(MAX_REPLY_BYTES);
        self
    }

    /// Sends `command` and reads `count` replies, bounded together.
    fn exchange(
        &mut self,
        command: &[u8],
        count: usize,
    ) -> ::redis::RedisResult<Vec<::redis::Value>> {
        self.oversized = false;
        let result = (|| -> ::redis::RedisResult<Vec<::redis::Value>> {
            if self.has_stray_bytes() {
                return Err(invalid("bytes no command asked for, or a closed connection").into());
            }
            self.reader.get_mut().write_all(command)?;
            let mut budget = std::mem::replace(&mut self.next_limit, MAX_REPLY_BYTES);
            let mut values = Vec::with_capacity(count.min(1024));
            for _ in 0..count {
                let raw = self.reply(&mut budget)?;
                values.push(::redis::parse_redis_value(&raw)?);
            }
            Ok(values)
        })();
        if let Err(e) = &result {
            // Whatever is left of a reply would be read as the next one's.
            self.open = false;
            self.oversized = e.to_string().contains(TOO_LARGE);
        }
        result
    }
}

impl ::redis::ConnectionLike for Connection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> ::redis::RedisResult<::redis::Value> {
        self.exchange(cmd, 1)?
            .pop()
            .ok_or_else(|| invalid("no reply").into())
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> ::redis::RedisResult<Vec<::redis::Value>> {
        let mut values = self.exchange(cmd, offset.saturating_add(count))?;
        Ok(values.split_off(offset.min(values.len())))
    }

    fn get_db(&self) -> i64 {
        self.db
    }

    fn check_connection(&mut self) -> bool {
        ::redis::cmd("PING").query::<String>(self).is_ok()
    }

    fn is_open(&self) -> bool {
        self.open
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server at a local port that answers each command it reads with the next of `replies`
    /// (after the AUTH its URL asks for), and the URL that reaches it.
    fn server(replies: Vec<Vec<u8>>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            for reply in replies {
                if socket.read(&mut buf).unwrap_or(0) == 0 {
                    return;
                }
                let _ = socket.write_all(&reply);
            }
            std::thread::sleep(Duration::from_millis(500));
        });
        format!("redis://:secret@127.0.0.1:{port}/0")
    }

    fn connect(replies: Vec<&[u8]>) -> Connection {
        let mut all = vec![b"+OK\r\n".to_vec()];
        all.extend(replies.into_iter().map(<[u8]>::to_vec));
        Connection::open(&server(all), Duration::from_secs(2)).unwrap()
    }

    #[test]
    fn replies_are_read_as_redis_sends_them() {
        let mut c = connect(vec![
            b"*3\r\n$1\r\na\r\n$-1\r\n$3\r\nb\r\n\r\n",
            b"+PONG\r\n:7\r\n",
        ]);
        let list: Vec<Option<String>> = ::redis::cmd("LRANGE").arg("k").query(&mut c).unwrap();
        assert_eq!(list, [Some("a".into()), None, Some("b\r\n".into())]);
        let (pong, n): (String, i64) = ::redis::pipe()
            .cmd("PING")
            .cmd("LLEN")
            .arg("k")
            .query(&mut c)
            .unwrap();
        assert_eq!((pong.as_str(), n), ("PONG", 7));
    }

    #[test]
    fn a_reply_larger_or_deeper_than_allowed_is_refused_unread() {
        let huge: &[u8] = b"$2000000000\r\nabc";
        let mut c = connect(vec![huge]);
        let error = ::redis::cmd("GET")
            .arg("k")
            .query::<String>(&mut c)
            .unwrap_err();
        assert!(error.to_string().contains("larger than allowed"), "{error}");
        assert!(!::redis::ConnectionLike::is_open(&c));
        let many: &[u8] = b"*2000000000\r\n";
        let mut c = connect(vec![many]);
        assert!(::redis::cmd("LRANGE").query::<Vec<String>>(&mut c).is_err());
        let deep = "*1\r\n".repeat(20) + ":1\r\n";
        let mut c = connect(vec![deep.as_bytes()]);
        let error = ::redis::cmd("EVAL").query::<i64>(&mut c).unwrap_err();
        assert!(error.to_string().contains("nested too deeply"), "{error}");
        let endless = vec![b'x'; MAX_LINE_BYTES + 10];
        let mut c = connect(vec![&endless]);
        assert!(::redis::cmd("PING").query::<String>(&mut c).is_err());
    }

    #[test]
    fn a_lower_limit_holds_for_the_next_command_only() {
        let reply: &[u8] = b"$10\r\n0123456789\r\n";
        let mut c = connect(vec![reply]);
        let error = ::redis::cmd("GET")
            .arg("k")
            .query::<String>(c.limit_next(8))
            .unwrap_err();
        assert!(error.to_string().contains("larger than allowed"), "{error}");
        // Also when what is left is less than the reply's first line.
        let mut c = connect(vec![reply]);
        let error = ::redis::cmd("GET")
            .arg("k")
            .query::<String>(c.limit_next(3))
            .unwrap_err();
        assert!(error.to_string().contains("larger than allowed"), "{error}");
        let mut c = connect(vec![reply, reply]);
        let first: String = ::redis::cmd("GET")
            .arg("k")
            .query(c.limit_next(64))
            .unwrap();
        let second: String = ::redis::cmd("GET").arg("k").query(&mut c).unwrap();
        assert_eq!(
            (first.as_str(), second.as_str()),
            ("0123456789", "0123456789")
        );
    }

    #[test]
    fn many_small_elements_are_charged_what_they_cost_decoded() {
        // 6 MB on the wire, over a gigabyte as decoded values.
        let mut many = b"*2000000\r\n".to_vec();
        many.extend(b"+\r\n".repeat(2_000_000));
        let mut c = connect(vec![&many]);
        let error = ::redis::cmd("LRANGE")
            .query::<Vec<String>>(&mut c)
            .unwrap_err();
        assert!(error.to_string().contains("larger than allowed"), "{error}");
    }

    #[test]
    fn a_server_that_sends_a_byte_now_and_then_is_left_at_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf);
            let _ = socket.write_all(b"$1000\r\n");
            for _ in 0..1000 {
                std::thread::sleep(Duration::from_millis(100));
                if socket.write_all(b"x").is_err() {
                    return;
                }
            }
        });
        let url = format!("redis://127.0.0.1:{port}/0");
        let mut c = Connection::open(&url, Duration::from_millis(500)).unwrap();
        let started = Instant::now();
        let error = ::redis::cmd("GET")
            .arg("k")
            .query::<String>(&mut c)
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "read for {:?}: {error}",
            started.elapsed()
        );
    }

    #[test]
    fn a_line_or_bulk_string_without_its_own_crlf_is_an_error_not_a_panic() {
        // `$0` then "X\r" where its CRLF should be: the next line would be a lone "\n".
        let mut c = connect(vec![b"*2\r\n$0\r\nX\r\n"]);
        assert!(::redis::cmd("LRANGE").query::<Vec<String>>(&mut c).is_err());
        let mut c = connect(vec![b"$1\r\nabc\r\n"]);
        assert!(::redis::cmd("GET").query::<String>(&mut c).is_err());
    }

    #[test]
    fn a_reply_nobody_asked_for_is_never_read_as_the_next_ones() {
        // The server answers the first command twice.
        let mut c = connect(vec![b":1\r\n:1\r\n", b":2\r\n"]);
        let first: i64 = ::redis::cmd("INCR").arg("k").query(&mut c).unwrap();
        assert_eq!(first, 1);
        std::thread::sleep(Duration::from_millis(100));
        assert!(::redis::cmd("INCR").arg("k").query::<i64>(&mut c).is_err());
        assert!(!::redis::ConnectionLike::is_open(&c));
    }

    #[test]
    fn a_unix_socket_that_accepts_nothing_fails_at_once() {
        let dir = std::env::temp_dir().join(format!("sqe-redis-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("redis.sock");
        let _ = std::fs::remove_file(&path);
        // A listener with the smallest backlog (std's asks the system's largest).
        let listener = {
            use std::os::fd::{FromRawFd, OwnedFd};
            use std::os::unix::ffi::OsStrExt;
            // SAFETY: a new socket, bound to a path that fits sockaddr_un and set listening
            // with a backlog of 0; the descriptor is owned by `listener` from here on.
            unsafe {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                assert!(fd >= 0);
                let owned = OwnedFd::from_raw_fd(fd);
                let mut address: libc::sockaddr_un = std::mem::zeroed();
                address.sun_family = libc::AF_UNIX as libc::sa_family_t;
                for (to, from) in address.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
                    *to = *from as libc::c_char;
                }
                let size = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                assert_eq!(
                    libc::bind(fd, (&address as *const libc::sockaddr_un).cast(), size),
                    0
                );
                assert_eq!(libc::listen(fd, 0), 0);
                owned
            }
        };
        let (done, result) = std::sync::mpsc::channel();
        let target = path.clone();
        std::thread::spawn(move || {
            // Connections nobody accepts fill the backlog; the one beyond it is refused.
            let mut kept = Vec::new();
            let failed = (0..100).find_map(|_| match connect_unix(&target) {
                Ok(stream) => {
                    kept.push(stream);
                    None
                }
                Err(e) => Some(e),
            });
            let _ = done.send(failed.map(|e| e.kind()));
        });
        let failed = result.recv_timeout(Duration::from_secs(10));
        drop(listener);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(failed, Ok(Some(io::ErrorKind::WouldBlock)));
    }

    #[test]
    fn an_error_reply_is_the_servers_error() {
        let mut c = connect(vec![b"-WRONGTYPE not a list\r\n"]);
        let error = ::redis::cmd("LRANGE")
            .query::<Vec<String>>(&mut c)
            .unwrap_err();
        assert!(error.to_string().contains("not a list"), "{error}");
    }
}
