//! Reads of the value index shared by the backends of a deployment, through Redis when it is
//! configured: a new backend of a busy server (or of another node) takes the values other
//! backends read instead of reading every relation again.
//!
//! Only reads that are the same for every role are shared: tables and materialized views
//! without row-level security (`Relation::shareable`), kept per column, each under a key of its own (its number, so a column dropped and
//! added again under the same name is another), and a role takes only the columns of its own
//! schema context, which holds only what it may read. A relation's key names its storage
//! (`relfilenode`), so a TRUNCATE or a rewrite starts afresh, and expires after `TTL` (a
//! backend's own index is as old as its schema cache, which ANALYZE and DDL renew). Reads made
//! in a transaction that wrote something (whose rows nobody else may see yet), or with a
//! transaction's snapshot (REPEATABLE READ, SERIALIZABLE), are not shared; a standby (whose
//! replay, data and privileges alike, may be behind the primary's by hours with
//! `recovery_min_apply_delay`) neither shares its reads nor takes others'. Each
//! column's read carries the time it was made and is used for `TTL_S` from then, and its key
//! expires then: only a write that pays for a read keeps it in Redis.

use std::collections::HashMap;

use pgrx::pg_sys;

use crate::redis_client;
use crate::schema::TextColumns;

/// How long a shared read is used.
const TTL_S: u64 = 600;

/// Columns asked for in one Redis call: so many that a call's replies, each a stored read of
/// at most `MAX_STORED_BYTES`, fit in `MAX_CALL_BYTES` (a reply past it would lose every
/// column of the call).
const FIELDS_PER_CALL: usize = 4;

/// Bytes of shared reads fetched at most for one index (it keeps less), all calls together.
const MAX_FETCHED_BYTES: usize = 32 << 20;
/// Bytes of replies one call of `fetch` may read: a reply is held three times while it is
/// decoded (its bytes, Redis's values, the strings), so whoever answers at the Redis address
/// makes a call hold about three times this, not three times the client's 64 MB.
const MAX_CALL_BYTES: usize = FIELDS_PER_CALL * MAX_STORED_BYTES + (64 << 10);

/// The shared reads of `columns` (by column id) that Redis has: a round trip per
/// `FIELDS_PER_CALL` of them, until `deadline`, `MAX_FETCHED_BYTES` or `max_values` values were
/// fetched; each cut to `per_column` values (what an index keeps of a column); and how old the
/// oldest of them is (what holds them counts its time from then).
pub fn fetch(
    columns: &TextColumns,
    deadline: std::time::Instant,
    per_column: usize,
    max_values: usize,
) -> (HashMap<usize, Vec<String>>, std::time::Duration) {
    if !redis_client::configured() || on_standby() {
        return (HashMap::new(), std::time::Duration::ZERO);
    }
    // The key of each column whose read may be shared, with its column id.
    let flat: Vec<(String, usize)> = columns
        .relations()
        .into_iter()
        .flat_map(|relation| columns.of_relation(relation))
        .filter_map(|id| {
            let (relation_key, attnum) = columns.get(id).shared_as.as_ref()?;
            Some((column_key(relation_key, *attnum), id))
        })
        .collect();
    // In calls of a few columns each: a stored read is up to a few megabytes, and a call may
    // read `MAX_CALL_BYTES` at most (a larger reply is not read, and would lose every column
    // of it).
    let mut found = HashMap::new();
    let (mut bytes, mut values, mut oldest) = (0usize, 0usize, 0u64);
    for chunk in flat.chunks(FIELDS_PER_CALL) {
        if std::time::Instant::now() >= deadline
            || bytes >= MAX_FETCHED_BYTES
            || values >= max_values
        {
            break;
        }
        let keys: Vec<String> = chunk.iter().map(|(key, _)| key.clone()).collect();
        let limit = MAX_CALL_BYTES.min(MAX_FETCHED_BYTES - bytes);
        let answers: Option<Vec<Option<String>>> =
            redis_client::call(move |c| ::redis::cmd("MGET").arg(&keys).query(c.limit_next(limit)));
        for ((_, id), value) in chunk.iter().zip(answers.unwrap_or_default()) {
            let Some(stored) = value else { continue };
            bytes += stored.len();
            if let Some((age, mut read)) = fresh(&stored, now_s(), per_column) {
                read.truncate(per_column);
                values += read.len();
                oldest = oldest.max(age);
                found.insert(*id, read);
            }
        }
    }
    (found, std::time::Duration::from_secs(oldest))
}

/// A column's shared read as stored, `[at, values]`: when it was read (seconds since the
/// epoch), and its values.
#[derive(serde::Deserialize)]
struct Stored(u64, Vec<String>);

