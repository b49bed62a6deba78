//! The extension's own storage: the schema it is installed in, its tables (`nl_examples`,
//! `nl_history`, `nl_sessions`, `nl_feedback`, defined in `sql/`), and the reads and the
//! one best-effort write that the extension's own SQL makes, all on the pinned search path.

use pgrx::prelude::*;

use crate::error::{Error, Result};
use crate::subxact;

/// Refuses a database whose encoding is not UTF8 (0A000): what the model, an endpoint or
/// Redis sends is UTF-8, and passed on as the server's text (to the parser, the history, a
/// session) it would hold byte sequences the server's encoding does not allow, which a dump
/// then cannot restore; pgrx reads the server's text as UTF-8 too.
pub fn require_utf8() -> Result<()> {
    // SAFETY: reads the database's encoding, set when the backend connected.
    if unsafe { pg_sys::GetDatabaseEncoding() } == pg_sys::pg_enc::PG_UTF8 as i32 {
        return Ok(());
    }
    Err(Error::sql(
        "0A000",
        format!(
            "sql_query_engine works only in UTF8 databases; this one is {}",
            // SAFETY: the name of the database's encoding, a static string.
            unsafe { crate::names::c_string(pg_sys::GetDatabaseEncodingName()) }
        ),
        Some("Create the database with ENCODING 'UTF8' (and a UTF-8 locale) and install the extension there."),
    ))
}

/// The schema the extension lives in, quoted (for its own tables), read again after any catalog
/// change: its tables are found by this name, so its owner must be a superuser (the owner of a
/// schema may rename it and put tables of its own, with triggers, where the extension's were),
/// and a name read before a change could since find other tables.
pub fn extension_schema() -> Result<String> {
    // SAFETY: a catalog look-up by a NUL-terminated name.
    let extension = unsafe { pg_sys::get_extension_oid(c"sql_query_engine".as_ptr(), true) };
    if extension == pg_sys::InvalidOid {
        return Err(Error::Setting {
            message: "the extension sql_query_engine is not installed in this database".into(),
            hint: "CREATE EXTENSION sql_query_engine;".into(),
        });
    }
    // Read again only after a catalog change: a call asks for it many times (its cache key,
    // history, sessions, examples), and a rename or a new owner of the schema, committed by
    // another session, reaches this backend as an invalidation (taken in here first).
    // SAFETY: processes the invalidations other sessions sent, as a lock acquisition does,
    // then reads the backend's count of them.
    let seen = unsafe {
        pg_sys::AcceptInvalidationMessages();
        pg_sys::SharedInvalidMessageCounter
    };
    if let Some(schema) = CHECKED.with_borrow(|c| {
        c.as_ref()
            .filter(|(oid, at, _)| *oid == extension && *at == seen)
            .map(|(_, _, schema)| schema.clone())
    }) {
        return Ok(schema);
    }
    let (schema, owner, superuser) = subxact::pinned(|| {
        Spi::connect(|client| {
            let table = client.select(
                "SELECT quote_ident(n.nspname), r.rolname::text, r.rolsuper \
                 FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace \
                 JOIN pg_roles r ON r.oid = CASE \
                     WHEN n.nspowner = 'pg_database_owner'::regrole \
                     THEN (SELECT d.datdba FROM pg_database d \
                           WHERE d.datname = current_database()) \
                     ELSE n.nspowner END \
                 WHERE e.oid = $1",
                Some(1),
                &[extension.into()],
            )?;
            if table.is_empty() {
                return Ok(None);
            }
            let row = table.first();
            Ok(Some((
                row.get::<String>(1)?.unwrap_or_default(),
                row.get::<String>(2)?.unwrap_or_default(),
                row.get::<bool>(3)?.unwrap_or(false),
            )))
        })
    })
    .map_err(|e: pgrx::spi::Error| {
        Error::internal(format!("reading the extension's schema failed: {e}"))
    })?
    .ok_or_else(|| Error::internal("the extension has no schema"))?;
    if !superuser {
        return Err(Error::Setting {
            message: format!(
                "sql_query_engine is installed in schema {schema}, whose owner {owner} is not a \
                 superuser: it could put tables of its own in place of the extension's"
            ),
            hint: format!(
                "A superuser: ALTER SCHEMA {schema} OWNER TO a superuser, or install the \
                 extension again in a schema a superuser owns."
            ),
        });
    }
    // SAFETY: reads the backend's count of invalidations (those the read took in included).
    let seen = unsafe { pg_sys::SharedInvalidMessageCounter };
    CHECKED.with_borrow_mut(|c| *c = Some((extension, seen, schema.clone())));
    Ok(schema)
}

