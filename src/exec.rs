//! The sandbox: every statement the extension did not write, and every read it makes on its
//! own, is analysed, planned and run here: guarded, in an internal subtransaction that is always
//! rolled back, read-only, under a per-attempt statement timeout, a row cap and a byte cap. Any
//! error is caught whole (SQLSTATE, message, detail, hint, position) and the caller's
//! transaction goes on as if nothing happened. Checking alone (`nl_check`) runs here too:
//! parse analysis can run code.
//!
//! The statement that runs is the one the guard checked: its analyzed tree is rewritten,
//! planned (parallel plans allowed) and executed here, never parsed again from text. Rows go
//! to a receiver that stops the executor after `max_rows + 1` rows or `max_bytes` bytes (a row
//! count given to the executor would forbid parallel plans) and turns each into jsonb with
//! PostgreSQL's own `to_jsonb`, so numerics keep their scale and dates render as PostgreSQL
//! renders them; a column whose type would make `to_jsonb` look up a cast is written as its
//! text instead, so collecting results never runs a cast another role wrote.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};

use pgrx::pg_sys;
use pgrx::pg_sys::panic::{CaughtError, ErrorReportWithLevel};
use pgrx::PgList;

use crate::error::{SqlError, SqlState};
use crate::guard::{self, gate, Origin, Scope};
use crate::{compat, session_locks, settings, subxact};

/// How much of a result is kept at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_rows: usize,
    /// Bytes of the rows kept (as their raw size, and as their JSON text).
    pub max_bytes: usize,
}

impl Limits {
    /// What the settings allow a caller's query.
    pub fn from_settings() -> Limits {
        Limits {
            max_rows: settings::max_rows(),
            max_bytes: settings::max_result_bytes(),
        }
    }
}

/// What an attempt is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Run the query and keep at most what `Limits` allows.
    Run(Limits),
    /// Only plan it (`nl_generate`): the query is analyzed and planned, never executed.
    Plan,
    /// Only check it (`nl_check`): parse analysis and the guard, nothing planned or run.
    Check,
    /// Run it like `Run`, and keep its rows also as tuples of the query's own column types, in
    /// a store in the memory of `portal` (a cursor of the caller's transaction, made by
    /// `new_cursor`): the attempt that answers becomes the cursor (`finish_cursor`).
    Cursor {
        portal: pg_sys::Portal,
        limits: Limits,
    },
}

/// Rows of one successful query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResultSet {
    /// Column names in the query's order (duplicates made unique: `name`, `name_2`).
    pub columns: Vec<String>,
    /// One jsonb object per row, as PostgreSQL's text form.
    pub rows: Vec<String>,
    /// More rows existed than the limits let through; the rest were cut.
    pub truncated: bool,
    /// The setting that cut the result, when it was cut.
    pub cut_by: Option<&'static str>,
    /// For an empty result: the tables it read on which row-level security filters this role's
    /// rows, so that "empty because of row security" is told apart from "really empty".
    pub row_security: Vec<String>,
    /// For rows of a query of the repair loop: what makes them doubtful though it ran, read
    /// from its analyzed tree (`guard::doubts`), one line each.
    pub doubts: Vec<String>,
    /// For a query of the repair loop that ran and may be saved as a view (`nl_view`): its
    /// checked tree written out with every name qualified (`guard::qualified_text`), which
    /// binds what was checked wherever it is parsed again.
    pub qualified_sql: Option<String>,
    /// Parallel workers the executor launched (0 for a serial plan).
    pub parallel_workers: i32,
    /// The rows as tuples, for a cursor (`Mode::Cursor`).
    pub held: Option<Held>,
}

/// An attempt's rows as tuples, kept in a cursor's memory (`Mode::Cursor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    store: *mut pg_sys::Tuplestorestate,
    desc: pg_sys::TupleDesc,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Rows(ResultSet),
    Empty(ResultSet),
    /// Planned without error (`Mode::Plan`).
    Planned,
    /// Passed the guard (`Mode::Check`).
    Checked,
    Failed(SqlError),
    Refused(guard::Refusal),
}

impl Outcome {
    /// The result of a query the caller ran itself (`nl_run`, a correction): its rows, or its
    /// refusal or error as the error to raise; nothing for a check or a plan.
    pub fn into_result(self) -> crate::error::Result<Option<ResultSet>> {
        match self {
            Outcome::Rows(result) | Outcome::Empty(result) => Ok(Some(result)),
            Outcome::Refused(refusal) => Err(crate::error::Error::Refused(Box::new(refusal.error))),
            Outcome::Failed(error) => Err(crate::error::Error::Query(Box::new(error))),
            Outcome::Planned | Outcome::Checked => Ok(None),
        }
    }

    /// The outcome's name, as the trace and progress events show it.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Rows(_) => "rows",
            Outcome::Empty(_) => "empty",
            Outcome::Planned => "planned",
            Outcome::Checked => "checked",
            Outcome::Failed(_) => "error",
            Outcome::Refused(_) => "refused",
        }
    }

    /// The error, for a failed or refused attempt.
    /// Whether the loop stops at this outcome with the answer it has: a write refused after
    /// an answer, or PostgreSQL failing under the query (`SqlError::ends_run`).
    pub fn ends_run(&self) -> bool {
        match self {
            Outcome::Failed(e) => e.ends_run,
            Outcome::Refused(r) => r.ends_run,
            _ => false,
        }
    }

    pub fn error(&self) -> Option<&SqlError> {
        match self {
            Outcome::Failed(e) => Some(e),
            Outcome::Refused(r) => Some(&r.error),
            _ => None,
        }
    }

    /// The result, for an attempt that ran.
    pub fn result(&self) -> Option<&ResultSet> {
        match self {
            Outcome::Rows(r) | Outcome::Empty(r) => Some(r),
            _ => None,
        }
    }
}

/// Runs `sql`, the model's or the caller's, once. Errors of the query become
/// `Outcome::Failed`; an interrupt that is not ours (query cancel, the caller's own
/// statement_timeout, resource exhaustion) is re-raised after the subtransaction is rolled
/// back.
pub fn attempt(sql: &str, mode: Mode, timeout_ms: i32) -> Outcome {
    sandboxed(sql, mode, timeout_ms, Origin::Generated, None, None)
}

/// `attempt` for a query of the repair loop: also not run when its plan is absurd for a
/// question (`absurd_plan`), so that the model gets the reason as a repair instead of the query
/// running into the timeout, or when an IN subquery of it selects a column of the outer query
/// (`guard::outer_column_subquery`), which no result would show; its rows carry what makes them
/// doubtful (`ResultSet::doubts`). `scope`: for a query the caller did not write, the relations
/// it may name (`guard::Scope`). `saves`: the answer may be saved as a view (`nl_view`), whose
/// rows then carry the qualified text it is saved as (`ResultSet::qualified_sql`).
pub fn attempt_in_loop(
    sql: &str,
    mode: Mode,
    timeout_ms: i32,
    scope: Option<&Scope>,
    saves: bool,
) -> Outcome {
    let in_loop = InLoop {
        cost_limit: f64::from(timeout_ms.max(1)) * COST_PER_MS,
        saves,
    };
    sandboxed(
        sql,
        mode,
        timeout_ms,
        Origin::Generated,
        Some(in_loop),
        scope,
    )
}

/// How a query of the repair loop runs besides its mode: the plan cost above which it is
/// absurd (`absurd_plan`), and whether its answer may be saved as a view.
#[derive(Debug, Clone, Copy)]
struct InLoop {
    cost_limit: f64,
    saves: bool,
}

thread_local! {
    /// Queries of the extension running in this backend, nested or not.
    static RUNNING: Cell<u32> = const { Cell::new(0) };
}

/// The memory of one attempt (its parse, rewrite and plan trees, its executor state), current
/// until dropped, then deleted: the rollback of the sandbox's subtransaction frees none of it
/// (it is allocated in the caller's context), so a call's failed attempts, each with its sorts
/// and hash tables, would stay until the call ended. What an attempt hands back is Rust's own,
/// or in a cursor's memory (`Held`).
struct AttemptMemory {
    context: pg_sys::MemoryContext,
    caller: pg_sys::MemoryContext,
}

impl AttemptMemory {
    fn enter() -> AttemptMemory {
        // SAFETY: a new child of the current context, made current; `drop` puts the caller's
        // back and deletes it.
        unsafe {
            let caller = pg_sys::CurrentMemoryContext;
            let context = pg_sys::AllocSetContextCreateInternal(
                caller,
                c"sql_query_engine attempt".as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            );
            pg_sys::MemoryContextSwitchTo(context);
            AttemptMemory { context, caller }
        }
    }
}

impl Drop for AttemptMemory {
    fn drop(&mut self) {
        // SAFETY: the context `enter` made, after the subtransaction that used it ended; the
        // caller's context is current again before it is deleted.
        unsafe {
            pg_sys::MemoryContextSwitchTo(self.caller);
            pg_sys::MemoryContextDelete(self.context);
        }
    }
}

/// Counts a running query of the extension until dropped (also when an ERROR unwinds past it).
struct Running;

impl Running {
    fn enter() -> Running {
        RUNNING.set(RUNNING.get() + 1);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.set(RUNNING.get().saturating_sub(1));
    }
}

/// Refuses `RESET ALL`, `LOAD`, `ANALYZE` and `CHECKPOINT` run by code that a query of the
/// extension runs (a function of a view or a policy another role owns): PostgreSQL resets
/// every setting whoever asks, the ones that bound the query too (`temp_file_limit`, which
/// `max_query_temp_files` sets for the attempt); a library loaded stays, with the hooks it
/// installs, for the rest of the connection (a pooled one serves other roles next); ANALYZE
/// and a checkpoint change what no rollback undoes. All are allowed in a read-only
/// transaction. Called by the utility hook for every utility statement.
#[pgrx::pg_guard]
pub unsafe extern "C-unwind" fn refuse_backend_changes(statement: *mut pg_sys::PlannedStmt) {
    if RUNNING.get() == 0 {
        return;
    }
    // SAFETY: PostgreSQL passes a planned utility statement; a node is read as the struct its
    // tag names.
    let refused = unsafe {
        let node = (*statement).utilityStmt;
        match node.as_ref().map(|n| n.type_) {
            Some(pg_sys::NodeTag::T_VariableSetStmt)
                if (*node.cast::<pg_sys::VariableSetStmt>()).kind
                    == pg_sys::VariableSetKind::VAR_RESET_ALL =>
            {
                Some((
                    "RESET ALL",
                    "It would lift the bounds of the query (max_query_temp_files).",
                ))
            }
            Some(pg_sys::NodeTag::T_LoadStmt) => Some((
                "LOAD",
                "A library loaded stays for the rest of the connection, which no rollback \
                 undoes.",
            )),
            // ANALYZE writes a table's size into pg_class in place and resets its activity
            // counts, which no rollback undoes (VACUUM cannot run in a function at all).
            Some(pg_sys::NodeTag::T_VacuumStmt) => Some((
                "ANALYZE",
                "It writes what no rollback undoes: the table's size in pg_class, its counts \
                 of changes since the last ANALYZE.",
            )),
            Some(pg_sys::NodeTag::T_CheckPointStmt) => Some((
                "CHECKPOINT",
                "A checkpoint is the whole server's, and no rollback undoes it.",
            )),
            _ => None,
        }
    };
    if let Some((what, hint)) = refused {
        crate::error::Error::sql(
            "42501",
            format!("{what} may not be run by code that a query of sql_query_engine runs"),
            Some(hint),
        )
        .raise();
    }
}

/// Refuses a call of the extension's `function` made while one of its queries runs: by code
/// that query runs as the caller (a function of a view or a policy another role owns), which
/// would otherwise write turns into the caller's conversations or reset them, put questions to
/// the model in the caller's name, or record history and feedback as the caller. Also in a
/// parallel worker (code of a query's parallel plan; the count is per process) and wherever
/// PostgreSQL runs in parallel mode: the extension's functions are parallel-unsafe, so no
/// query of a caller's own puts them there.
pub fn outside_a_query(function: &str) -> crate::error::Result<()> {
    let refusal =
        |message: String, hint: &str| Err(crate::error::Error::sql("42501", message, Some(hint)));
    if RUNNING.get() > 0 {
        return refusal(
            format!("{function} may not be called by code that a query of sql_query_engine runs"),
            "A view's, a policy's or a function's code called the extension while it ran a query.",
        );
    }
    // SAFETY: reads the backend's parallel-mode flag.
    if unsafe { pg_sys::IsInParallelMode() } {
        return refusal(
            format!("{function} may not be called in parallel mode"),
            "It was called by a parallel worker, or by a function marked PARALLEL SAFE or \
             RESTRICTED: the extension's functions are PARALLEL UNSAFE.",
        );
    }
    Ok(())
}

/// How a query refused before it ran (its plan, its shape) is told: `prompt::shown_error`
/// withholds what follows when stored values are kept from the model.
pub const PLAN_REFUSED: &str = "the query was not run:";

/// Planner cost units per millisecond that no server reaches (default cost settings count a
/// sequential page read as 1): a plan estimated above `statement_timeout` times this is far
/// beyond what the timeout lets run.
const COST_PER_MS: f64 = 1e5;
/// Pairs of rows a join without any join condition may make before it is called a cartesian
/// product, and the rows each side must have.
const CARTESIAN_PAIRS: f64 = 1e8;
const CARTESIAN_SIDE_ROWS: f64 = 1000.0;

fn sandboxed(
    sql: &str,
    mode: Mode,
    timeout_ms: i32,
    origin: Origin,
    in_loop: Option<InLoop>,
    scope: Option<&Scope>,
) -> Outcome {
    let bytes = settings::max_query_memory_bytes();
    let kept_before = kept_memory();
    let retained = RETAINED.load(std::sync::atomic::Ordering::Relaxed);
    if retained >= bytes {
        end_connection(retained, bytes);
        return Outcome::Failed(retained_error(retained));
    }
    let (result, position, raw_sqlstate, ours, ran) = {
        // Dropped last, after the rollback: gives back the session locks the query's code took
        // (a generated query's: the extension's own reads run built-in code only, which takes
        // no lock it does not give back).
        let _locks = matches!(origin, Origin::Generated).then(session_locks::Watch::start);
        let _running = Running::enter();
        let reported = ErrorReported::push();
        let mut timer = StatementTimer::arm(timeout_ms);
        let watch = MemoryWatch::arm(bytes - retained);
        // Always rolled back: the query only read, and nothing it did may outlive it; nor its
        // memory.
        let memory = AttemptMemory::enter();
        let analysed = Analysed::start();
        let result =
            subxact::catching_everything(false, || run_guarded(sql, mode, origin, in_loop, scope));
        let ran = analysed.done();
        // A cancel or timeout the attempt ended with ends the call (`failure` raises it): the
        // caller's deadline, past, is not armed again behind it.
        timer.cancelled = result.is_err() && reported.sqlstate().is_some_and(|s| s.class() == "57");
        drop(memory);
        // PostgreSQL's own "out of memory" under the watch is the watch's hard limit.
        let out_of_memory = reported.sqlstate().is_some_and(|s| s.as_str() == "53200");
        let ours = if watch.exceeded() || (watch.armed() && out_of_memory) {
            Some(Cancelled::Memory)
        } else {
            timer.fired().then_some(Cancelled::Timeout)
        };
        (result, reported.position(), reported.sqlstate(), ours, ran)
    };
    // After the session locks are given back and the attempt's own cancels are disarmed: its
    // WARNING checks for interrupts, and a pending cancel raised there.
    note_kept(kept_before, bytes);
    match result {
        Ok(outcome) => outcome,
        Err(caught) => failure(*caught, position, raw_sqlstate, ours, ran, timeout_ms),
    }
}