/// Bytes of a stored read, at most: what `store` writes for a column (its values, of at most
/// 80 characters each, escaped as JSON) is far less; a longer one is no stored read.
const MAX_STORED_BYTES: usize = 4 << 20;

/// The values of a stored read made less than `TTL_S` before `now` (a read dated more than a
/// minute ahead, by another node's clock, is not taken either), of at most `most` values, and
/// its age in seconds. It is measured before it is parsed: whoever answers at the Redis address
/// writes it, and a list of empty strings costs eight times its text.
fn fresh(stored: &str, now: u64, most: usize) -> Option<(u64, Vec<String>)> {
    // `[at,[v1,...,vn]]` holds n + 3 values.
    if stored.len() > MAX_STORED_BYTES
        || crate::text::json_shape(stored.as_bytes()).values > most.saturating_add(3)
    {
        return None;
    }
    let Stored(at, values) = serde_json::from_str(stored).ok()?;
    let age = now.saturating_sub(at);
    (at <= now + 60 && age < TTL_S).then_some((age, values))
}

/// Seconds since the epoch.
fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether this transaction's reads may be shared: nothing it wrote can be in them, and
/// they see what is committed now (on the primary: a standby's replay may be behind). A REPEATABLE READ or SERIALIZABLE transaction reads with
/// the snapshot it started with: rows deleted since would be shared again, for another
/// `TTL_S`, each time the shared read has expired.
pub fn may_share() -> bool {
    if !redis_client::configured() {
        return false;
    }
    // SAFETY: reads this backend's transaction state; no pointers are involved.
    let wrote = unsafe { pg_sys::GetTopTransactionIdIfAny() } != pg_sys::InvalidTransactionId;
    // SAFETY: as above: the backend's isolation level, a plain integer.
    let old_snapshot = unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32;
    !wrote && !old_snapshot && !on_standby()
}

/// Whether this server is a standby: its replay, and so its data and its catalog (what a role
/// may read), may be far behind the primary's, whose backends share the same keys.
fn on_standby() -> bool {
    // SAFETY: reads shared recovery state, as any backend may.
    unsafe { pg_sys::RecoveryInProgress() }
}

/// The Redis key of a relation's column's shared read: a key of its own, whose write pays for
/// it and whose expiry nothing else renews (columns of one hash kept a dropped column's large
/// read alive, renewed by a small write of another column, unpaid).
fn column_key(relation_key: &str, attnum: i16) -> String {
    redis_client::database_key("values", &format!("{relation_key}:{attnum}"))
}

/// Shares the reads `read` (column id, the values read) with the other backends.
pub fn store(columns: &TextColumns, read: &[(usize, Vec<String>)]) {
    let at = now_s();
    let stored: Vec<(String, String)> = read
        .iter()
        .filter_map(|(id, values)| {
            let (relation_key, attnum) = columns.get(*id).shared_as.as_ref()?;
            let json = serde_json::to_string(&(at, values)).ok()?;
            Some((column_key(relation_key, *attnum), json))
        })
        .collect();
    let bytes: usize = stored.iter().map(|(k, v)| k.len() + v.len()).sum();
    if stored.is_empty() || redis_client::spend(redis_client::Share::Values, bytes) != Some(true) {
        return;
    }
    let _: Option<()> = redis_client::call(move |c| {
        let mut pipe = ::redis::pipe();
        for (key, json) in &stored {
            pipe.cmd("SET")
                .arg(key)
                .arg(json)
                .arg("EX")
                .arg(TTL_S)
                .ignore();
        }
        pipe.query(c)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_read_is_used_for_its_own_ttl_only() {
        let stored = serde_json::to_string(&(1_000_000, ["Jane Roe"])).unwrap();
        assert_eq!(
            fresh(&stored, 1_000_000 + TTL_S - 1, 10),
            Some((TTL_S - 1, vec!["Jane Roe".into()]))
        );
        assert_eq!(fresh(&stored, 1_000_000 + TTL_S, 10), None);
        assert_eq!(fresh(&stored, 1_000_000 - 61, 10), None, "dated ahead");
        assert_eq!(
            fresh(r#"["Jane Roe"]"#, 1_000_000, 10),
            None,
            "an undated read"
        );
    }

    #[test]
    fn a_stored_read_of_more_values_than_a_store_writes_is_not_parsed() {
        let values = vec![String::new(); 11];
        let stored = serde_json::to_string(&(1_000_000, &values)).unwrap();
        assert_eq!(fresh(&stored, 1_000_000, 11).map(|v| v.1.len()), Some(11));
        assert_eq!(fresh(&stored, 1_000_000, 10), None);
        let long = serde_json::to_string(&(1_000_000, ["x".repeat(MAX_STORED_BYTES)])).unwrap();
        assert_eq!(fresh(&long, 1_000_000, 10), None);
    }
}