thread_local! {
    /// The extension, the count of invalidations its schema was last checked at, and the
    /// schema (quoted).
    static CHECKED: std::cell::RefCell<Option<(pg_sys::Oid, u64, String)>> =
        const { std::cell::RefCell::new(None) };
}

/// The first column of the first row of a read (None without rows). Read-only SPI: it
/// assigns no transaction id (pgrx's `Spi::get_one` does, which fails on a hot standby and
/// costs an XID per question).
pub fn read_one<T: pgrx::FromDatum + pgrx::IntoDatum>(
    sql: &str,
    args: &[pgrx::datum::DatumWithOid],
) -> std::result::Result<Option<T>, pgrx::spi::Error> {
    Spi::connect(|client| {
        let table = client.select(sql, Some(1), args)?;
        if table.is_empty() {
            return Ok(None);
        }
        table.first().get_one::<T>()
    })
}

/// The text of the first column of the first row of `sql` (its arguments `args`, each a type
/// and a value, none null), read as the catalog is now: under the latest snapshot, whatever the
/// isolation level, with the invalidations other sessions sent taken in first. For a check
/// made again after a wait (the model's): the statement's snapshot, or a REPEATABLE READ
/// transaction's, was taken before it, and would not show what another role committed
/// meanwhile.
pub fn read_text_now(
    sql: &std::ffi::CStr,
    args: &[(pg_sys::Oid, pg_sys::Datum)],
) -> std::result::Result<Option<String>, String> {
    /// Finishes the SPI connection made below, on every path.
    struct Connected;
    impl Drop for Connected {
        fn drop(&mut self) {
            // SAFETY: finishes the connection this function made, the innermost one.
            unsafe { pg_sys::SPI_finish() };
        }
    }
    // Invalidation messages are taken in as any lock acquisition does; the arguments have the
    // declared types, as many nulls flags, all "not null"; the text is copied out before the
    // connection is finished.
    // SAFETY: one read-only statement through SPI, under a snapshot SPI registers for it.
    unsafe {
        pg_sys::AcceptInvalidationMessages();
        if pg_sys::SPI_connect() != pg_sys::SPI_OK_CONNECT as i32 {
            return Err("SPI_connect failed".into());
        }
        let _connected = Connected;
        let mut types: Vec<pg_sys::Oid> = args.iter().map(|(t, _)| *t).collect();
        let mut values: Vec<pg_sys::Datum> = args.iter().map(|(_, v)| *v).collect();
        let nulls = std::ffi::CString::new(" ".repeat(args.len())).unwrap_or_default();
        let plan = pg_sys::SPI_prepare(sql.as_ptr(), args.len() as i32, types.as_mut_ptr());
        if plan.is_null() {
            return Err("SPI_prepare failed".into());
        }
        let done = pg_sys::SPI_execute_snapshot(
            plan,
            values.as_mut_ptr(),
            nulls.as_ptr(),
            pg_sys::GetLatestSnapshot(),
            std::ptr::null_mut(),
            true,
            false,
            1,
        );
        if done != pg_sys::SPI_OK_SELECT as i32 {
            return Err(format!("SPI_execute_snapshot returned {done}"));
        }
        let table = pg_sys::SPI_tuptable;
        if table.is_null() || pg_sys::SPI_processed == 0 {
            return Ok(None);
        }
        let text = pg_sys::SPI_getvalue(*(*table).vals, (*table).tupdesc, 1);
        Ok((!text.is_null()).then(|| crate::names::c_string(text)))
    }
}