thread_local! {
    /// Whether the attempt running in `sandboxed` got past analysis (`Analysed`).
    static ANALYSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Notes whether an attempt's query got past analysis, so that its error says whether it was
/// raised while the query read data; the attempt around it (if any) gets its own note back.
struct Analysed {
    outer: bool,
}

impl Analysed {
    fn start() -> Analysed {
        Analysed {
            outer: ANALYSED.replace(false),
        }
    }

    /// Called once analysis passed.
    fn passed() {
        ANALYSED.set(true);
    }

    fn done(self) -> bool {
        ANALYSED.get()
    }
}

impl Drop for Analysed {
    fn drop(&mut self) {
        ANALYSED.set(self.outer);
    }
}

/// Checks `sql` in the sandbox without planning or running it: the refusal, or the parser's
/// own error, as the error to raise. `scope`: for SQL the caller did not write (a verified
/// example), the relations it may name (`guard::Scope`).
pub fn check(sql: &str, scope: Option<&Scope>) -> Result<(), crate::error::Error> {
    use crate::error::Error;
    let timeout_ms = settings::statement_timeout_ms();
    match sandboxed(sql, Mode::Check, timeout_ms, Origin::Generated, None, scope) {
        Outcome::Refused(refusal) => Err(Error::Refused(Box::new(refusal.error))),
        Outcome::Failed(error) => Err(Error::Query(Box::new(error))),
        _ => Ok(()),
    }
}

/// What `scan_text_columns` read: how many rows, and each column's first distinct non-NULL
/// values in scan order.
pub struct Scanned {
    pub rows: usize,
    pub columns: Vec<Vec<String>>,
}

/// Bytes one of the extension's own reads may bring back.
const OWN_READ_BYTES: usize = 64 << 20;

/// Stored bytes of a value whose start an own read takes (`ValueLength::Cut`).
const CUT_READ_BYTES: usize = 1 << 20;

/// The values of `columns` (quoted names of text columns) in the first `limit` rows of `table`
/// (`ONLY schema.name`, or a partitioned `schema.name`), read as the caller but on the
/// extension's own behalf: the guard lets through only relations whose read runs no code and
/// built-in functions, and the runtime gate refuses everything else (`Origin::Own`). One result
/// row: the server aggregates the values into arrays, so a wide scan costs one row, not one per
/// table row. Values are cut to so many characters (`ValueLength::Cut`; left out when stored
/// in more than a megabyte), or left out when longer (`ValueLength::AtMost`), without
/// decompressing more of a long value than that (`substr` reads a slice, `octet_length` the
/// stored size); of each column, the first `keep` distinct values are kept. Operators are
/// written qualified: the caller's search path may put another `<=` before pg_catalog's.
/// `None` when the read failed or was refused. Columns are read in groups
/// (`MAX_VALUES_PER_READ`). `read` says which relation `table` must be, and what must hold of it
/// once locked.
pub fn scan_text_columns(
    table: &str,
    columns: &[&str],
    limit: usize,
    length: ValueLength,
    keep: usize,
    timeout_ms: i32,
    read: &OwnRead,
) -> Option<Scanned> {
    // In groups of columns, each read's values within MAX_VALUES_PER_READ, all within the time.
    let per_read = (MAX_VALUES_PER_READ / limit.max(1)).max(1);
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms.max(0) as u64);
    let (mut scanned, mut kept): (Option<Scanned>, usize) = (None, 0);
    for (n, group) in columns.chunks(per_read).enumerate() {
        // The first group has the whole time (a read given 1 ms is not one given none); the
        // others what is left of it.
        let left_ms = match n {
            0 => timeout_ms,
            _ => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
            }
        };
        if left_ms <= 0 {
            return None;
        }
        let group_read = OwnRead {
            relation: read.relation,
            columns: read.columns.as_ref().map(|numbers| {
                numbers
                    .iter()
                    .skip(n * per_read)
                    .take(group.len())
                    .copied()
                    .collect()
            }),
            still_readable: read.still_readable.clone(),
        };
        let part = scan_column_group(table, group, limit, length, keep, left_ms, &group_read)?;
        // All the groups together within what one read may bring back (what is kept of
        // them: each value's text and its count).
        kept += part
            .columns
            .iter()
            .flatten()
            .map(|v| v.len() + VALUE_BYTES)
            .sum::<usize>();
        if kept > OWN_READ_BYTES {
            return None;
        }
        match scanned.as_mut() {
            None => scanned = Some(part),
            // Each group read the table under its own snapshot: it was read to its end only if
            // each found fewer rows than it asked for.
            Some(all) => {
                all.rows = all.rows.max(part.rows);
                all.columns.extend(part.columns);
            }
        }
    }
    scanned
}

/// While alive, the planner looks up no statistics row: it takes a fixed width for every
/// column (`get_attavgwidth_hook`), and none for a column or an index (`get_relation_stats_hook`,
/// `get_index_stats_hook`: the cost of an index path, which any index the read's columns
/// cover makes, looks up its first column's). Planning an own read kept each such row, arrays
/// and all, in the connection's catalog cache for as long as it lives, and another role's
/// table may carry statistics of any size (`SET STATISTICS 10000`, PostgreSQL 18's
/// `pg_restore_attribute_stats`). An own read has no condition a statistic would estimate.
struct NoStatistics {
    width: pg_sys::get_attavgwidth_hook_type,
    relation: pg_sys::get_relation_stats_hook_type,
    index: pg_sys::get_index_stats_hook_type,
}

impl NoStatistics {
    fn set() -> NoStatistics {
        // SAFETY: the backend's own hooks, set on its only thread that runs PostgreSQL code;
        // `drop` puts the previous ones back (also when an ERROR unwinds past it).
        unsafe {
            let previous = NoStatistics {
                width: pg_sys::get_attavgwidth_hook,
                relation: pg_sys::get_relation_stats_hook,
                index: pg_sys::get_index_stats_hook,
            };
            pg_sys::get_attavgwidth_hook = Some(fixed_width);
            pg_sys::get_relation_stats_hook = Some(no_column_statistics);
            pg_sys::get_index_stats_hook = Some(no_index_statistics);
            previous
        }
    }
}

impl Drop for NoStatistics {
    fn drop(&mut self) {
        // SAFETY: as in `set`.
        unsafe {
            pg_sys::get_attavgwidth_hook = self.width;
            pg_sys::get_relation_stats_hook = self.relation;
            pg_sys::get_index_stats_hook = self.index;
        }
    }
}

/// The width the planner takes for a column of an own read (`NoStatistics`): any positive one
/// stops its look-up of statistics.
unsafe extern "C-unwind" fn fixed_width(
    _relation: pg_sys::Oid,
    _column: pg_sys::AttrNumber,
) -> i32 {
    32
}

/// A column's statistics for an own read (`NoStatistics`): taken care of, and none (the
/// planner then estimates without).
unsafe extern "C-unwind" fn no_column_statistics(
    _root: *mut pg_sys::PlannerInfo,
    _entry: *mut pg_sys::RangeTblEntry,
    _column: pg_sys::AttrNumber,
    _data: *mut pg_sys::VariableStatData,
) -> bool {
    true
}

/// An index column's statistics for an own read (`NoStatistics`): taken care of, and none.
unsafe extern "C-unwind" fn no_index_statistics(
    _root: *mut pg_sys::PlannerInfo,
    _index: pg_sys::Oid,
    _column: pg_sys::AttrNumber,
    _data: *mut pg_sys::VariableStatData,
) -> bool {
    true
}

/// Values one own read collects at most: a wide table's columns are read in groups. Parsed, a
/// value takes some 60 bytes where the read's byte bound counts 16, outside the memory watch:
/// 200 columns of 20,000 empty strings took hundreds of megabytes in one read.
const MAX_VALUES_PER_READ: usize = 500_000;

/// `scan_text_columns` of one group of columns, in one read.
fn scan_column_group(
    table: &str,
    columns: &[&str],
    limit: usize,
    length: ValueLength,
    keep: usize,
    timeout_ms: i32,
    read: &OwnRead,
) -> Option<Scanned> {
    let inner: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, column)| match length {
            // A value stored in more than CUT_READ_BYTES is left out: `substr` reads only a
            // slice of text, but a bpchar column comes to it through `text(bpchar)`, which
            // reads the whole value (`octet_length` reads only its header).
            ValueLength::Cut(chars) => format!(
                "CASE WHEN pg_catalog.octet_length({column}) OPERATOR(pg_catalog.<=) \
                 {CUT_READ_BYTES} THEN pg_catalog.substr({column}, 1, {chars}) END AS v{i}"
            ),
            // As text: a domain over text would make the aggregate an array of the domain,
            // which the own read's type rule refuses (converting to the base type runs no
            // code); a value longer than any kept is left out before it is converted.
            ValueLength::AtMost(max) => format!(
                "CASE WHEN pg_catalog.octet_length({column}) OPERATOR(pg_catalog.<=) {} \
                 THEN ({column})::pg_catalog.text END AS v{i}",
                4 * max
            ),
        })
        .collect();
    let outer: Vec<String> = (0..columns.len())
        .map(|i| match length {
            ValueLength::AtMost(max) => format!(
                "pg_catalog.array_agg(v{i}) FILTER (WHERE pg_catalog.octet_length(v{i}) \
                 OPERATOR(pg_catalog.<=) {} AND pg_catalog.length(v{i}) OPERATOR(pg_catalog.<=) {max}) AS v{i}",
                4 * max
            ),
            ValueLength::Cut(_) => format!("pg_catalog.array_agg(v{i}) AS v{i}"),
        })
        .collect();
    let sql = format!(
        "SELECT pg_catalog.count(*) AS n, {} FROM (SELECT {} FROM {table} LIMIT {limit}) s",
        outer.join(", "),
        inner.join(", ")
    );
    let limits = Limits {
        max_rows: 1,
        max_bytes: OWN_READ_BYTES,
    };
    let _expected = read.arm(columns);
    let _statistics = NoStatistics::set();
    let Outcome::Rows(result) =
        sandboxed(&sql, Mode::Run(limits), timeout_ms, Origin::Own, None, None)
    else {
        return None;
    };
    let row: serde_json::Value = serde_json::from_str(result.rows.first()?).ok()?;
    let values = |i: usize| -> Vec<String> {
        let read = row[format!("v{i}")]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        crate::text::first_distinct(read.iter().filter_map(|v| v.as_str()), keep)
    };
    Some(Scanned {
        rows: row["n"].as_u64().map_or(0, |n| n as usize),
        columns: (0..columns.len()).map(values).collect(),
    })
}

/// What an own read must read: the relation (by OID) and, when its values are shared, in the
/// order the read names them, its columns (by number). Checked once the read is analysed,
/// while it holds its lock (no rename can come between the check and the read).
pub struct OwnRead {
    pub relation: pg_sys::Oid,
    pub columns: Option<Vec<i16>>,
    /// What must hold of the relation once the read has locked it, before the read is
    /// analysed (which opens it): `Some(why)` refuses the read. The schema's bounds on what
    /// opening it loads, measured again (`schema::catalog::own_read_still_bounded`), with the
    /// name the read reads it by still the relation's.
    pub still_readable: std::rc::Rc<dyn Fn() -> Option<String>>,
}

/// A relation, its columns when they are checked (each one's number and the name a read names
/// it by, quoted), and what must hold of it once locked (`OwnRead::still_readable`).
type Named = (
    pg_sys::Oid,
    Option<Vec<(i16, String)>>,
    std::rc::Rc<dyn Fn() -> Option<String>>,
);

thread_local! {
    /// The running own read's `OwnRead`, with the names it reads the columns by.
    static EXPECTED: std::cell::RefCell<Option<Named>> = const { std::cell::RefCell::new(None) };
}

/// Forgets the expected own read when dropped.
struct Expecting;

impl Drop for Expecting {
    fn drop(&mut self) {
        EXPECTED.with_borrow_mut(|e| *e = None);
    }
}

impl OwnRead {
    /// Expects the next own read to be this one, reading `columns` (quoted names).
    fn arm(&self, columns: &[&str]) -> Expecting {
        let named = self.columns.as_ref().map(|numbers| {
            numbers
                .iter()
                .zip(columns)
                .map(|(number, name)| (*number, name.to_string()))
                .collect()
        });
        EXPECTED
            .with_borrow_mut(|e| *e = Some((self.relation, named, self.still_readable.clone())));
        Expecting
    }
}

/// Why the own read about to be analysed may not be made (`OwnRead::still_readable`): also
/// when none is expected, since every own read says what it reads.
fn own_read_refused_before() -> Option<String> {
    let Some(still_readable) = EXPECTED.with_borrow(|e| e.as_ref().map(|(_, _, f)| f.clone()))
    else {
        return Some("the extension's own read does not say which relation it reads".into());
    };
    still_readable()
}

/// Why an analysed own read (naming `relations`) is not the one expected (`OwnRead`): another
/// relation, or a column by another number, than the schema context knew under the names it
/// reads by. Called while the read holds its relation's lock.
fn own_read_differs(relations: &[pg_sys::Oid]) -> Option<String> {
    let (relation, columns) = EXPECTED.with_borrow(|e| {
        e.as_ref()
            .map(|(relation, columns, _)| (*relation, columns.clone()))
    })?;
    if relations != [relation] {
        return Some("the relation it reads is not the one the schema context knew".into());
    }
    for (number, quoted) in columns.iter().flatten() {
        // SAFETY: catalog look-ups of a relation the analysis locked; a name PostgreSQL made.
        let shown = unsafe {
            let name = pg_sys::get_attname(relation, *number, true);
            if name.is_null() {
                return Some(format!("column {quoted} is gone"));
            }
            CStr::from_ptr(pg_sys::quote_identifier(name))
                .to_string_lossy()
                .into_owned()
        };
        if shown != *quoted {
            return Some(format!(
                "column {quoted} is not the one the schema context knew"
            ));
        }
    }
    None
}

/// How long the values of an own read may be.
#[derive(Debug, Clone, Copy)]
pub enum ValueLength {
    /// Cut to this many characters (samples: only the start is shown).
    Cut(usize),
    /// Left out when longer (the value index: longer texts are descriptions, not values).
    AtMost(usize),
}

/// What makes the rows of `query` doubtful (`guard::doubts`), read in a subtransaction of its
/// own: the check is optional, so its error (a catalog entry gone meanwhile) costs the doubts,
/// not the answer; a cancel, or a resource or system error, still ends the call.
///
/// # Safety
/// As `guard::doubts`.
unsafe fn doubts_of(query: *mut pg_sys::Query) -> Vec<String> {
    // SAFETY: the caller's contract; the subtransaction only reads the tree.
    subxact::in_subtransaction(false, || unsafe { guard::doubts(query) }).unwrap_or_default()
}

/// Whether an attempt's error is PostgreSQL failing under the query rather than the query
/// failing: the backend's own resources or system (memory, a full disk, an I/O error, an
/// internal error of PostgreSQL's C code). No repair mends it, so the loop stops there and the
/// call keeps the answer it has. Not those codes raised by a procedural language's code the
/// query ran (`RAISE ... USING ERRCODE 'XX000'`, which another role's view may hold: such an
/// attempt fails alone) or said by a remote server (`postgres_fdw`, `dblink`), nor the attempt's own `temp_file_limit` (53400: the query's size, as
/// the memory watch's bound is).
fn postgres_failed(report: &ErrorReportWithLevel, sqlstate: &SqlState) -> bool {
    /// Where PostgreSQL's procedural languages raise what their code asks for, and its
    /// foreign-data wrapper and dblink raise what a remote server said.
    const LANGUAGES: [&str; 6] = [
        "pl_exec.c",
        "plpy_elog.c",
        "plperl.c",
        "pltcl.c",
        "connection.c",
        "dblink.c",
    ];
    let by_a_language = LANGUAGES
        .iter()
        .any(|file| report.file().rsplit('/').next() == Some(*file));
    match sqlstate.class() {
        "53" => sqlstate.as_str() != "53400" && !by_a_language,
        "58" | "XX" => !by_a_language,
        _ => false,
    }
}

/// The error report of a caught error, whichever way it was raised.
fn report_of(caught: &CaughtError) -> &ErrorReportWithLevel {
    match caught {
        CaughtError::PostgresError(r)
        | CaughtError::ErrorReport(r)
        | CaughtError::RustPanic { ereport: r, .. } => r,
    }
}

/// Levels of arrays and objects a result row may nest (the row itself is one).
const MAX_JSON_DEPTH: usize = 120;

/// Characters of a query error's message, detail and hint kept, each.
const MAX_ERROR_CHARS: usize = 2000;

/// Bytes of PostgreSQL's long-lived memory that attempts left behind in this backend, together.
/// What an attempt adds to PostgreSQL's caches outlives its rollback and its memory watch: a
/// time zone's rules, 24 kB for each new zone a query names (`timezone('<Z1>0', t)`), a
/// catalog cache's entry for each name or OID that does not exist. Each attempt may add at
/// most `max_query_memory` less what earlier ones left. Once they left that much, the backend
/// ends after its transaction (`end_after_transaction`): a pooler or the gateway opens a new
/// one, whoever asks next. Without it, every attempt could leave another `max_query_memory` behind, until
/// the kernel's out-of-memory killer took the server down.
static RETAINED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether the backend ends once its transaction does.
static ENDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Adds what the attempt that began with `before` kept to what attempts left; past `bytes`
/// (`max_query_memory`), the backend ends after its transaction. Memory freed later is not
/// credited back: what attempts left cannot be told from other memory freed meanwhile, and
/// ending the backend costs its next caller a connection.
fn note_kept(before: u64, bytes: u64) {
    use std::sync::atomic::Ordering;
    let left = RETAINED.load(Ordering::Relaxed) + kept_memory().saturating_sub(before);
    RETAINED.store(left, Ordering::Relaxed);
    if left >= bytes {
        end_connection(left, bytes);
    }
}

/// Has the backend end after its transaction (once), and says so: attempts left `left` bytes
/// in its caches, as much as `bytes` (`max_query_memory`, as the current call has it).
fn end_connection(left: u64, bytes: u64) {
    if !ENDING.swap(true, std::sync::atomic::Ordering::Relaxed) {
        crate::error::warning(format!(
            "sql_query_engine: queries left {} MB in this connection's caches, as much as \
             sql_query_engine.max_query_memory ({} MB): the connection ends after this \
             transaction (PostgreSQL then says it terminates it); reconnect",
            left >> 20,
            bytes >> 20
        ));
    }
}

/// Ends the backend once its transaction has, when `ENDING`: what attempts left in its
/// caches goes with it. A SIGTERM to itself, as `pg_terminate_backend` sends, taken when the
/// backend next checks for interrupts, waiting for its client's next command: the
/// transaction's results and its commit have gone out by then (not at a procedure's own
/// COMMIT, after which it goes on).
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn end_after_transaction(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    let ended = matches!(
        event,
        pg_sys::XactEvent::XACT_EVENT_COMMIT
            | pg_sys::XactEvent::XACT_EVENT_ABORT
            | pg_sys::XactEvent::XACT_EVENT_PREPARE
    );
    // SAFETY: reads the running portal, null between statements; a procedure that commits
    // (`nl_call`) commits with its portal running, and goes on.
    let between_statements = unsafe { pg_sys::ActivePortal.is_null() };
    if ended && between_statements && ENDING.load(std::sync::atomic::Ordering::Relaxed) {
        // SAFETY: a signal to this process, whose handler PostgreSQL installed.
        unsafe { libc::kill(pg_sys::MyProcPid, libc::SIGTERM) };
    }
}

/// PostgreSQL's memory that outlives a statement and its transaction: all of it but the
/// transaction's, the portals', the current message's and the error handling's.
fn kept_memory() -> u64 {
    // The portals' top context is static to portalmem.c: it is the running portal's context's
    // ancestor just below the top context.
    // SAFETY: sums the memory contexts' own counters, on the backend's thread; a context that
    // does not exist (yet) is null and counts nothing.
    unsafe {
        let allocated = |context: pg_sys::MemoryContext| -> u64 {
            if context.is_null() {
                0
            } else {
                pg_sys::MemoryContextMemAllocated(context, true) as u64
            }
        };
        let top = pg_sys::TopMemoryContext;
        if top.is_null() {
            return 0;
        }
        let mut portals = pg_sys::PortalContext;
        while !portals.is_null() && (*portals).parent != top {
            portals = (*portals).parent;
        }
        // No portal runs (a call through the fast-path protocol): found by its name.
        let mut child = (*top).firstchild;
        for _ in 0..MAX_TOP_CHILDREN {
            if !portals.is_null() || child.is_null() {
                break;
            }
            if !(*child).name.is_null()
                && std::ffi::CStr::from_ptr((*child).name) == c"TopPortalContext"
            {
                portals = child;
            }
            child = (*child).nextchild;
        }
        allocated(top).saturating_sub(
            allocated(pg_sys::TopTransactionContext)
                + allocated(portals)
                + allocated(pg_sys::MessageContext)
                + allocated(pg_sys::ErrorContext),
        )
    }
}

/// Children of the top memory context looked at, at most, for the portals' (a backend has a
/// few dozen).
const MAX_TOP_CHILDREN: usize = 10_000;

/// The error of an attempt in a backend where earlier attempts left `retained` bytes.
fn retained_error(retained: u64) -> SqlError {
    SqlError {
        sqlstate: SqlState::OUT_OF_MEMORY,
        message: format!(
            "earlier queries of the extension left {} MB in this connection's caches, \
                 as much as sql_query_engine.max_query_memory ({} MB) allows: no more run on \
                 it, and it ends after this transaction",
            retained >> 20,
            settings::max_query_memory_bytes() >> 20
        ),
        hint: Some(
            "What a query adds to PostgreSQL's caches (a time zone's rules for each new zone \
                 it names, an entry for each name that does not exist) stays as long as the \
                 connection: reconnect."
                .into(),
        ),
        // The connection's resources, as PostgreSQL failing: nothing a repair can mend (not a
        // refused write).
        ends_run: true,
        ..Default::default()
    }
}

/// Why the extension cancelled an attempt itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cancelled {
    /// `statement_timeout` (the extension's) passed.
    Timeout,
    /// The backend grew past `max_query_memory` (`MemoryWatch`).
    Memory,
}

/// Turns a caught error into the attempt's outcome, or re-raises it when it is not the query's
/// fault.
fn failure(
    caught: CaughtError,
    position: Option<i32>,
    raw_sqlstate: Option<SqlState>,
    ours: Option<Cancelled>,
    ran: bool,
    timeout_ms: i32,
) -> Outcome {
    let report = report_of(&caught);
    // pgrx reports XX000 for a SQLSTATE it does not know; the error's own is the one last
    // reported, if pgrx does not know it either (else that report was another one: a notice,
    // or an error caught inside the query before this one was re-thrown without a report).
    let sqlstate = match SqlState::from_code(report.sql_error_code()) {
        SqlState::INTERNAL_ERROR => raw_sqlstate
            .filter(|raw| SqlState::from_code(raw.code()) == SqlState::INTERNAL_ERROR)
            .unwrap_or(SqlState::INTERNAL_ERROR),
        known => known,
    };
    // The watch's cancel, or, under its hard limit, PostgreSQL's own out-of-memory error.
    let ours = ours.filter(|cancel| {
        sqlstate == SqlState::QUERY_CANCELED
            || (matches!(cancel, Cancelled::Memory) && sqlstate == SqlState::OUT_OF_MEMORY)
    });
    // Any cancel that is not the watch's ends the call: the caller's own, its
    // `statement_timeout`, or one the query's code sent its own backend (it can anyway), or
    // that a procedural language raised again as its own.
    if matches!(caught, CaughtError::RustPanic { .. })
        || (ours.is_none() && sqlstate.class() == "57")
    {
        caught.rethrow();
    }
    // What a query's error says may hold any value (a view's RAISE, a failed conversion of a
    // long text): it goes to the model, the trace and the history, so only so much of it.
    let said = |text: &str| crate::text::at_most(text, MAX_ERROR_CHARS);
    let mut error = SqlError {
        sqlstate,
        message: said(report.message()),
        detail: report.detail().map(said),
        hint: report.hint().map(said),
        position,
        ran,
        ends_run: ours.is_none() && postgres_failed(report, &sqlstate),
        names_estimates: false,
    };
    match ours {
        Some(Cancelled::Timeout) => {
            // The extension's own words, whatever the query's code raised once cancelled.
            error.ran = false;
            error.message = "canceling statement due to statement timeout".into();
            error.detail = None;
            error.hint = Some(format!(
                "The query ran longer than sql_query_engine.statement_timeout ({timeout_ms} ms)."
            ));
        }
        Some(Cancelled::Memory) => {
            error = SqlError {
                sqlstate: SqlState::OUT_OF_MEMORY,
                message: format!(
                    "the query needed more memory than sql_query_engine.max_query_memory ({} MB)",
                    settings::max_query_memory_bytes() >> 20
                ),
                detail: None,
                hint: Some(
                    "Aggregate fewer or smaller values at once (array_agg, string_agg), or \
                     filter before aggregating."
                        .into(),
                ),
                position: None,
                ran: false,
                ends_run: false,
                names_estimates: false,
            };
        }
        None => {}
    }
    Outcome::Failed(error)
}

/// Everything that happens inside the subtransaction. With `in_loop` (a query of the repair
/// loop), a plan that `absurd_plan` calls absurd is not run, nor a query whose IN subquery
/// selects a column of the outer query (`guard::outer_column_subquery`), what makes its rows
/// doubtful is read (`guard::doubts`), and an answer that may be saved is written
/// out qualified (`guard::qualified_text`).
fn run_guarded(
    sql: &str,
    mode: Mode,
    origin: Origin,
    in_loop: Option<InLoop>,
    scope: Option<&Scope>,
) -> Outcome {
    subxact::set_local(c"transaction_read_only", c"on");
    limit_temp_files();
    // LLVM's out-of-memory handler ends the backend (FATAL), as JIT compilation under the
    // attempt's hard memory limit may: no JIT inside an attempt.
    subxact::bound_local(c"jit", c"off");
    // No parallel worker starts either, also for a plan cached before the attempt (a PL/pgSQL
    // statement's, planned where the planner hook keeps none out): a worker's memory is
    // outside the watch, and its part of the plan outside the gate.
    subxact::bound_local(c"max_parallel_workers", c"0");
    let _restricted = subxact::Restricted::enter();
    // An own read's relation, locked and measured again before analysis opens it.
    if origin == Origin::Own {
        if let Some(why) = own_read_refused_before() {
            return Outcome::Refused(guard::Refusal::forbidden(why));
        }
    }
    let trusted = match origin {
        Origin::Generated => guard::superuser_call(),
        Origin::Own => None,
    };
    // All of a superuser's query, and all of an own read, behind the gate: analysis, rewrite,
    // planning, execution and the collection of its rows.
    let _behind_gate = match (origin, &trusted) {
        (Origin::Own, _) => Some(gate::open(
            gate::Rule::BuiltinOnly,
            "the extension reads on its own",
        )),
        (Origin::Generated, Some(trusted)) => Some(gate::open(
            gate::Rule::TrustedOwners(trusted.clone()),
            "a superuser's generated query runs",
        )),
        (Origin::Generated, None) => None,
    };
    // An answer that may be saved as a view is checked for what the view would keep.
    let saving = match (&trusted, in_loop) {
        (None, Some(in_loop)) if in_loop.saves => Some(guard::saving_call()),
        _ => None,
    };
    // What PostgreSQL says of SQL the caller did not write (the model's, another role's
    // example, the extension's own) is not sent to the caller, from its analysis on: its
    // lexer's NOTICEs about names (an identifier cut to 63 bytes is printed whole), and
    // whatever code the query runs raises (a view's or a policy's functions, as analysis, the
    // planner or the executor call them): INFO, NOTICE or WARNING of any size and number,
    // which every client (the gateway, for all its roles) would have to take in, and which
    // could pass for the extension's own progress lines. Of the caller's own SQL (`nl_run`,
    // `nl_check`), what analysis says is the caller's to see; from planning on, it gets the
    // rows, not the code's messages.
    let callers_own = matches!(origin, Origin::Generated) && in_loop.is_none() && scope.is_none();
    // A setting that cannot be read is said before that (`allowed_functions` warns once).
    if matches!(origin, Origin::Generated) {
        guard::allowed_functions();
    }
    let mut quiet = (!callers_own).then(subxact::QuietClient::new);
    let checked = match guard::check(sql, origin, saving.as_ref().or(trusted.as_ref()), scope) {
        Ok(checked) => checked,
        Err(refusal) => return Outcome::Refused(refusal),
    };
    if let (Origin::Own, Some(why)) = (origin, own_read_differs(&checked.relations)) {
        return Outcome::Refused(guard::Refusal::forbidden(why));
    }
    Analysed::passed();
    if mode == Mode::Check {
        return Outcome::Checked;
    }
    let mut doubts = Vec::new();
    let mut qualified_sql = None;
    if let Some(in_loop) = in_loop {
        // SAFETY: the analyzed tree the guard just checked, in this transaction.
        if let Some(why) = unsafe { guard::outer_column_subquery(checked.query) } {
            return Outcome::Failed(SqlError {
                sqlstate: SqlState::INVALID_COLUMN_REFERENCE,
                message: format!("{PLAN_REFUSED} {why}"),
                hint: Some(
                    "Select a column of the subquery's own tables (join the table that has \
                     the column inside the subquery), or compare without a subquery."
                        .into(),
                ),
                ..Default::default()
            });
        }
        if matches!(mode, Mode::Run(_) | Mode::Cursor { .. }) {
            // SAFETY: as above; read before the rewriter gets the tree.
            doubts = unsafe { doubts_of(checked.query) };
        }
        if in_loop.saves && matches!(mode, Mode::Run(_)) {
            // SAFETY: as above.
            qualified_sql = Some(unsafe { guard::qualified_text(checked.query) });
        }
    }
    // SAFETY: the analyzed tree the guard checked, rewritten, planned and run under an active
    // snapshot, all inside this subtransaction.
    unsafe {
        // Like SPI for a non-read-only call: see what the caller's statement did so far.
        pg_sys::CommandCounterIncrement();
        quiet.get_or_insert_with(subxact::QuietClient::new);
        let rewritten = PgList::<pg_sys::Query>::from_pg(pg_sys::pg_rewrite_query(checked.query));
        let Some(query) = rewritten.get_ptr(0).filter(|_| rewritten.len() == 1) else {
            return Outcome::Refused(guard::Refusal::forbidden(
                "the query was rewritten into several statements (rules): it is not run".into(),
            ));
        };
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        // No parallel workers: the gate (a superuser's call) and the memory watch are this
        // backend's own, and a worker would run its part of the plan outside both (its
        // partial aggregates growing without bound).
        let planned = pg_sys::pg_plan_query(query, checked.text.as_ptr(), 0, std::ptr::null_mut());
        // The caller's privileges first, as the executor would check them: the plan's
        // estimates (told when it is refused) come from the statistics of every row of the
        // relations it reads, which a role without SELECT on them may not learn.
        crate::compat::check_permissions(planned);
        if let Some(why) = in_loop.and_then(|l| absurd_plan(planned, l.cost_limit)) {
            pg_sys::PopActiveSnapshot();
            return Outcome::Failed(SqlError {
                sqlstate: SqlState::PROGRAM_LIMIT_EXCEEDED,
                message: format!("{PLAN_REFUSED} {why}"),
                names_estimates: true,
                hint: Some(
                    "Join the tables on their keys (foreign keys), and filter or aggregate \
                     before joining large tables."
                        .into(),
                ),
                ..Default::default()
            });
        }
        let outcome = match mode {
            Mode::Plan | Mode::Check => Outcome::Planned,
            Mode::Run(_) | Mode::Cursor { .. } => {
                let mut result = execute(planned, &checked.text, mode, origin);
                result.qualified_sql = qualified_sql;
                if let (true, Some(by)) = (result.rows.is_empty(), result.cut_by) {
                    // Its first row alone was past the bound: rows, not none (a repair for
                    // an empty result would tell the model it found nothing).
                    Outcome::Failed(SqlError {
                        sqlstate: SqlState::PROGRAM_LIMIT_EXCEEDED,
                        message: format!(
                            "the query's first row alone is larger than sql_query_engine.{by} \
                             allows"
                        ),
                        hint: Some(
                            "Select fewer or shorter columns (left(column, 200), an aggregate)."
                                .into(),
                        ),
                        ran: true,
                        ..Default::default()
                    })
                } else if result.rows.is_empty() {
                    result.row_security = row_security_tables(&checked.relations);
                    Outcome::Empty(result)
                } else {
                    result.doubts = doubts;
                    Outcome::Rows(result)
                }
            }
        };
        pg_sys::PopActiveSnapshot();
        outcome
    }
}