/// Longest wait for a lock on one of the extension's tables: bookkeeping never blocks an answer.
const LOCK_TIMEOUT: &std::ffi::CStr = c"100ms";

/// Whether this transaction can write the extension's tables (not read-only, not a standby).
pub fn writable() -> bool {
    // SAFETY: reads of backend state.
    unsafe { !pg_sys::XactReadOnly && !pg_sys::RecoveryInProgress() }
}

/// Runs the extension's own write `work` (its bookkeeping: history, sessions) so that it never
/// makes the call fail: in a subtransaction that is committed when it succeeds (see
/// `best_effort`). Returns what `work` returned, when it was written.
pub fn write_best_effort<T, F>(what: &str, work: F) -> Option<T>
where
    F: FnOnce(&mut pgrx::spi::SpiClient<'_>) -> std::result::Result<T, pgrx::spi::Error>,
{
    best_effort(true, what, work)
}

/// Runs the extension's own read `work` of its tables (a conversation's turns) so that it
/// never makes the call fail or wait (their owner may lock them; see `best_effort`). `None`
/// when it could not be read.
pub fn read_best_effort<T, F>(what: &str, work: F) -> Option<T>
where
    F: FnOnce(&mut pgrx::spi::SpiClient<'_>) -> std::result::Result<T, pgrx::spi::Error>,
{
    best_effort(false, what, work)
}

/// `work` in a subtransaction, committed when `commit` and it succeeded, with a short lock
/// timeout, the pinned search path and row security on (like a function's SET clause: a
/// caller's `row_security = off` would make the policies refuse its own history row); a
/// failure is swallowed and logged, naming `what` (a cancel, a resource or system error ends
/// the call, see `subxact::in_subtransaction`).
fn best_effort<T, F>(commit: bool, what: &str, work: F) -> Option<T>
where
    F: FnOnce(&mut pgrx::spi::SpiClient<'_>) -> std::result::Result<T, pgrx::spi::Error>,
{
    let settings = [
        (c"lock_timeout", LOCK_TIMEOUT),
        (c"search_path", subxact::PINNED_SEARCH_PATH),
        (c"row_security", c"on"),
    ];
    let done = subxact::in_subtransaction(commit, || {
        subxact::with_settings(&settings, || Spi::connect_mut(work))
    });
    let failed = |why: &dyn std::fmt::Debug| {
        let verb = if commit { "written" } else { "read" };
        crate::error::log(format!("sql_query_engine: {what} not {verb}: {why:?}"));
    };
    match done {
        Ok(Ok(done)) => Some(done),
        Ok(Err(e)) => {
            failed(&e);
            None
        }
        Err(caught) => {
            failed(&caught);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every script that can run first, the install's or an update's (an update from any
    /// version starts its chain with that version's script), opens with the check that no role
    /// but a superuser could have put an operator or function in the extension's schema: each
    /// runs as a superuser with that schema first on its search path. Update scripts then pin
    /// the search path to pg_catalog.
    #[test]
    fn every_script_opens_with_the_schema_check() {
        let sql = concat!(env!("CARGO_MANIFEST_DIR"), "/sql");
        let check = std::fs::read_to_string(format!("{sql}/schema_trusted.sql")).unwrap();
        let mut scripts = 0;
        for entry in std::fs::read_dir(sql).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if !name.starts_with("sql_query_engine--") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // An update script then resolves names in pg_catalog alone: an object another role
            // committed in the schema after the check is never found.
            let update = name.matches("--").count() == 2;
            assert!(
                !update
                    || text.contains(&format!(
                        "{check}SET LOCAL search_path = pg_catalog, pg_temp;\n"
                    )),
                "{name} does not pin the search path after the schema check"
            );
            // Before the check only comments and the line psql stops at.
            let before = text.split(&check).next().unwrap();
            assert!(
                text.contains(&check),
                "{name} does not run the schema check"
            );
            assert!(
                before.lines().all(|line| line.is_empty()
                    || line.starts_with("--")
                    || line.starts_with("\\echo")),
                "{name} runs statements before the schema check"
            );
            scripts += 1;
        }
        assert!(scripts >= 17, "{scripts} scripts");
    }
}