/// Why the plan `planned` is not worth running for a question, when it is not: a join with no
/// join condition at all between two large inputs (a cartesian product: PostgreSQL would make
/// every pair of rows), or an estimated cost above `cost_limit`. Estimates are the planner's,
/// from the statistics: only what is absurd by a wide margin is refused.
///
/// # Safety
/// `planned` must be a plan PostgreSQL just made, in the current transaction.
unsafe fn absurd_plan(planned: *mut pg_sys::PlannedStmt, cost_limit: f64) -> Option<String> {
    // SAFETY: the caller's contract.
    let (top, rtable) = unsafe { ((*planned).planTree, (*planned).rtable) };
    if top.is_null() {
        return None;
    }
    // SAFETY: as above; each node is read as the struct its tag names.
    if let Some(why) = unsafe { cartesian(top, rtable) } {
        return Some(why);
    }
    // SAFETY: as above.
    let cost = unsafe { (*top).total_cost };
    (cost > cost_limit).then(|| {
        format!(
            "its plan is estimated at {cost:.1e} cost units, far more than \
             sql_query_engine.statement_timeout lets run"
        )
    })
}

/// Depth of a plan tree walked at most.
const PLAN_DEPTH: usize = 200;

/// The first answer of `found` for a node of the plan tree under `node`, the node itself
/// first, then its left and right subtrees.
///
/// # Safety
/// `node` is NULL or a node of a plan tree PostgreSQL made; `found` is given only such nodes.
unsafe fn first_in_plan<T>(
    node: *mut pg_sys::Plan,
    depth: usize,
    found: &mut dyn FnMut(*mut pg_sys::Plan) -> Option<T>,
) -> Option<T> {
    if node.is_null() || depth > PLAN_DEPTH {
        return None;
    }
    if let Some(answer) = found(node) {
        return Some(answer);
    }
    // SAFETY: the caller's contract: `node` is a plan node, its subtrees NULL or plan nodes.
    unsafe {
        let (left, right) = ((*node).lefttree, (*node).righttree);
        match first_in_plan(left, depth + 1, found) {
            Some(answer) => Some(answer),
            None => first_in_plan(right, depth + 1, found),
        }
    }
}

/// The first join without a join condition between two large inputs under `top`, described.
///
/// # Safety
/// `top` is NULL or the top node of a plan PostgreSQL made, whose range table is `rtable`.
unsafe fn cartesian(top: *mut pg_sys::Plan, rtable: *mut pg_sys::List) -> Option<String> {
    let mut unconditional_join = |node: *mut pg_sys::Plan| {
        // SAFETY: `first_in_plan` gives plan nodes; a node is read as the struct its tag names.
        unsafe {
            // Hash and merge joins always have a condition.
            if (*node.cast::<pg_sys::Node>()).type_ != pg_sys::NodeTag::T_NestLoop {
                return None;
            }
            let join = node.cast::<pg_sys::NestLoop>();
            let (left, right) = ((*node).lefttree, (*node).righttree);
            let unconditional = (*join).join.joinqual.is_null()
                && (*node).qual.is_null()
                && (*join).nestParams.is_null();
            if !unconditional || left.is_null() || right.is_null() {
                return None;
            }
            let (outer, inner) = ((*left).plan_rows, (*right).plan_rows);
            let large = outer >= CARTESIAN_SIDE_ROWS
                && inner >= CARTESIAN_SIDE_ROWS
                && outer * inner >= CARTESIAN_PAIRS;
            large.then(|| {
                format!(
                    "its plan joins {} (about {outer:.0} rows) and {} (about {inner:.0} rows) \
                     without any join condition, a cartesian product of about {:.1e} rows",
                    scanned_relation(left, rtable).unwrap_or_else(|| "a subquery".into()),
                    scanned_relation(right, rtable).unwrap_or_else(|| "a subquery".into()),
                    outer * inner
                )
            })
        }
    };
    // SAFETY: the caller's contract.
    unsafe { first_in_plan(top, 0, &mut unconditional_join) }
}

/// The first relation a plan node scans (itself or under it), as messages name it.
///
/// # Safety
/// As for `cartesian`, for any node of the plan.
unsafe fn scanned_relation(node: *mut pg_sys::Plan, rtable: *mut pg_sys::List) -> Option<String> {
    let mut scan = |node: *mut pg_sys::Plan| {
        // SAFETY: `first_in_plan` gives plan nodes; a node is read as the struct its tag names,
        // and a scan's range-table index is 1-based into the plan's range table.
        unsafe {
            let tag = (*node.cast::<pg_sys::Node>()).type_;
            if !matches!(
                tag,
                pg_sys::NodeTag::T_SeqScan
                    | pg_sys::NodeTag::T_IndexScan
                    | pg_sys::NodeTag::T_IndexOnlyScan
                    | pg_sys::NodeTag::T_BitmapHeapScan
            ) {
                return None;
            }
            let index = (*node.cast::<pg_sys::Scan>()).scanrelid as usize;
            let entries = PgList::<pg_sys::RangeTblEntry>::from_pg(rtable);
            entries
                .get_ptr(index.checked_sub(1)?)
                .map(|entry| crate::names::relation_name((*entry).relid))
        }
    };
    // SAFETY: the caller's contract.
    unsafe { first_in_plan(node, 0, &mut scan) }
}

/// Runs a planned SELECT to completion or until the limits cut it.
unsafe fn execute(
    planned: *mut pg_sys::PlannedStmt,
    text: &CStr,
    mode: Mode,
    origin: Origin,
) -> ResultSet {
    let (limits, portal) = match mode {
        Mode::Cursor { portal, limits } => (limits, Some(portal)),
        Mode::Run(limits) => (limits, None),
        Mode::Plan | Mode::Check => (
            Limits {
                max_rows: 0,
                max_bytes: 0,
            },
            None,
        ),
    };
    let rule = match origin {
        Origin::Generated => gate::Rule::Allowed(std::rc::Rc::new(guard::allowed_functions())),
        Origin::Own => gate::Rule::BuiltinOnly,
    };
    let mut collector = Collector {
        limits,
        bytes: 0,
        portal,
        rule,
        result: ResultSet::default(),
        record: std::ptr::null_mut(),
        as_text: Vec::new(),
        measured: Vec::new(),
        looked_up: Vec::new(),
        // SAFETY: an all-zero FmgrInfo is what fmgr_info fills in `startup`.
        to_jsonb: unsafe { std::mem::zeroed() },
        jsonb_out: pg_sys::InvalidOid,
        per_row: std::ptr::null_mut(),
    };
    let mut receiver = Receiver {
        base: pg_sys::DestReceiver {
            receiveSlot: Some(receive_slot),
            rStartup: Some(startup),
            rShutdown: Some(shutdown),
            rDestroy: Some(shutdown),
            mydest: pg_sys::CommandDest::DestNone,
        },
        collector: &mut collector,
    };
    // SAFETY: the executor's life cycle on a plan made in this subtransaction; the receiver and
    // its collector outlive it.
    unsafe {
        let query = pg_sys::CreateQueryDesc(
            planned,
            text.as_ptr(),
            pg_sys::GetActiveSnapshot(),
            std::ptr::null_mut(),
            &mut receiver.base,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
        pg_sys::ExecutorStart(query, 0);
        compat::executor_run(query);
        collector.result.parallel_workers = launched_workers((*query).planstate);
        pg_sys::ExecutorFinish(query);
        pg_sys::ExecutorEnd(query);
        // The receiver's memory (record descriptor, per-row context) lived in the executor's
        // query context, which ExecutorEnd has freed.
        pg_sys::FreeQueryDesc(query);
    }
    collector.result
}

/// Parallel workers launched by the Gather nodes of a plan.
unsafe fn launched_workers(node: *mut pg_sys::PlanState) -> i32 {
    if node.is_null() {
        return 0;
    }
    // SAFETY: a plan state tree of a finished execution; each node is of the struct its tag
    // names.
    unsafe {
        let here = match (*node).type_ {
            pg_sys::NodeTag::T_GatherState => {
                (*node.cast::<pg_sys::GatherState>()).nworkers_launched
            }
            pg_sys::NodeTag::T_GatherMergeState => {
                (*node.cast::<pg_sys::GatherMergeState>()).nworkers_launched
            }
            _ => 0,
        };
        here + launched_workers((*node).lefttree) + launched_workers((*node).righttree)
    }
}

/// A DestReceiver with the Rust side of it behind a pointer (PostgreSQL sees only `base`).
#[repr(C)]
struct Receiver {
    base: pg_sys::DestReceiver,
    collector: *mut Collector,
}

/// Where the rows go: jsonb text, one object per row, keys the column names. Each row goes
/// through PostgreSQL's own `to_jsonb` on a record whose descriptor is a copy of the result's,
/// with duplicate names made unique so no column is lost, and with the columns `to_jsonb`
/// would look up a cast for (types that are not built in and not arrays or composites of
/// built-in types) turned into their text first.
struct Collector {
    limits: Limits,
    /// Bytes kept so far.
    bytes: usize,
    /// The cursor the rows go to, instead of `result.rows`.
    portal: Option<pg_sys::Portal>,
    /// What may run while a row is turned into JSON.
    rule: gate::Rule,
    result: ResultSet,
    record: pg_sys::TupleDesc,
    /// For each column: the output function that turns it into text, when it is written as text.
    as_text: Vec<Option<pg_sys::FmgrInfo>>,
    /// For each column whose values hold numerics in arrays or records: its output function,
    /// whose text is measured before `to_jsonb` reads the value (`numerics_inside`).
    measured: Vec<Option<pg_sys::FmgrInfo>>,
    /// For each column whose values may hold values written by catalog look-ups inside others
    /// (`may_hold_looked_up`): its type, to count them in each row before anything writes them
    /// out.
    looked_up: Vec<Option<pg_sys::Oid>>,
    to_jsonb: pg_sys::FmgrInfo,
    jsonb_out: pg_sys::Oid,
    /// Reset after every row: a large result does not grow memory beyond its text. A child of
    /// the executor's query context (where `startup` runs), freed with it.
    per_row: pg_sys::MemoryContext,
}

impl Collector {
    fn cut(&mut self, by: &'static str) {
        self.result.truncated = true;
        self.result.cut_by = Some(by);
    }
}

/// Bytes of `max_result_bytes` each value of a result counts as, at least, and each object and
/// array more (see `charged`): what serde_json allocates for them, parsed.
const VALUE_BYTES: usize = 16;
const OBJECT_BYTES: usize = 640;
const ARRAY_BYTES: usize = 128;

/// The collector behind a receiver.
///
/// # Safety
/// `receiver` must be the `base` of a live `Receiver`.
unsafe fn collector<'a>(receiver: *mut pg_sys::DestReceiver) -> &'a mut Collector {
    // SAFETY: the caller's contract; `Receiver` is repr(C) with `base` first.
    unsafe { &mut *(*receiver.cast::<Receiver>()).collector }
}

/// Whether `to_jsonb` turns values of `typ` into JSON without looking up a cast: built-in
/// types (through domains), and arrays and named composites made only of them.
fn json_without_casts(typ: pg_sys::Oid) -> bool {
    json_without_casts_in(typ, 0, &mut HashMap::new())
}

/// `json_without_casts`, each type answered once (`known`): another role's types may share
/// their parts (60 fields of a type of 60 fields ...), which a walk without a memory would
/// follow once per path.
fn json_without_casts_in(
    typ: pg_sys::Oid,
    depth: usize,
    known: &mut HashMap<pg_sys::Oid, bool>,
) -> bool {
    if let Some(answer) = known.get(&typ) {
        return *answer;
    }
    pgrx::check_for_interrupts!();
    let answer = json_without_casts_unremembered(typ, depth, known);
    known.insert(typ, answer);
    answer
}

fn json_without_casts_unremembered(
    typ: pg_sys::Oid,
    depth: usize,
    known: &mut HashMap<pg_sys::Oid, bool>,
) -> bool {
    // SAFETY: catalog look-ups of a type the query's result has.
    unsafe {
        let base = pg_sys::getBaseType(typ);
        // An anonymous record's fields are known only per value.
        if base == pg_sys::RECORDOID || base == pg_sys::RECORDARRAYOID {
            return false;
        }
        // A pseudo-type's values (anyarray: statistics' arrays) have their real type only as
        // they are read, and `to_jsonb` would look up that type's cast then.
        if guard::builtin(base) {
            return pg_sys::get_typtype(base) as u8 != b'p';
        }
        if depth > 8 {
            return false;
        }
        let element = pg_sys::get_element_type(base);
        if element != pg_sys::InvalidOid {
            return json_without_casts_in(element, depth + 1, known);
        }
        guard::row_fields(base).is_some_and(|fields| {
            fields
                .into_iter()
                .all(|field| json_without_casts_in(field, depth + 1, known))
        })
    }
}

/// Values written by catalog look-ups (`regclass`, `aclitem`: `guard::is_looked_up`) one row may
/// hold inside arrays, at most: an array of them is written out by one call that checks no
/// interrupt between its elements, each a catalog cache look-up that another call may have
/// made walk some 65,000 entries of OIDs that hash alike (millions of elements kept the backend
/// deaf to cancel for minutes). The guard refuses such arrays built by the query, and any
/// given to what writes them out; these come from tables, or from rows and records (whose
/// fields are counted too, at any depth).
const MAX_LOOKED_UP_PER_ROW: usize = 1000;

/// Whether the values of a result column of type `typ` may hold values written by catalog
/// look-ups inside another value: arrays or rows of them (`guard::holds_looked_up`), or
/// records, whose fields are known only per value. Counted per row (`looked_up_inside`).
fn may_hold_looked_up(typ: pg_sys::Oid) -> bool {
    // SAFETY: a catalog look-up of a type the query's result has.
    let base = unsafe { pg_sys::getBaseType(typ) };
    base == pg_sys::RECORDOID || base == pg_sys::RECORDARRAYOID || guard::holds_looked_up(base)
}

/// Levels of arrays and rows `looked_up_inside` walks down at most (past them, a value counts
/// as more than any row may hold).
const MAX_LOOKED_UP_DEPTH: usize = 16;

/// Adds to `count` the values written by catalog look-ups that `value` (of type `typ`) holds
/// inside arrays and rows, at any depth: an array of them by its length, without reading its
/// elements; an array of rows or records element by element, a row or record field by field.
/// Stops once `count` passes `MAX_LOOKED_UP_PER_ROW`.
///
/// # Safety
/// `value` is a value of `typ`, not null, in a transaction.
unsafe fn looked_up_inside(
    value: pg_sys::Datum,
    typ: pg_sys::Oid,
    nested: bool,
    depth: usize,
    count: &mut usize,
) {
    if *count > MAX_LOOKED_UP_PER_ROW {
        return;
    }
    if depth > MAX_LOOKED_UP_DEPTH {
        *count = MAX_LOOKED_UP_PER_ROW + 1;
        return;
    }
    pgrx::check_for_interrupts!();
    // SAFETY: the caller's contract; arrays and rows are read as PostgreSQL stores them, each
    // part with the type their header or descriptor gives.
    unsafe {
        let base = pg_sys::getBaseType(typ);
        if guard::is_looked_up(base) {
            *count += usize::from(nested);
            return;
        }
        let element = pg_sys::get_element_type(base);
        if element != pg_sys::InvalidOid {
            let element_base = pg_sys::getBaseType(element);
            let array = pg_sys::pg_detoast_datum(value.cast_mut_ptr()).cast::<pg_sys::ArrayType>();
            if guard::is_looked_up(element_base) {
                let dims = std::slice::from_raw_parts(
                    (array as *const u8)
                        .add(std::mem::size_of::<pg_sys::ArrayType>())
                        .cast::<i32>(),
                    (*array).ndim.max(0) as usize,
                );
                let items = pg_sys::ArrayGetNItems((*array).ndim, dims.as_ptr()).max(0) as usize;
                *count = count.saturating_add(items);
                return;
            }
            if !may_hold_looked_up(element_base) {
                return;
            }
            let (mut length, mut by_value, mut align) = (0i16, false, 0 as std::ffi::c_char);
            pg_sys::get_typlenbyvalalign(element, &mut length, &mut by_value, &mut align);
            let (mut elements, mut nulls, mut n) =
                (std::ptr::null_mut(), std::ptr::null_mut(), 0i32);
            pg_sys::deconstruct_array(
                array,
                element,
                length.into(),
                by_value,
                align,
                &mut elements,
                &mut nulls,
                &mut n,
            );
            for i in 0..n.max(0) as usize {
                if !*nulls.add(i) {
                    looked_up_inside(*elements.add(i), element, true, depth + 1, count);
                }
            }
            return;
        }
        if base != pg_sys::RECORDOID && pg_sys::get_typtype(base) as u8 != b'c' {
            // A range or multirange that holds them (of `regclass`, or of arrays of it) is not
            // taken apart here: more than any row may hold.
            if may_hold_looked_up(base) {
                *count = MAX_LOOKED_UP_PER_ROW + 1;
            }
            return;
        }
        let header =
            pg_sys::pg_detoast_datum(value.cast_mut_ptr()).cast::<pg_sys::HeapTupleHeaderData>();
        let desc = pg_sys::lookup_rowtype_tupdesc(
            pgrx::heap_tuple_header_get_type_id(header),
            pgrx::heap_tuple_header_get_typmod(header),
        );
        let fields: Vec<(pg_sys::Oid, bool)> = compat::attributes(desc)
            .iter()
            .map(|attr| (attr.atttypid, attr.attisdropped))
            .collect();
        let mut values = vec![pg_sys::Datum::from(0); fields.len()];
        let mut null = vec![true; fields.len()];
        let mut tuple = pg_sys::HeapTupleData {
            t_len: pgrx::heap_tuple_header_get_datum_length(header) as u32,
            t_data: header,
            ..Default::default()
        };
        pg_sys::heap_deform_tuple(&mut tuple, desc, values.as_mut_ptr(), null.as_mut_ptr());
        compat::release_tuple_desc(desc);
        for (i, (field, dropped)) in fields.into_iter().enumerate() {
            if !dropped
                && !null[i]
                && (guard::is_looked_up(pg_sys::getBaseType(field)) || may_hold_looked_up(field))
            {
                looked_up_inside(values[i], field, true, depth + 1, count);
            }
        }
    }
}

/// Whether values of `typ` hold numerics inside arrays or records. `to_jsonb` turns each
/// numeric into text and back, checking no interrupt and freeing the text: a million numerics
/// stored in a few bytes each, whose text is 131,072 digits each, keep the backend deaf to
/// cancel for minutes, in flat memory. The value's own text is measured first (it grows with
/// its digits, within the memory limit).
fn numerics_inside(typ: pg_sys::Oid) -> bool {
    guard::type_holds(typ, &|base, nested| base == pg_sys::NUMERICOID && nested)
}

/// Whether values of `typ` hold values whose layout a descriptor that may change describes:
/// records (an anonymous one's fields are typed per value) and composite types that are not
/// built in. A cursor keeps them as they are until FETCH prints them with the descriptor of
/// then, which a type's owner may have changed (`ALTER TYPE ... ALTER ATTRIBUTE ... TYPE`:
/// only tables' columns stop it), and the bytes of one field would be read as another's.
fn layout_may_change(typ: pg_sys::Oid) -> bool {
    guard::type_holds(typ, &|base, _| {
        base == pg_sys::RECORDOID
            // SAFETY: a catalog look-up of a type the query's result has.
            || (!guard::builtin(base) && unsafe { pg_sys::get_typtype(base) } as u8 == b'c')
    })
}

/// The bytes of a row's values as they are stored (uncompressed), before anything is built
/// from them.
unsafe fn row_bytes(slot: *mut pg_sys::TupleTableSlot) -> usize {
    // SAFETY: a slot whose attributes `slot_getallattrs` filled.
    unsafe {
        let desc = (*slot).tts_tupleDescriptor;
        let natts = (*desc).natts as usize;
        let values = std::slice::from_raw_parts((*slot).tts_values, natts);
        let nulls = std::slice::from_raw_parts((*slot).tts_isnull, natts);
        compat::attributes(desc)
            .iter()
            .zip(values.iter().zip(nulls))
            .map(|(attr, (value, null))| match attr.attlen {
                _ if *null => 0,
                -1 => pg_sys::toast_raw_datum_size(*value),
                -2 => CStr::from_ptr(value.cast_mut_ptr()).to_bytes().len(),
                n => n.max(0) as usize,
            })
            .sum()
    }
}

/// The values of `slot`, with each stored out of line (TOAST) read into memory, in the current
/// memory context, as PostgreSQL's own store of a held cursor keeps them.
///
/// # Safety
/// `slot` is a slot whose attributes `slot_getallattrs` filled.
unsafe fn detoasted(slot: *mut pg_sys::TupleTableSlot) -> Vec<pg_sys::Datum> {
    // SAFETY: the slot's arrays hold `natts` filled entries; a varlena value that is not null
    // points to a varlena, which detoast_external_attr copies when it is stored out of line.
    unsafe {
        let desc = (*slot).tts_tupleDescriptor;
        let natts = (*desc).natts as usize;
        let values = std::slice::from_raw_parts((*slot).tts_values, natts);
        let nulls = std::slice::from_raw_parts((*slot).tts_isnull, natts);
        compat::attributes(desc)
            .iter()
            .zip(values.iter().zip(nulls))
            .map(|(attr, (&value, &null))| {
                let pointer = value.cast_mut_ptr::<pg_sys::varlena>();
                if attr.attlen == -1 && !null && pgrx::varlena::varatt_is_1b_e(pointer) {
                    pg_sys::Datum::from(pg_sys::detoast_external_attr(pointer))
                } else {
                    value
                }
            })
            .collect()
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn startup(
    receiver: *mut pg_sys::DestReceiver,
    _operation: std::ffi::c_int,
    source: pg_sys::TupleDesc,
) {
    // SAFETY: PostgreSQL calls this with our receiver and the result's descriptor, in the
    // executor's query context, where everything made here lives.
    unsafe {
        let c = collector(receiver);
        if c.portal.is_some() {
            if let Some(attr) = compat::attributes(source)
                .iter()
                .find(|attr| layout_may_change(attr.atttypid))
            {
                crate::error::Error::sql(
                    "0A000",
                    format!(
                        "column \"{}\" holds values of type {}: a cursor keeps them until FETCH, \
                         and the layout of a record or of a composite type may change meanwhile",
                        CStr::from_ptr(attr.attname.data.as_ptr()).to_string_lossy(),
                        crate::names::c_string(pg_sys::format_type_be(attr.atttypid))
                    ),
                    Some("Select the record's fields as columns of their own."),
                )
                .raise();
            }
        }
        if let Some(portal) = c.portal {
            // The row type and a store for the rows, in the portal's memory, which outlives this
            // execution and its subtransaction; scrollable, like the cursor. Its temporary
            // files belong to no resource owner, as a held cursor's (the portal ends its store
            // itself; a resource owner would close them first).
            let caller = pg_sys::MemoryContextSwitchTo((*portal).holdContext);
            // In memory up to the caller's work_mem, but never more than CURSOR_STORE_KB: every
            // attempt of the call keeps its store until the call ends, and a role may set
            // work_mem as high as it likes.
            let in_memory = pg_sys::work_mem.clamp(64, CURSOR_STORE_KB);
            let store = pg_sys::tuplestore_begin_heap(true, true, in_memory);
            CURSOR_STORES.with_borrow_mut(|stores| stores.push(store));
            c.result.held = Some(Held {
                store,
                desc: pg_sys::CreateTupleDescCopy(source),
            });
            pg_sys::MemoryContextSwitchTo(caller);
        }
        let names: Vec<String> = compat::attributes(source)
            .iter()
            .map(|attr| {
                CStr::from_ptr(attr.attname.data.as_ptr())
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        c.result.columns = unique_names(&names);
        // Output functions are looked up behind the gate: they are what runs for each row.
        let _gate = gate::open(c.rule.clone(), "results are collected");
        let record = pg_sys::CreateTupleDescCopy(source);
        for (i, name) in c.result.columns.iter().enumerate() {
            // A column name never holds a NUL; one that did would keep its own name.
            let name = CString::new(name.as_str()).unwrap_or_default();
            let typ = compat::attributes(source)[i].atttypid;
            c.looked_up.push(may_hold_looked_up(typ).then_some(typ));
            let json = json_without_casts(typ);
            c.measured.push((json && numerics_inside(typ)).then(|| {
                let (mut output, mut is_varlena) = (pg_sys::InvalidOid, false);
                pg_sys::getTypeOutputInfo(typ, &mut output, &mut is_varlena);
                let mut info: pg_sys::FmgrInfo = std::mem::zeroed();
                pg_sys::fmgr_info(output, &mut info);
                info
            }));
            if json {
                pg_sys::namestrcpy(
                    &mut compat::attributes_mut(record)[i].attname,
                    name.as_ptr(),
                );
                c.as_text.push(None);
            } else {
                pg_sys::TupleDescInitEntry(
                    record,
                    (i + 1) as pg_sys::AttrNumber,
                    name.as_ptr(),
                    pg_sys::TEXTOID,
                    -1,
                    0,
                );
                let (mut output, mut is_varlena) = (pg_sys::InvalidOid, false);
                pg_sys::getTypeOutputInfo(typ, &mut output, &mut is_varlena);
                let mut info: pg_sys::FmgrInfo = std::mem::zeroed();
                pg_sys::fmgr_info(output, &mut info);
                c.as_text.push(Some(info));
            }
        }
        c.record = pg_sys::BlessTupleDesc(record);

        let to_jsonb = pg_sys::fmgr_internal_function(c"to_jsonb".as_ptr());
        pg_sys::fmgr_info(to_jsonb, &mut c.to_jsonb);
        // to_jsonb is polymorphic: it learns its argument type from the call expression.
        let mut args = PgList::<pg_sys::Const>::new();
        args.push(pg_sys::makeNullConst(
            pg_sys::RECORDOID,
            -1,
            pg_sys::InvalidOid,
        ));
        c.to_jsonb.fn_expr = pg_sys::makeFuncExpr(
            to_jsonb,
            pg_sys::JSONBOID,
            args.into_pg(),
            pg_sys::InvalidOid,
            pg_sys::InvalidOid,
            pg_sys::CoercionForm::COERCE_EXPLICIT_CALL,
        )
        .cast();
        let mut is_varlena = false;
        pg_sys::getTypeOutputInfo(pg_sys::JSONBOID, &mut c.jsonb_out, &mut is_varlena);
        c.per_row = pg_sys::AllocSetContextCreateInternal(
            pg_sys::CurrentMemoryContext,
            c"sql_query_engine row".as_ptr(),
            pg_sys::ALLOCSET_SMALL_MINSIZE as usize,
            pg_sys::ALLOCSET_SMALL_INITSIZE as usize,
            pg_sys::ALLOCSET_SMALL_MAXSIZE as usize,
        );
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn receive_slot(
    slot: *mut pg_sys::TupleTableSlot,
    receiver: *mut pg_sys::DestReceiver,
) -> bool {
    // SAFETY: PostgreSQL calls this with our receiver (set up by `startup`) and a slot of the
    // result's descriptor.
    unsafe {
        let c = collector(receiver);
        if c.result.rows.len() >= c.limits.max_rows {
            // One row more than may be returned: the result is cut, and the executor stops here.
            c.cut("max_rows");
            return false;
        }
        pg_sys::slot_getallattrs(slot);
        let raw = row_bytes(slot);
        if c.bytes.saturating_add(raw) > c.limits.max_bytes {
            c.cut("max_result_bytes");
            return false;
        }
        // A cursor's rows are counted twice: as stored, and as JSON.
        let stored = if c.portal.is_some() { raw } else { 0 };
        let _gate = gate::open(c.rule.clone(), "results are collected");
        let caller = pg_sys::MemoryContextSwitchTo(c.per_row);
        let natts = c.as_text.len();
        let mut values = std::slice::from_raw_parts((*slot).tts_values, natts).to_vec();
        let nulls = std::slice::from_raw_parts_mut((*slot).tts_isnull, natts);
        // Counted before anything writes them out (see `MAX_LOOKED_UP_PER_ROW`).
        let mut looked_up = 0usize;
        for (i, typ) in c.looked_up.iter().enumerate() {
            if let (Some(typ), false) = (typ, nulls[i]) {
                looked_up_inside(values[i], *typ, false, 0, &mut looked_up);
            }
        }
        if looked_up > MAX_LOOKED_UP_PER_ROW {
            pg_sys::MemoryContextSwitchTo(caller);
            crate::error::Error::sql(
                "54000",
                format!(
                    "a row of the result holds more than {MAX_LOOKED_UP_PER_ROW} values in arrays \
                     or rows that are each looked up in the catalog as they are written \
                     (regclass, regtype, aclitem, ...)"
                ),
                Some("Select them as rows (unnest) or as OIDs (::oid[])."),
            )
            .raise();
        }
        for (i, output) in c.as_text.iter_mut().enumerate() {
            if let (Some(output), false) = (output, nulls[i]) {
                let text = pg_sys::OutputFunctionCall(output, values[i]);
                values[i] = pg_sys::Datum::from(pg_sys::cstring_to_text(text));
            }
        }
        // Numerics inside values: their text must fit before `to_jsonb` converts each (see
        // `numerics_inside`).
        let mut measured = 0usize;
        for (i, output) in c.measured.iter_mut().enumerate() {
            if let (Some(output), false) = (output, nulls[i]) {
                let text = pg_sys::OutputFunctionCall(output, values[i]);
                measured = measured.saturating_add(CStr::from_ptr(text).to_bytes().len());
                pg_sys::pfree(text.cast());
            }
        }
        if c.bytes.saturating_add(stored).saturating_add(measured) > c.limits.max_bytes {
            pg_sys::MemoryContextSwitchTo(caller);
            pg_sys::MemoryContextReset(c.per_row);
            c.cut("max_result_bytes");
            return false;
        }
        let tuple = pg_sys::heap_form_tuple(c.record, values.as_mut_ptr(), nulls.as_mut_ptr());
        let composite = pg_sys::heap_copy_tuple_as_datum(tuple, c.record);
        let jsonb = pg_sys::FunctionCall1Coll(&mut c.to_jsonb, pg_sys::InvalidOid, composite);
        let text = CStr::from_ptr(pg_sys::OidOutputFunctionCall(c.jsonb_out, jsonb));
        let shape = crate::text::json_shape(text.to_bytes());
        if shape.depth > MAX_JSON_DEPTH {
            // What reads the rows (serde_json) stops at 128 levels: such a row would become
            // an internal error, or a row of NULLs.
            pg_sys::MemoryContextSwitchTo(caller);
            crate::error::Error::sql(
                "54001",
                format!("a value of the result is nested deeper than {MAX_JSON_DEPTH} levels"),
                Some("Select the parts of the value that are needed (->, #>, jsonb_path_query)."),
            )
            .raise();
        }
        // Each value counts as `VALUE_BYTES` at least, each object as `OBJECT_BYTES` more, and
        // each array as `ARRAY_BYTES` more:
        // what reads the rows (votes, traces, the rows returned) parses them into trees, whose
        // size follows their values and maps, not their bytes (a byte-sized `0,` takes some
        // 60 bytes parsed, a `{"":0},` some 700).
        let charged = text.to_bytes().len().max(
            shape
                .values
                .saturating_mul(VALUE_BYTES)
                .saturating_add(shape.objects.saturating_mul(OBJECT_BYTES))
                .saturating_add(shape.arrays.saturating_mul(ARRAY_BYTES)),
        );
        let kept = if c.bytes.saturating_add(stored).saturating_add(charged) > c.limits.max_bytes {
            c.cut("max_result_bytes");
            false
        } else {
            if let (Some(portal), Some(held)) = (c.portal, c.result.held) {
                // As PostgreSQL fills a held cursor: under the portal's resource owner, so that
                // a spilled store outlives this subtransaction, and with values stored out of
                // line read now, while the attempt's snapshot and locks still hold (a FETCH
                // has neither: it would follow a pointer into a table that another
                // transaction may have vacuumed since). Only a row that is kept: the cursor
                // holds exactly the rows of the answer.
                let stored_values = detoasted(slot);
                let owner = pg_sys::CurrentResourceOwner;
                pg_sys::CurrentResourceOwner = (*portal).resowner;
                pg_sys::tuplestore_putvalues(
                    held.store,
                    (*slot).tts_tupleDescriptor,
                    stored_values.as_ptr().cast_mut(),
                    (*slot).tts_isnull,
                );
                pg_sys::CurrentResourceOwner = owner;
            }
            c.bytes += stored + charged;
            // Within the watch's hard limit an allocation may fail: Rust's would abort.
            let mut row = String::new();
            if row.try_reserve_exact(text.to_bytes().len()).is_err() {
                pg_sys::MemoryContextSwitchTo(caller);
                crate::error::Error::sql("53200", "out of memory collecting a row", None).raise();
            }
            row.push_str(&String::from_utf8_lossy(text.to_bytes()));
            c.result.rows.push(row);
            true
        };
        pg_sys::MemoryContextSwitchTo(caller);
        pg_sys::MemoryContextReset(c.per_row);
        kept
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn shutdown(_receiver: *mut pg_sys::DestReceiver) {}

/// Kilobytes of rows an attempt's cursor store keeps in memory before it spills to a temporary
/// file (bounded by `temp_file_limit` and `max_result_bytes`).
const CURSOR_STORE_KB: i32 = 8 * 1024;

thread_local! {
    /// The stores `startup` began for the cursor of the running `nl_cursor` call, each once:
    /// ended by its `Cursor`, but the one handed to the cursor.
    static CURSOR_STORES: std::cell::RefCell<Vec<*mut pg_sys::Tuplestorestate>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A cursor being answered (`new_cursor`). When dropped, on every path (an error too), it ends
/// every store an attempt began for it but the one `finish` handed to the cursor: those of
/// attempts that failed after their first rows, of candidates that lost the vote, of a run that
/// ended in an error. Their temporary files belong to no resource owner, so nothing else would
/// close them before the backend exits.
///
/// Until `finish`, the portal is pinned and invisible: the attempts write into its memory, and
/// code they run (a view's function, as the caller) finds it by name (`CLOSE c` in PL/pgSQL)
/// or lists it (`pg_cursors`, which reads its query text, not defined yet): dropped, its
/// memory would be written after it was freed; listed, its missing text read.
pub struct Cursor {
    pub portal: pg_sys::Portal,
    finished: std::cell::Cell<bool>,
}

impl Drop for Cursor {
    fn drop(&mut self) {
        // The portal is pinned until `finish`, which ends the stores before it drops it.
        // SAFETY: each a store `startup` began in the hold context of this cursor's portal,
        // which still exists, and which nothing else ends.
        unsafe { end_stores() }
        if !self.finished.get() {
            // SAFETY: the portal `new_cursor` pinned, which nothing could drop since; the
            // transaction's end drops it (an error is on its way).
            unsafe { pg_sys::UnpinPortal(self.portal) }
        }
    }
}

/// Ends the stores of `CURSOR_STORES`, each taken off the list once ended (one that fails
/// leaves the rest to the `Cursor`'s drop). Ending a store closes and deletes its temporary
/// file, which first writes out its last buffer: that write is let past `temp_file_limit` (the
/// file goes at once, and the limit may be what failed the attempt: the same write would fail
/// again), and while an error unwinds, an error of its own (a full disk) is logged instead of
/// raised, since raised in a destructor then it would abort the backend, and so restart the
/// server.
///
/// # Safety
/// Each store on the list is one `startup` began in a portal's hold context that still exists.
unsafe fn end_stores() {
    struct Limit(std::ffi::c_int);
    impl Drop for Limit {
        fn drop(&mut self) {
            // SAFETY: a plain int of the backend's own, put back as it was found.
            unsafe { pg_sys::temp_file_limit = self.0 }
        }
    }
    while let Some(store) = CURSOR_STORES.with_borrow_mut(|stores| stores.last().copied()) {
        // SAFETY: a plain int of the backend's own, put back by `Limit` on every path.
        let _limit = Limit(unsafe { pg_sys::temp_file_limit });
        // SAFETY: as above.
        unsafe { pg_sys::temp_file_limit = -1 };
        if std::thread::panicking() {
            pgrx::PgTryBuilder::new(std::panic::AssertUnwindSafe(|| {
                // SAFETY: as the function's; an error is caught here.
                unsafe { pg_sys::tuplestore_end(store) }
            }))
            .catch_others(|caught| {
                subxact::log_while_unwinding(format!(
                    "sql_query_engine: a cursor's store could not be ended: {caught:?}"
                ))
            })
            .execute();
        } else {
            // SAFETY: as the function's.
            unsafe { pg_sys::tuplestore_end(store) }
        }
        CURSOR_STORES.with_borrow_mut(|stores| stores.pop());
    }
}

/// A new cursor `name` of the caller's transaction, whose memory the attempts of `Mode::Cursor`
/// keep their rows in; `None` when a cursor of that name exists.
pub fn new_cursor(name: &str) -> Option<Cursor> {
    let name = CString::new(name).ok()?;
    // SAFETY: a portal of the current transaction, with its hold context (and an empty hold
    // store, replaced by `finish`), pinned and invisible until then (`Cursor`).
    unsafe {
        if !pg_sys::GetPortalByName(name.as_ptr()).is_null() {
            return None;
        }
        let portal = pg_sys::CreatePortal(name.as_ptr(), false, false);
        (*portal).cursorOptions = pg_sys::CURSOR_OPT_SCROLL as i32;
        (*portal).visible = false;
        pg_sys::PinPortal(portal);
        pg_sys::PortalCreateHoldStore(portal);
        CURSOR_STORES.take();
        Some(Cursor {
            portal,
            finished: std::cell::Cell::new(false),
        })
    }
}

impl Cursor {
    /// Makes the cursor ready to FETCH from the rows of the attempt that answered (`answer`, its
    /// SQL `sql`), like a held cursor; the other attempts' stores are ended when this is
    /// dropped. Drops the cursor when there is no answer.
    pub fn finish(&self, sql: &str, answer: Option<Held>) {
        let portal = self.portal;
        // SAFETY: a portal `new_cursor` made and pinned, not yet defined; the answer's store is
        // one `startup` began in its hold context.
        unsafe {
            self.finished.set(true);
            pg_sys::UnpinPortal(portal);
            let (Some(answer), Ok(sql)) = (answer, CString::new(sql)) else {
                // The stores live in the portal's memory: ended before it goes.
                end_stores();
                pg_sys::PortalDrop(portal, false);
                return;
            };
            // What may fail (an allocation) first, while the answer's store is still on the
            // list `drop` ends: then it passes to the portal, whose drop ends it, with nothing
            // that may fail in between (its temporary file, kept across transactions, would
            // otherwise stay until the backend ends).
            let text = pg_sys::MemoryContextStrdup((*portal).portalContext, sql.as_ptr());
            pg_sys::PortalDefineQuery(
                portal,
                std::ptr::null(),
                text,
                pg_sys::CommandTag::CMDTAG_SELECT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            let empty = (*portal).holdStore;
            (*portal).holdStore = answer.store;
            CURSOR_STORES.with_borrow_mut(|stores| stores.retain(|s| *s != answer.store));
            pg_sys::tuplestore_end(empty);
            (*portal).tupDesc = answer.desc;
            (*portal).strategy = pg_sys::PortalStrategy::PORTAL_ONE_SELECT;
            (*portal).atStart = true;
            (*portal).atEnd = false;
            (*portal).portalPos = 0;
            (*portal).status = pg_sys::PortalStatus::PORTAL_READY;
            (*portal).visible = true;
        }
    }
}

/// The relations among `relations` on which row-level security applies to the current role.
fn row_security_tables(relations: &[pg_sys::Oid]) -> Vec<String> {
    let mut tables: Vec<String> = Vec::new();
    for &relid in relations {
        // SAFETY: catalog look-ups of relations the query read (NULL for one that is gone).
        let (applies, name) = unsafe {
            (
                pg_sys::check_enable_rls(relid, pg_sys::InvalidOid, true)
                    == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32,
                crate::names::c_string(pg_sys::get_rel_name(relid)),
            )
        };
        if applies && !name.is_empty() && crate::names::printable(&name) && !tables.contains(&name)
        {
            tables.push(name);
        }
    }
    tables
}

/// `name` with `_n`, within a column name's 63 bytes (the name is cut, at a character, to
/// make room): a longer one would be cut back to `name` when it names a column.
fn with_suffix(name: &str, n: usize) -> String {
    const MAX_NAME_BYTES: usize = pg_sys::NAMEDATALEN as usize - 1;
    let suffix = format!("_{n}");
    let mut end = name.len().min(MAX_NAME_BYTES.saturating_sub(suffix.len()));
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &name[..end])
}

/// `a, b, a` becomes `a, b, a_2`: jsonb objects cannot hold a key twice.
fn unique_names(names: &[String]) -> Vec<String> {
    use std::collections::{HashMap, HashSet};
    // Sets, and the next suffix per name: a query may repeat one name a thousand times.
    let given: HashSet<&str> = names.iter().map(String::as_str).collect();
    let mut taken: HashSet<String> = HashSet::with_capacity(names.len());
    let mut next: HashMap<&str, usize> = HashMap::new();
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let mut candidate = name.clone();
        let n = next.entry(name.as_str()).or_insert(2);
        while taken.contains(&candidate)
            || (candidate != *name && given.contains(candidate.as_str()))
        {
            candidate = with_suffix(name, *n);
            *n += 1;
        }
        taken.insert(candidate.clone());
        out.push(candidate);
    }
    out
}

/// The cursor position and the SQLSTATE of the error being reported, which a caught error
/// report does not carry (pgrx's copy of an error keeps only the SQLSTATEs it knows, XX000 for
/// the others, such as a function's own `ERRCODE`): an error-context callback on the stack
/// while the attempt runs, taken off again when this is dropped (also when an ERROR unwinds
/// past it).
struct ErrorReported {
    callback: Box<pg_sys::ErrorContextCallback>,
    seen: Box<Seen>,
}

/// What the callback saw of the last report.
#[derive(Default)]
struct Seen {
    position: Cell<i32>,
    sqlstate: Cell<i32>,
}

impl ErrorReported {
    fn push() -> ErrorReported {
        let seen = Box::<Seen>::default();
        let mut callback = Box::new(pg_sys::ErrorContextCallback {
            // SAFETY: reading the backend's error-context stack.
            previous: unsafe { pg_sys::error_context_stack },
            callback: Some(record_error),
            arg: (&*seen as *const Seen).cast_mut().cast(),
        });
        // SAFETY: the callback and its argument are boxed, so they stay where they are until
        // `drop` takes the callback off the stack again.
        unsafe { pg_sys::error_context_stack = &mut *callback };
        ErrorReported { callback, seen }
    }

    fn position(&self) -> Option<i32> {
        Some(self.seen.position.get()).filter(|p| *p > 0)
    }

    /// The SQLSTATE of the last report, when it was an error's (not a notice's or warning's).
    fn sqlstate(&self) -> Option<SqlState> {
        Some(SqlState::from_packed(self.seen.sqlstate.get()))
            .filter(|s| !["00", "01"].contains(&s.class()))
    }
}

impl Drop for ErrorReported {
    fn drop(&mut self) {
        // SAFETY: PostgreSQL restores the stack to what it was at each PG_TRY when it catches
        // an error, so at this point ours is on top again.
        unsafe { pg_sys::error_context_stack = self.callback.previous };
    }
}

/// Error-context callback: remembers the cursor position and the SQLSTATE of the error being
/// reported. SPI's own callback (which runs first) moves the position of its query into the
/// "internal" position, so that one is read too.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn record_error(arg: *mut std::ffi::c_void) {
    // SAFETY: called while an error is being reported, with the argument `ErrorReported` gave.
    unsafe {
        if arg.is_null() {
            return;
        }
        let seen = &*arg.cast::<Seen>();
        let sqlstate = pg_sys::geterrcode();
        seen.sqlstate.set(sqlstate);
        if SqlState::from_packed(sqlstate) == SqlState::OUT_OF_MEMORY && at_hard_limit() {
            lift_hard_limit();
        }
        // An error's position, not a notice's, and the last error's alone: code the query ran
        // may have caught an error of its own (with a position in other text) before it.
        if ["00", "01"].contains(&SqlState::from_packed(sqlstate).class()) {
            return;
        }
        let position = match pg_sys::geterrposition() {
            p if p > 0 => p,
            _ => pg_sys::getinternalerrposition(),
        };
        seen.position.set(position);
    }
}

/// Bounds the temporary files of the attempt (sorts, hashes, a recursive query's work tables):
/// `max_query_temp_files`, or the server's `temp_file_limit` when it is lower.
fn limit_temp_files() {
    // SAFETY: reads the backend's own setting.
    let server = i64::from(unsafe { pg_sys::temp_file_limit });
    let ours = settings::max_query_temp_files_kb();
    let limit = if server >= 0 { server.min(ours) } else { ours };
    let limit = CString::new(limit.min(i64::from(i32::MAX)).to_string()).unwrap_or_default();
    subxact::bound_local(c"temp_file_limit", &limit);
}

/// Pages of the backend's data (as the kernel counts a process's private writable memory:
/// `/proc/self/statm`'s sixth field), read with async-signal-safe calls only and no allocation:
/// `memory_watch` runs in a signal handler. `None` where it cannot be read.
fn data_pages() -> Option<u64> {
    let mut buffer = [0u8; 160];
    // SAFETY: open, read and close are async-signal-safe; the buffer is ours and its length
    // bounds the read.
    let read = unsafe {
        let fd = libc::open(
            c"/proc/self/statm".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return None;
        }
        let read = libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len());
        libc::close(fd);
        read
    };
    let text = buffer.get(..usize::try_from(read).ok()?)?;
    let field = text.split(|b| *b == b' ').nth(5)?;
    let mut pages: u64 = 0;
    for digit in field.iter().take_while(|b| b.is_ascii_digit()) {
        pages = pages
            .checked_mul(10)?
            .checked_add(u64::from(digit - b'0'))?;
    }
    Some(pages)
}

/// Pages past which the running attempt is cancelled (`u64::MAX`: no attempt is watched), and
/// whether it was: shared with the signal handler.
static WATCH_CEILING: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);
/// Whether the watch asked for a cancel itself (none was pending when it did).
static WATCH_EXCEEDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// How often the memory of an attempt is looked at.
const WATCH_INTERVAL_MS: i32 = 100;

thread_local! {
    /// The backend's own timer for `memory_watch`, registered once.
    static WATCH_TIMER: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// The memory watch's timer handler, run in the SIGALRM handler (the deadline's too:
/// `deadline_watch`): past the ceiling (or once an
/// allocation of the extension's met the hard limit), it asks for a cancel, as PostgreSQL's own statement timeout does (the query ends at its next interrupt
/// check; `MemoryWatch` tells the cancel apart), at every tick while the query stays past it
/// (code of the query may catch one cancel). A cancel already pending is the caller's.
extern "C" fn memory_watch() {
    use std::sync::atomic::Ordering;
    relower_when_due();
    deadline_watch();
    let ceiling = WATCH_CEILING.load(Ordering::Relaxed);
    let met = LIMIT_MET.swap(false, Ordering::SeqCst);
    if !met && (ceiling >= UNREAD_CEILING || data_pages().is_none_or(|pages| pages <= ceiling)) {
        return;
    }
    // SAFETY: the flags a signal handler sets to ask for a cancel (sig_atomic_t); PostgreSQL's
    // SIGALRM handler sets the latch after its handlers ran.
    unsafe {
        if std::ptr::read_volatile(&raw const pg_sys::QueryCancelPending) == 0 {
            std::ptr::write_volatile(&raw mut pg_sys::QueryCancelPending, 1);
            std::ptr::write_volatile(&raw mut pg_sys::InterruptPending, 1);
            WATCH_EXCEEDED.store(true, Ordering::Relaxed);
        }
    }
}

static mut NEXT_PLANNER: pg_sys::planner_hook_type = None;

/// Installs the planner hook that keeps parallel workers out of a watched attempt (`_PG_init`).
pub fn init() {
    // SAFETY: _PG_init runs once per backend, before any query; the previous hook is kept and
    // called.
    unsafe {
        NEXT_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(planner);
        pg_sys::RegisterXactCallback(Some(end_after_transaction), std::ptr::null_mut());
    }
}

// PostgreSQL's own planner, declared here rather than taken from pgrx's bindings, which wrap
// each binding so that an ERROR it raises becomes a copy that keeps only some of the error's
// fields (see `planner`).
// SAFETY: the signature of optimizer/planner.h, the same in every supported server.
unsafe extern "C-unwind" {
    #[link_name = "standard_planner"]
    fn postgres_planner(
        parse: *mut pg_sys::Query,
        query_string: *const std::ffi::c_char,
        cursor_options: std::ffi::c_int,
        bound_params: pg_sys::ParamListInfo,
    ) -> *mut pg_sys::PlannedStmt;
}

/// Plans without parallel workers while an attempt is watched (`MemoryWatch`): not only the
/// attempt's own statement, which `run_guarded` plans so, but every statement code of the
/// query plans (a SQL or PL/pgSQL function of a view): a worker's memory is outside the watch.
/// Behind a superuser's gate, judges the relations of each statement before it is planned
/// (`gate::check_relations_before_planning`).
/// Every statement of the backend passes here once the library is loaded. Not `#[pg_guard]`,
/// and calling the next planner without pgrx's wrapper: an ERROR raised while planning (an
/// immutable function of constants run then) must reach the client as PostgreSQL raised it,
/// which pgrx's guard would re-raise as a copy without its position and CONTEXT, and with
/// XX000 for a SQLSTATE pgrx does not know. The ERROR long-jumps past this frame, which holds
/// nothing to drop (it reads two flags).
unsafe extern "C-unwind" fn planner(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: std::ffi::c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // Any query of the extension's, watched or not (a watch nested in another is not armed):
    // the gate is this backend's own, and a worker would run its part of the plan outside it.
    let watched =
        WATCH_CEILING.load(std::sync::atomic::Ordering::Relaxed) != u64::MAX || RUNNING.get() > 0;
    let cursor_options = if watched {
        cursor_options & !(pg_sys::CURSOR_OPT_PARALLEL_OK as std::ffi::c_int)
    } else {
        cursor_options
    };
    // A superuser's query: what it reaches only as it runs (SQL a trusted function builds) is
    // judged before planning runs the code of the relations it names.
    if gate::judges_relations() {
        // SAFETY: the Query PostgreSQL is about to plan.
        unsafe { gate::check_relations_before_planning(parse) };
    }
    // SAFETY: the planner's own arguments, passed on to the next hook or the standard planner.
    unsafe {
        match NEXT_PLANNER {
            Some(next) => next(parse, query_string, cursor_options, bound_params),
            None => postgres_planner(parse, query_string, cursor_options, bound_params),
        }
    }
}

/// Watches the memory an attempt adds to the backend, up to `max_query_memory`, until
/// dropped. PostgreSQL bounds a sort or a hash by `work_mem`, but not what an aggregate
/// (`array_agg`, `string_agg`) or a value built row by row takes, nor what turning a row into
/// JSON takes: without this, one query could take the machine's memory, and the kernel's
/// out-of-memory killer would take the server down. Not armed within another watch.
struct MemoryWatch {
    timer: Option<u32>,
    /// Whether the backend's memory could be read when armed (and so the watch holds the hard
    /// limit): where it cannot, the timer still ticks for the attempt's deadline
    /// (`deadline_watch`), with no ceiling.
    memory: bool,
}

/// The ceiling of a watch that could not read the backend's memory: armed (for the deadline
/// and the planner), never exceeded.
const UNREAD_CEILING: u64 = u64::MAX - 1;

/// Memory an attempt may take past the watch's ceiling before an allocation fails: the watch
/// asks for a cancel, which ends the query at its next interrupt check, but code that checks
/// for none (an output function printing a huge array, `to_jsonb` of a row) would grow the
/// backend until the kernel's out-of-memory killer took the server down. The hard limit makes
/// such an allocation fail, as an ERROR (53200), and leaves room for what ending it takes.
const HARD_HEADROOM_BYTES: u64 = 64 << 20;

impl MemoryWatch {
    fn arm(bytes: u64) -> MemoryWatch {
        use crate::compat::timeout::*;
        use std::sync::atomic::Ordering;
        if WATCH_CEILING.load(Ordering::Relaxed) != u64::MAX {
            return MemoryWatch {
                timer: None,
                memory: false,
            };
        }
        // SAFETY: reads the page size.
        let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        PAGE_BYTES.store(page.max(1), Ordering::Relaxed);
        let now = data_pages();
        let timer = WATCH_TIMER.get().unwrap_or_else(|| {
            // SAFETY: a timer of the backend's own, with a handler that is async-signal-safe.
            let id = unsafe {
                pg_sys::ffi::pg_guard_ffi_boundary(|| RegisterTimeout(USER_TIMEOUT, memory_watch))
            };
            // SAFETY: registers a callback for this backend's exit, once (with the timer).
            unsafe { pg_sys::before_shmem_exit(Some(disarm_at_exit), pg_sys::Datum::from(0)) };
            WATCH_TIMER.set(Some(id));
            id
        });
        WATCH_EXCEEDED.store(false, Ordering::Relaxed);
        let ceiling = now.map_or(UNREAD_CEILING, |now| {
            now.saturating_add(bytes / page.max(1)).min(UNREAD_CEILING)
        });
        WATCH_CEILING.store(ceiling, Ordering::Relaxed);
        // The guard first: what follows may raise, and its drop puts the limit back.
        let watch = MemoryWatch {
            timer: Some(timer),
            memory: now.is_some(),
        };
        if watch.memory {
            lower_hard_limit(
                ceiling
                    .saturating_mul(page)
                    .saturating_add(HARD_HEADROOM_BYTES),
            );
        }
        // SAFETY: utils/timeout.h on the backend's own timer.
        unsafe {
            let first = pg_sys::GetCurrentTimestamp() + i64::from(WATCH_INTERVAL_MS) * 1000;
            pg_sys::ffi::pg_guard_ffi_boundary(|| {
                enable_timeout_every(timer, first, WATCH_INTERVAL_MS)
            });
        }
        watch
    }

    /// Whether the watch holds the hard limit (a 53200 under it is the watch's).
    fn armed(&self) -> bool {
        self.memory
    }

    /// Whether the attempt went past the ceiling (its cancel is then the watch's).
    fn exceeded(&self) -> bool {
        self.timer.is_some() && WATCH_EXCEEDED.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for MemoryWatch {
    fn drop(&mut self) {
        use crate::compat::timeout::*;
        use std::sync::atomic::Ordering;
        let Some(timer) = self.timer else {
            return;
        };
        restore_hard_limit();
        // SAFETY: as in `arm`; the cancel flag is the backend's own, read and written on its
        // thread once the timer is off.
        unsafe {
            pg_sys::ffi::pg_guard_ffi_boundary(|| disable_timeout(timer, false));
            WATCH_CEILING.store(u64::MAX, Ordering::Relaxed);
            // The attempt ended before its next interrupt check: the cancel the watch asked
            // for would end the whole call at the next one.
            let pending = &raw mut pg_sys::QueryCancelPending;
            if WATCH_EXCEEDED.swap(false, Ordering::Relaxed)
                && std::ptr::read_volatile(pending) != 0
            {
                std::ptr::write_volatile(pending, 0);
            }
        }
    }
}

/// The data size limit as `lower_hard_limit` found it (soft and hard), what it lowered the soft
/// one to, and whether it is lowered now: process-wide, as the limit is, and changed only under
/// `LimitLock`, from the backend's thread (the watch) or any thread (the allocator).
static LOWERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static LOWERED_FROM: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];
static LOWERED_TO: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Set by the allocator when an allocation met the lowered limit (and was let through): the
/// attempt is past its memory, and the watch asks for its cancel.
static LIMIT_MET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Whether `LimitLock` is held.
static LIMIT_LOCKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// When `lift_hard_limit` put the limit back for an error's handling (`monotonic_ms`); 0: it
/// did not, or the limit is lowered again.
static LIFTED_AT_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// The page size, read when a watch is armed (for the timer handler, which may not ask).
static PAGE_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(4096);
/// How close to the lowered limit the backend's data must be for an out-of-memory error to be
/// the limit's own.
const AT_LIMIT_SLACK_BYTES: u64 = 16 << 20;
/// How long the limit stays put back after an error at most.
const LIFTED_FOR_MS: u64 = 1000;
/// How far past the backend's data the limit is raised for an error's handling.
const LIFT_RESERVE_BYTES: u64 = 32 << 20;
/// How far past where it was lowered the limit may be raised in an attempt before the
/// backend ends.
const MAX_LIFT_BYTES: u64 = 128 << 20;

/// Exclusive use of the data size limit: a spin lock, held for a `setrlimit` or two and at
/// most one allocation, that allocates nothing (the allocator takes it).
struct LimitLock;

impl LimitLock {
    fn take() -> LimitLock {
        use std::sync::atomic::Ordering;
        while LIMIT_LOCKED
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        LimitLock
    }
}

impl Drop for LimitLock {
    fn drop(&mut self) {
        LIMIT_LOCKED.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// The data size limit's soft value.
fn soft_data_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads the process's limit into a local.
    (unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut limit) } == 0).then_some(limit.rlim_cur)
}

/// Sets the data size limit's soft value (the hard one stays, so it can be raised back).
fn set_data_limit(soft: u64, hard: u64) -> bool {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: sets the process's own limit from a local; a soft limit at most the hard one
    // may always be set (lowering it below what is in use only stops further growth).
    unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) == 0 }
}

/// Lowers the backend's data size limit (`RLIMIT_DATA`: its heap and private mappings, not
/// shared memory) to `bytes`, unless it is lowered or lower already.
fn lower_hard_limit(bytes: u64) {
    use std::sync::atomic::Ordering;
    let _lock = LimitLock::take();
    if LOWERED.load(Ordering::SeqCst) {
        return;
    }
    let mut before = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads the process's limit into a local.
    if unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut before) } != 0 {
        return;
    }
    let wanted = libc::rlim_t::try_from(bytes).unwrap_or(libc::RLIM_INFINITY);
    if before.rlim_cur != libc::RLIM_INFINITY && before.rlim_cur <= wanted {
        return;
    }
    let lowered = wanted.min(before.rlim_max);
    LOWERED_FROM[0].store(before.rlim_cur, Ordering::SeqCst);
    LOWERED_FROM[1].store(before.rlim_max, Ordering::SeqCst);
    LOWERED_TO.store(lowered, Ordering::SeqCst);
    LOWERED.store(set_data_limit(lowered, before.rlim_max), Ordering::SeqCst);
}

/// Puts back what a memory watch changes for the whole process, for a backend that exits
/// during an attempt (a FATAL skips the watch's drop): what runs as it exits (the audit's line
/// of the call it exits in) must not meet the attempt's limit. Registered when the first watch
/// is armed, after the audit's callback, so it runs before it.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn disarm_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    restore_hard_limit();
    WATCH_CEILING.store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
    DEADLINE_NS.store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
    if DEADLINE_ENDED.load(std::sync::atomic::Ordering::Relaxed) {
        pgrx::log!(
            "sql_query_engine: a query took {MAX_CANCELS_CAUGHT} cancels past its deadline and \
             ran on, or ran on long past it: its connection was ended"
        );
    }
}

/// The hard limit did its work: an allocation failed, as an ERROR (53200), now being
/// reported. Handling it allocates too (PostgreSQL's error data, pgrx's copy of it), and at the
/// limit, with memory the rollback does not free yet (or at all: catalog cache entries the
/// query made), each of those allocations would fail again, one error inside another, until
/// PostgreSQL PANICked and restarted the whole server. So the limit is raised to
/// `LIFT_RESERVE_BYTES` past the backend's data for the error's handling, only when the backend
/// is at it (a 53200 that code reports itself far from it raises nothing), and the watch lowers
/// it again once there is room under it or after `LIFTED_FOR_MS`. Code that meets it again and
/// again (catching the error and growing on) may raise it `MAX_LIFT_BYTES` at most: then the
/// backend ends.
fn lift_hard_limit() {
    use std::sync::atomic::Ordering;
    let ends = {
        let _lock = LimitLock::take();
        if !LOWERED.load(Ordering::SeqCst) {
            return;
        }
        let lowered_to = LOWERED_TO.load(Ordering::SeqCst);
        let hard = LOWERED_FROM[1].load(Ordering::SeqCst);
        // The backend's data, or (unreadable) the limit it is at.
        let data = data_bytes()
            .or_else(soft_data_limit)
            .unwrap_or(lowered_to)
            .max(lowered_to);
        // Never past the hard limit, which no process may raise.
        let raised = data.saturating_add(LIFT_RESERVE_BYTES).min(hard);
        LIMIT_MET.store(true, Ordering::SeqCst);
        LIFTED_AT_MS.store(monotonic_ms().max(1), Ordering::SeqCst);
        let set = set_data_limit(raised, hard);
        !set || raised < data.saturating_add(LIFT_RESERVE_BYTES)
            || raised > lowered_to.saturating_add(MAX_LIFT_BYTES)
    };
    if ends {
        // Past what the limit may be raised by (code that meets it, catches the error and
        // grows on), or it could not be raised by the whole reserve (a hard limit close
        // above): the backend ends at its next interrupt check,
        // as `pg_terminate_backend` would have it, which code cannot catch.
        // SAFETY: the flags PostgreSQL's own SIGTERM handler sets (sig_atomic_t), on the
        // backend's thread.
        unsafe {
            std::ptr::write_volatile(&raw mut pg_sys::ProcDiePending, 1);
            std::ptr::write_volatile(&raw mut pg_sys::InterruptPending, 1);
        }
    }
}

/// Whether the backend's data is within `AT_LIMIT_SLACK_BYTES` of the lowered limit.
fn at_hard_limit() -> bool {
    use std::sync::atomic::Ordering;
    LOWERED.load(Ordering::SeqCst)
        && data_bytes().is_some_and(|data| {
            data.saturating_add(AT_LIMIT_SLACK_BYTES) >= LOWERED_TO.load(Ordering::SeqCst)
        })
}

/// Lowers the limit `lift_hard_limit` put back again, once there is room under it or it has
/// been lifted for `LIFTED_FOR_MS`; from the watch's timer handler, so it never waits for the
/// limit's lock (whoever holds it is interrupted): it tries again at the next tick.
fn relower_when_due() {
    use std::sync::atomic::Ordering;
    let lifted = LIFTED_AT_MS.load(Ordering::SeqCst);
    if lifted == 0 {
        return;
    }
    let room = data_bytes().is_some_and(|data| {
        data.saturating_add(AT_LIMIT_SLACK_BYTES) < LOWERED_TO.load(Ordering::SeqCst)
    });
    if !room && monotonic_ms() < lifted.saturating_add(LIFTED_FOR_MS) {
        return;
    }
    if LIMIT_LOCKED
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    if LIFTED_AT_MS.swap(0, Ordering::SeqCst) != 0
        && set_data_limit(
            LOWERED_TO.load(Ordering::SeqCst),
            LOWERED_FROM[1].load(Ordering::SeqCst),
        )
    {
        LOWERED.store(true, Ordering::SeqCst);
    }
    LIMIT_LOCKED.store(false, Ordering::Release);
}

/// The backend's data, in bytes (`data_pages`; async-signal-safe).
fn data_bytes() -> Option<u64> {
    data_pages()
        .map(|pages| pages.saturating_mul(PAGE_BYTES.load(std::sync::atomic::Ordering::Relaxed)))
}

/// Milliseconds of the monotonic clock (async-signal-safe).
fn monotonic_ms() -> u64 {
    monotonic_ns() / 1_000_000
}

/// Puts back the data size limit `lower_hard_limit` lowered.
fn restore_hard_limit() {
    use std::sync::atomic::Ordering;
    let _lock = LimitLock::take();
    if LOWERED.swap(false, Ordering::SeqCst) {
        set_data_limit(
            LOWERED_FROM[0].load(Ordering::SeqCst),
            LOWERED_FROM[1].load(Ordering::SeqCst),
        );
    }
    LIMIT_MET.store(false, Ordering::SeqCst);
    LIFTED_AT_MS.store(0, Ordering::SeqCst);
}

/// The allocator of the extension's Rust code: the system's, except that an allocation that
/// fails while the memory watch holds the data size limit lowered is let through: the limit is
/// raised for that one allocation and lowered again at once (so the attempt's next growth
/// fails again, as an ERROR of PostgreSQL's), and the attempt's cancel is asked for (it ends at
/// its next interrupt check, with 53200). Rust aborts the process when an allocation fails
/// (and PostgreSQL then restarts the server): a failed allocation of PostgreSQL's own is an
/// ERROR, the one the limit is there for, but the guard's copy of a huge statement, pgrx's copy
/// of an error, or a thread of the model client must not fail.
struct Allocator;

impl Allocator {
    /// `allocate`, tried once more under the limit it met raised, if it was lowered (judged
    /// under the lock: the limit may be being lowered or put back just now, by another thread).
    fn retried(allocate: impl Fn() -> *mut u8) -> *mut u8 {
        use std::sync::atomic::Ordering;
        let first = allocate();
        if !first.is_null() {
            return first;
        }
        let _lock = LimitLock::take();
        if !LOWERED.load(Ordering::SeqCst) {
            // Not lowered, or put back meanwhile: as the system allows.
            return allocate();
        }
        let hard = LOWERED_FROM[1].load(Ordering::SeqCst);
        // Back to the limit as it is now: lowered, or raised for an error's handling.
        let now = soft_data_limit().unwrap_or(LOWERED_TO.load(Ordering::SeqCst));
        set_data_limit(LOWERED_FROM[0].load(Ordering::SeqCst), hard);
        let second = allocate();
        set_data_limit(now, hard);
        // The watch asks for the cancel at its next tick (this may be another thread, and the
        // allocator references nothing of PostgreSQL's); put back with the limit, under the
        // same lock, so a late thread cannot cancel the next attempt.
        LIMIT_MET.store(true, Ordering::SeqCst);
        second
    }
}

// SAFETY: every call is the system allocator's with the same arguments (a failed one repeated
// once), so its contract holds.
unsafe impl std::alloc::GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        Allocator::retried(|| unsafe { std::alloc::System.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        Allocator::retried(|| unsafe { std::alloc::System.alloc_zeroed(layout) })
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on; a failed realloc leaves `ptr` valid, so it
        // may be tried again.
        Allocator::retried(|| unsafe { std::alloc::System.realloc(ptr, layout, new_size) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

/// For the backend tests: allocates `bytes` in Rust while a watch of `watched` bytes holds the
/// data size limit lowered, then as much in PostgreSQL; whether the Rust allocation succeeded,
/// whether the watch then asked for the attempt's cancel, and whether PostgreSQL's allocation
/// was still refused (the limit stays lowered after Rust's went through).
#[cfg(any(test, feature = "pg_test"))]
pub fn allocate_while_watched(watched: u64, bytes: usize) -> (bool, bool, bool) {
    let watch = MemoryWatch::arm(watched);
    let lowered = LOWERED.load(std::sync::atomic::Ordering::SeqCst);
    let block = vec![1u8; bytes];
    let refused = pgrx::PgTryBuilder::new(|| {
        // SAFETY: an allocation in the current memory context, freed with it.
        let _ = unsafe { pg_sys::MemoryContextAllocHuge(pg_sys::CurrentMemoryContext, bytes) };
        false
    })
    .catch_when(pgrx::PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY, |_| true)
    .execute();
    // The watch looks ten times a second.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let asked = watch.exceeded();
    let allocated = lowered && block.len() == bytes && block.last() == Some(&1);
    drop(watch);
    (allocated, asked, refused)
}

/// The per-attempt deadline. `SET LOCAL statement_timeout` would not apply to statements run
/// inside this call, so the statement timer is armed directly, and the caller's own deadline is
/// put back when this is dropped (also when an ERROR unwinds past it). When the caller's
/// deadline comes first it is left alone: then a timeout is the caller's and is re-raised.
struct StatementTimer {
    ours: Option<pg_sys::TimestampTz>,
    caller: Option<pg_sys::TimestampTz>,
    /// The deadline the memory watch enforced before (`DEADLINE_NS`), put back on drop.
    outer_deadline: u64,
    /// Whether the attempt ended with a cancel or timeout, which ends the call: a caller's
    /// deadline already past is then not armed again (its cancel, pending while that error is
    /// raised and caught by the caller's code, would hit the session's next statement).
    cancelled: bool,
}

/// When the running attempt's time is up (the earlier of its own deadline and the caller's),
/// on the monotonic clock in nanoseconds (`u64::MAX`: none): a statement timeout fires once,
/// and code of the query may catch its cancel (`EXCEPTION WHEN query_canceled` in another
/// role's view) and run on, so the memory watch asks again at each tick past it
/// (`deadline_watch`).
static DEADLINE_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);
/// Cancels asked past the deadline that the query took (none pending at the next tick) and ran
/// on: caught.
static CANCELS_CAUGHT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// Whether a cancel pending now is the deadline watch's own.
static DEADLINE_ASKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Whether the deadline watch ended the backend.
static DEADLINE_ENDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Cancels past the deadline a query may take and run on before its backend is ended: a query
/// that catches one to clean up ends at the next; one that catches each holds the backend,
/// its snapshot and its locks for as long as it likes otherwise, beyond cancel.
const MAX_CANCELS_CAUGHT: u32 = 10;
/// Past the deadline by this much, or by the attempt's own time when longer, a query still
/// running ends with its backend whatever the cancel flag says: code of the query may keep a
/// cancel of its own pending (`pg_cancel_backend(pg_backend_pid())` before a long computation
/// that checks for no interrupt, in a loop that catches it), so that the watch would never see
/// one taken. Code that checks for no interrupt for that long meets the end at its next check.
const DEADLINE_GRACE_NS: u64 = 10_000_000_000;
/// The attempt's grace past its deadline (`DEADLINE_GRACE_NS` at least), set with the deadline.
static GRACE_NS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(DEADLINE_GRACE_NS);

/// The monotonic clock in nanoseconds (async-signal-safe).
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe and writes only `now`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    u64::try_from(now.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0))
}

/// The deadline's part of the memory watch's tick (in the SIGALRM handler): past the deadline,
/// each cancel the query took while it ran on is counted, and another asked; past
/// `MAX_CANCELS_CAUGHT`, or once the query is overdue by its grace (`DEADLINE_GRACE_NS`)
/// whatever the cancel flag says, the backend is ended (FATAL, which no code can catch). The
/// first tick past it only counts: the statement timeout's own cancel may be ending the
/// attempt then.
fn deadline_watch() {
    use std::sync::atomic::Ordering;
    let deadline = DEADLINE_NS.load(Ordering::Relaxed);
    let now = monotonic_ns();
    if deadline == u64::MAX || now < deadline {
        return;
    }
    let overdue = now - deadline >= GRACE_NS.load(Ordering::Relaxed);
    // SAFETY: the flags a signal handler sets to ask for a cancel or the backend's end
    // (sig_atomic_t); PostgreSQL's SIGALRM handler sets the latch after its handlers ran.
    unsafe {
        if std::ptr::read_volatile(&raw const pg_sys::QueryCancelPending) != 0 && !overdue {
            return;
        }
        // The cancel asked last was taken: none of the watch's is pending now.
        DEADLINE_ASKED.store(false, Ordering::Relaxed);
        let caught = CANCELS_CAUGHT.fetch_add(1, Ordering::Relaxed) + 1;
        if caught > MAX_CANCELS_CAUGHT || overdue {
            DEADLINE_ENDED.store(true, Ordering::Relaxed);
            std::ptr::write_volatile(&raw mut pg_sys::ProcDiePending, 1);
        } else if caught > 1 {
            DEADLINE_ASKED.store(true, Ordering::Relaxed);
            std::ptr::write_volatile(&raw mut pg_sys::QueryCancelPending, 1);
        } else {
            return;
        }
        std::ptr::write_volatile(&raw mut pg_sys::InterruptPending, 1);
    }
}

impl StatementTimer {
    fn arm(timeout_ms: i32) -> Self {
        use crate::compat::timeout::*;
        // SAFETY: utils/timeout.h on the backend's own timer, through pgrx's FFI boundary.
        unsafe {
            let now = pg_sys::GetCurrentTimestamp();
            let ours = now + i64::from(timeout_ms) * 1000;
            let caller = pg_sys::ffi::pg_guard_ffi_boundary(|| {
                get_timeout_active(STATEMENT_TIMEOUT)
                    .then(|| get_timeout_finish_time(STATEMENT_TIMEOUT))
            });
            let first = caller.map_or(ours, |c| c.min(ours));
            let left_ns = u64::try_from(first - now).unwrap_or(0).saturating_mul(1000);
            CANCELS_CAUGHT.store(0, std::sync::atomic::Ordering::Relaxed);
            GRACE_NS.store(
                left_ns.max(DEADLINE_GRACE_NS),
                std::sync::atomic::Ordering::Relaxed,
            );
            let outer_deadline = DEADLINE_NS.swap(
                monotonic_ns().saturating_add(left_ns),
                std::sync::atomic::Ordering::Relaxed,
            );
            if caller.is_some_and(|c| c <= ours) {
                return StatementTimer {
                    ours: None,
                    caller,
                    outer_deadline,
                    cancelled: false,
                };
            }
            pg_sys::ffi::pg_guard_ffi_boundary(|| {
                enable_timeout_after(STATEMENT_TIMEOUT, timeout_ms)
            });
            StatementTimer {
                ours: Some(ours),
                caller,
                outer_deadline,
                cancelled: false,
            }
        }
    }

    /// Whether a statement timeout now is ours (our deadline passed, the caller's did not).
    fn fired(&self) -> bool {
        // SAFETY: reads the clock.
        let now = unsafe { pg_sys::GetCurrentTimestamp() };
        self.ours.is_some_and(|ours| now >= ours - 1000) && self.caller.is_none_or(|c| now < c)
    }
}

impl Drop for StatementTimer {
    fn drop(&mut self) {
        use crate::compat::timeout::*;
        use std::sync::atomic::Ordering;
        DEADLINE_NS.store(self.outer_deadline, Ordering::Relaxed);
        // The attempt ended before its next interrupt check: the cancel the deadline watch
        // asked for would end the whole call at the next one (the memory watch, dropped
        // first, asks for no more).
        if DEADLINE_ASKED.swap(false, Ordering::Relaxed) {
            // SAFETY: the backend's own flag, read and written on its thread once the memory
            // watch's timer is off.
            unsafe {
                let pending = &raw mut pg_sys::QueryCancelPending;
                if std::ptr::read_volatile(pending) != 0 {
                    std::ptr::write_volatile(pending, 0);
                }
            }
        }
        if self.ours.is_none() {
            // The caller's own deadline was the attempt's: when it fired during the attempt
            // and the query's code took its cancel and ran on, it is armed again (and fires at
            // once), so that the rest of the call (model requests, repairs) ends at it as any
            // statement would.
            if let Some(caller) = self.caller.filter(|_| !self.cancelled) {
                // SAFETY: as in `arm`.
                unsafe {
                    let active = pg_sys::ffi::pg_guard_ffi_boundary(|| {
                        get_timeout_active(STATEMENT_TIMEOUT)
                    });
                    if !active {
                        pg_sys::ffi::pg_guard_ffi_boundary(|| {
                            enable_timeout_at(STATEMENT_TIMEOUT, caller)
                        });
                    }
                }
            }
            return;
        }
        // SAFETY: as in `arm`; the cancel flag is the backend's own, read and written on its
        // thread.
        unsafe {
            // Our deadline passed after the statement's last interrupt check (it ended just in
            // time): the cancel it left pending would, once the timer is off, end the whole
            // call at the next check as if the user had cancelled. It is ours: cleared.
            let fired = pg_sys::ffi::pg_guard_ffi_boundary(|| {
                get_timeout_indicator(STATEMENT_TIMEOUT, false)
            });
            pg_sys::ffi::pg_guard_ffi_boundary(|| disable_timeout(STATEMENT_TIMEOUT, false));
            let pending = &raw mut pg_sys::QueryCancelPending;
            if fired && std::ptr::read_volatile(pending) != 0 {
                std::ptr::write_volatile(pending, 0);
            }
            // (Past already, behind a cancel that ends the call, it is not: see `cancelled`.)
            let past = self
                .caller
                .is_some_and(|c| pg_sys::GetCurrentTimestamp() >= c);
            if let Some(caller) = self.caller.filter(|_| !(past && self.cancelled)) {
                pg_sys::ffi::pg_guard_ffi_boundary(|| enable_timeout_at(STATEMENT_TIMEOUT, caller));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::unique_names;

    #[test]
    fn duplicate_column_names_become_unique() {
        let names: Vec<String> = ["a", "b", "a", "a_2", "a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(unique_names(&names), ["a", "b", "a_3", "a_2", "a_4"]);
    }

    #[test]
    fn names_made_unique_stay_within_a_column_names_bytes() {
        // Two aliases PostgreSQL cut to the same 63 bytes; one of multibyte characters.
        let long = "x".repeat(63);
        let wide = format!("{}a", "é".repeat(31));
        let names = vec![long.clone(), long.clone(), wide.clone(), wide.clone()];
        let unique = unique_names(&names);
        assert_eq!(unique[0], long);
        assert_eq!(unique[1], format!("{}_2", "x".repeat(61)));
        assert_eq!(unique[3], format!("{}_2", "é".repeat(30)));
        let distinct: std::collections::HashSet<&String> = unique.iter().collect();
        assert_eq!(distinct.len(), 4);
        assert!(unique.iter().all(|n| n.len() <= 63), "{unique:?}");
    }
}
