//! Reading the schema the caller may see, in a few catalog queries (in the style of
//! pg_graphql's `load_sql_context.sql`): relations in the schemas searched that the caller can SELECT from,
//! with the columns it can SELECT, their types, nullability, informative defaults, enum labels,
//! keys, foreign keys, comments, row estimates and, when sample values are on, the planner's
//! most common values. Names come back quoted by PostgreSQL's own `quote_ident`.
//!
//! The query runs with the pinned search path (`subxact::pinned`): every name in it resolves to
//! the built-in one, whatever the caller's search path holds. What depends on the caller's path
//! (which schemas to read, which names need qualifying) is computed with the server's own
//! functions outside it.

use std::collections::HashMap;

use pgrx::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::names::printable;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Relation {
    pub oid: u32,
    /// Quoted schema name.
    pub schema: String,
    /// Quoted relation name.
    pub name: String,
    /// `table`, `view`, `materialized view`, `foreign table` or `partitioned table`.
    pub kind: String,
    /// Whether the unqualified name resolves to this relation on the search path.
    #[serde(default)]
    pub visible: bool,
    pub comment: Option<String>,
    /// Planner estimate; negative when the relation was never analyzed.
    pub rows: f64,
    #[serde(default)]
    pub columns: Vec<Column>,
    #[serde(default)]
    pub primary_key: Vec<String>,
    #[serde(default)]
    pub unique: Vec<Vec<String>>,
    /// Its primary or unique keys that are DEFERRABLE: a transaction may hold duplicates
    /// until it commits, and PostgreSQL derives nothing from them.
    #[serde(default)]
    pub deferrable: Vec<Vec<String>>,
    /// A table with inheritance children, whose rows a query of it reads too: its keys do
    /// not cover theirs.
    #[serde(default)]
    pub inherited: bool,
    #[serde(default)]
    pub foreign_keys: Vec<ForeignKey>,
    /// Whether what the extension reads of it on its own is the same for every role that may
    /// read a column of it, so that the read may be shared (`values`): a permanent table or
    /// materialized view without row-level security. Not a partitioned table: a partition
    /// attached while the read ran (it takes no lock that ATTACH waits for) and detached again
    /// would leave its rows in a read stored under the partition set of before.
    #[serde(default)]
    pub shareable: bool,
    /// Its storage (`relfilenode`; none, 0, for a view or a partitioned table): new after
    /// TRUNCATE, VACUUM FULL or a rewrite. It names a shared read (`shareable`).
    #[serde(default)]
    pub filenode: u32,
    /// A fingerprint of who may read it (its owner, the grants on it, its columns and its
    /// schema) as the context was read: it names a shared read too, so that rows read before a
    /// GRANT (and deleted since) are not taken by the role it gave them to.
    #[serde(default)]
    pub grants: Option<String>,
    /// The locks a read of it on the extension's own takes: the relation, its indexes, and a
    /// partitioned table's partitions (at every level) and theirs.
    #[serde(default)]
    pub locks: u32,
    /// Whether one of its partitions or inheritance children (at any level) is a foreign table.
    #[serde(default)]
    pub foreign_parts: bool,
    /// Bytes of the catalog's text (decompressed) that opening and planning a read of it loads
    /// into the connection's caches, where they stay for as long as it lives: its and its
    /// partitions' index expressions and predicates, defaults and fast defaults, constraints,
    /// triggers' arguments, rules, policies, partition keys and bounds; one with an extended
    /// statistic counts past any bound.
    #[serde(default)]
    pub catalog_bytes: i64,
    /// Its owner's OID: reads of relations of roles the caller does not trust have a budget of
    /// their own (`loads_within_bounds`).
    #[serde(default)]
    pub owner: u32,
}

/// Locks a read on the extension's own may take: each is a lock of the caller's transaction,
/// and the server's lock table is shared and bounded.
const MAX_OWN_READ_LOCKS: u32 = 256;
/// Catalog text reads on the extension's own may load into the connection's caches in all,
/// over its relations: each relation's bound alone would let a thousand of them fill them.
/// Twice: once for relations of roles the caller trusts (its own, superusers',
/// `trusted_owners`'), once for the others', so that another role's tables, read first, do
/// not use up what the caller's own need.
const MAX_OWN_READS_CATALOG_BYTES: i64 = 16 << 20;

/// What reads on the extension's own loaded in this connection, by role (one connection
/// serves many behind the gateway) and by whether the relation's owner is trusted: each
/// relation's catalog text as last seen (and in which of the two it was counted), and their
/// sums.
#[derive(Default)]
struct Loaded {
    by_relation: HashMap<(u32, u32), (i64, bool)>,
    by_role: HashMap<(u32, bool), i64>,
}

thread_local! {
    static OWN_READS_LOADED: std::cell::RefCell<Loaded> = std::cell::RefCell::new(Loaded::default());
}

/// Whether relation `oid`, whose read now loads `bytes` of catalog text, may be read on the
/// extension's own for the current role: within the relation's bound, and within the role's
/// over the relations it may read so in this connection (each counted at its latest size),
/// those of owners it trusts (`trusted`) and the others' apart.
fn loads_within_bounds(oid: u32, bytes: i64, trusted: bool) -> bool {
    if bytes > MAX_OWN_READ_CATALOG_BYTES {
        return false;
    }
    // SAFETY: reads the backend's current role.
    let role = unsafe { pg_sys::GetUserId() }.to_u32();
    OWN_READS_LOADED.with_borrow_mut(|loaded| {
        let before = loaded.by_relation.get(&(role, oid)).copied();
        // Counted before in the same sum, it is counted again at its latest size; in the
        // other (its owner is trusted now, or no longer), it leaves that one.
        let same = before
            .filter(|(_, was)| *was == trusted)
            .map_or(0, |(b, _)| b);
        let total = loaded.by_role.get(&(role, trusted)).copied().unwrap_or(0);
        let after = total - same + bytes;
        if after > MAX_OWN_READS_CATALOG_BYTES
            || (before.is_none() && loaded.by_relation.len() >= 1 << 16)
        {
            return false;
        }
        if let Some((other, was)) = before.filter(|(_, was)| *was != trusted) {
            if let Some(sum) = loaded.by_role.get_mut(&(role, was)) {
                *sum -= other;
            }
        }
        loaded.by_relation.insert((role, oid), (bytes, trusted));
        loaded.by_role.insert((role, trusted), after);
        true
    })
}

/// What `OWN_READ_LOADS_SQL` measures.
#[derive(Deserialize)]
struct OwnReadLoads {
    locked: Vec<i64>,
    locks: i64,
    bytes: i64,
    /// None when the relation is gone.
    owner: Option<i64>,
    named: bool,
}

/// Whether relation `oid` may still be read on the extension's own as its read begins, measured
/// again from the catalog once it and its partitions are locked: the schema context measured
/// it when it was read, and another session may have changed it since, also while an earlier
/// read of this call waited for a lock that session held (a default of hundreds of megabytes
/// given meanwhile would be loaded into the caller's catalog cache by the read). Locked, it
/// keeps what takes the relation's ACCESS EXCLUSIVE lock (defaults, constraints, rules,
/// policies, a partition detached) until the read's subtransaction ends. Its partitions and
/// the indexes of all are locked before the last measure, so that planning the read waits for
/// nothing another session holds after it; what only takes a weaker lock (an index, a
/// trigger, a statistic, a partition attached) can still be committed in the moment between
/// the measure and the read. The locks are the read's (given back when its subtransaction
/// ends). `Some(why)` refuses the read.
pub fn own_read_still_bounded(oid: pg_sys::Oid, name: &str) -> Option<String> {
    const ACCESS_SHARE: pg_sys::LOCKMODE = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
    // SAFETY: locks a relation by OID in the current (sub)transaction, as a read of it would;
    // one dropped meanwhile locks nothing that matters, and its kind reads as none.
    let partitioned = unsafe {
        pg_sys::LockRelationOid(oid, ACCESS_SHARE);
        pg_sys::get_rel_relkind(oid) as u8 == pg_sys::RELKIND_PARTITIONED_TABLE
    };
    // Under the latest snapshot: the statement's, or a REPEATABLE READ transaction's, was
    // taken before whatever another session committed while this call waited, and opening
    // the relation loads the catalog as it is now.
    let text_name = name.into_datum();
    let measure = || -> Option<OwnReadLoads> {
        let json = crate::subxact::pinned(|| {
            crate::store::read_text_now(
                OWN_READ_LOADS_SQL,
                &[
                    (pg_sys::OIDOID, oid.into()),
                    (pg_sys::BOOLOID, pg_sys::Datum::from(partitioned)),
                    (
                        pg_sys::INT8OID,
                        pg_sys::Datum::from(i64::from(MAX_OWN_READ_LOCKS)),
                    ),
                    (pg_sys::TEXTOID, text_name?),
                ],
            )
            .ok()
            .flatten()
        })?;
        serde_json::from_str(&json).ok()
    };
    let gone =
        || Some("the relation is gone, or no longer under the name it is read by".to_string());
    // A name that names another relation now (this one renamed meanwhile, another made under
    // its name) would have the read open one that was never measured.
    let too_many = |locks: i64| {
        (locks > i64::from(MAX_OWN_READ_LOCKS)).then(|| {
            format!("a read of it would take {locks} locks, more than {MAX_OWN_READ_LOCKS}")
        })
    };
    let Some(OwnReadLoads {
        locked,
        locks,
        owner: Some(_),
        named: true,
        ..
    }) = measure()
    else {
        return gone();
    };
    if let Some(why) = too_many(locks) {
        return Some(why);
    }
    // Everything planning the read locks, locked now: planning waits for no lock another
    // session holds after the measure below (a REINDEX holding an index while that session
    // gives the table a trigger of 30 MB).
    for relation in &locked {
        pgrx::check_for_interrupts!();
        // SAFETY: as above, a partition's or an index's OID the catalog just gave.
        unsafe { pg_sys::LockRelationOid(pg_sys::Oid::from(*relation as u32), ACCESS_SHARE) };
    }
    // Measured again now that they are locked too: a partition attached or an index made
    // before its lock was taken would be read without its lock having been counted.
    let Some(OwnReadLoads {
        locked: now,
        locks,
        bytes,
        owner: Some(owner),
        named: true,
    }) = measure()
    else {
        return gone();
    };
    if now != locked {
        return Some("its partitions or indexes changed as it was about to be read".into());
    }
    if let Some(why) = too_many(locks) {
        return Some(why);
    }
    let trusted =
        crate::guard::trusted_by_the_current_user().trusts(pg_sys::Oid::from(owner as u32));
    (!loads_within_bounds(oid.to_u32(), bytes, trusted)).then(|| {
        format!(
            "opening it would load {bytes} bytes of catalog text into the connection's caches, \
             more than reads on the extension's own may (1 MB a relation, 16 MB in all)"
        )
    })
}

/// What a read on the extension's own of `relation` from `read_from` (`Relation::own_read_from`)
/// must find once it holds its lock (`own_read_still_bounded`), with the columns it reads by
/// number when its values are shared.
pub fn own_read(
    relation: pg_sys::Oid,
    read_from: &str,
    columns: Option<Vec<i16>>,
) -> crate::exec::OwnRead {
    // The qualified name, as the read writes it after `ONLY` for a plain table.
    let name = read_from
        .strip_prefix("ONLY ")
        .unwrap_or(read_from)
        .to_string();
    crate::exec::OwnRead {
        relation,
        columns,
        still_readable: std::rc::Rc::new(move || own_read_still_bounded(relation, &name)),
    }
}

/// Catalog text a read on the extension's own may load into the connection's caches
/// (`Relation::catalog_bytes`): another role's tables in the caller's context (an index on
/// `c || '<100 MB literal>'`, a trigger's 300 MB argument, stored compressed in a few) would
/// fill them, question after question, until `max_query_memory` ends the connection.
const MAX_OWN_READ_CATALOG_BYTES: i64 = 1 << 20;
/// Steps of the walk down to partitions and inheritance children, for all the relations read
/// together (when it is cut short, no relation with children is read on the extension's own
/// nor are its statistics read): another role's chain or lattice of inheriting tables costs
/// this much, not its square.
pub(super) const MAX_INHERITANCE_STEPS: i64 = 100_000;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
pub struct Column {
    /// Quoted column name.
    pub name: String,
    /// Its number in the relation: a column dropped and added again under the same name has
    /// another.
    #[serde(default)]
    pub attnum: i16,
    /// The type as written from the caller's search path (`format_type`, run outside the
    /// pinned path).
    #[serde(rename = "type", default)]
    pub type_name: String,
    #[serde(default)]
    pub type_oid: u32,
    #[serde(default)]
    pub typmod: i32,
    pub not_null: bool,
    /// The default expression, when it says something (not a sequence's nextval).
    pub default: Option<String>,
    pub comment: Option<String>,
    /// Labels of an enum type: part of the schema, shown even when sample values are off.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Whether the type has labels beyond `labels` (only some were read).
    #[serde(default)]
    pub labels_cut: bool,
    /// Whether the column holds text (where sample values help the model most).
    #[serde(default)]
    pub textual: bool,
    /// Most common values from the planner's statistics (sample values on, ANALYZE ran).
    #[serde(default)]
    pub common_values: Vec<String>,
    /// Whether the common values cover (nearly) every row: then they are all the values.
    #[serde(default)]
    pub all_values: bool,
    /// The planner's histogram bounds of a text column: values spread over the whole table,
    /// for the value index (sample values on, ANALYZE ran).
    #[serde(default)]
    pub histogram: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct ForeignKey {
    pub columns: Vec<String>,
    /// The referenced relation as it should be written (qualified when not visible).
    #[serde(default)]
    pub references: String,
    /// Quoted schema and name of the referenced relation.
    pub ref_schema: String,
    pub ref_name: String,
    pub ref_oid: u32,
    pub ref_columns: Vec<String>,
}

impl Relation {
    /// Where the extension may read this relation on its own (schema samples, the value
    /// index), so that the read runs no code: plain tables without their inheritance children
    /// (`ONLY`), materialized views, and partitioned tables whole, none foreign, each read
    /// taking at most `MAX_OWN_READ_LOCKS` locks; never views (their owner's
    /// functions), foreign tables (a read connects elsewhere) or relations where row-level
    /// security applies to the caller (its policies are their owner's code). The guard checks
    /// again when it reads (`guard::Origin::Own`).
    /// `trusted` is what the caller trusts (`guard::trusted_by_the_current_user`), resolved
    /// once for the relations it reads.
    pub fn own_read_from(&self, trusted: &crate::guard::Trusted) -> Option<String> {
        let qualified = format!("{}.{}", self.schema, self.name);
        if self.locks > MAX_OWN_READ_LOCKS {
            return None;
        }
        let from = match self.kind.as_str() {
            "table" | "materialized view" => format!("ONLY {qualified}"),
            "partitioned table" if !self.foreign_parts => qualified,
            _ => return None,
        };
        // SAFETY: a catalog look-up of a relation the caller may read.
        let row_security = unsafe {
            pg_sys::check_enable_rls(pg_sys::Oid::from(self.oid), pg_sys::InvalidOid, true)
        };
        // Counted last, only for a relation that would be read.
        (row_security == pg_sys::CheckEnableRlsResult::RLS_NONE as i32
            && loads_within_bounds(
                self.oid,
                self.catalog_bytes,
                trusted.trusts(pg_sys::Oid::from(self.owner)),
            ))
        .then_some(from)
    }

    /// How the relation is written in SQL from the caller's search path.
    pub fn sql_name(&self) -> String {
        if self.visible {
            self.name.clone()
        } else {
            format!("{}.{}", self.schema, self.name)
        }
    }
}

/// Built-in types whose constants a default may hold to be shown: their text is bounded by
/// what they store (not numeric's, bit's, nor anything holding one, a jsonb, a range; nor an
/// array's, whose NULL elements take a bit each and are written `NULL`). Booleans, integers,
/// floats, money, text and names, dates and times, intervals, UUIDs and JSON text. Not the
/// `reg*` types: writing one looks its object up, and an OID that names nothing leaves an
/// entry in the caller's catalog cache for as long as the connection lives (a sequence's
/// `nextval('s'::regclass)` is not shown anyway).
const BOUNDED_TEXT_TYPES: &[u32] = &[
    16, 18, 19, 20, 21, 23, 25, 26, 114, 700, 701, 790, 1042, 1043, 1082, 1083, 1114, 1184, 1186,
    1266, 2950,
];

/// Constants a default may hold at most to be shown: each is written out (an enum's label
/// looked up) for every such column of every relation in reach.
const MAX_DEFAULT_CONSTANTS: i64 = 8;

/// Bytes of defaults, comments and enum labels read with the columns at most.
const MAX_ANNOTATION_BYTES: i64 = 16 << 20;
/// Bytes of JSON each catalog query returns at most, counted on what it emits, in search
/// order: the counts below bound how many names, comments and values another role's objects
/// bring, and this what they weigh (a name of control characters is six times its length in
/// JSON), so that a schema another role fills is not all held in the caller's backend.
const MAX_QUERY_BYTES: i64 = 16 << 20;
/// The same for the columns, of which a schema holds many more.
const MAX_COLUMN_BYTES: i64 = 32 << 20;
/// Keys read at most per relation, and in all.
const MAX_KEYS_PER_RELATION: i64 = 64;
const MAX_KEYS: i64 = 10_000;
/// Relations read at most, in search order.
const MAX_RELATIONS: i64 = 10_000;
/// Columns of the relations read at most (a relation that would pass it is left out).
const MAX_COLUMNS: i64 = 100_000;
/// Characters of a value read from the planner's statistics: one more than the value index
/// matches (`values::MAX_VALUE_CHARS`), so that a value cut here is too long for it, as the
/// whole value is; samples show fewer.
const MAX_STATISTIC_CHARS: i32 = 81;
/// Most common values, and histogram bounds, read per column (the default statistics target
/// keeps 100).
const MAX_STATISTICS_PER_COLUMN: i32 = 200;
/// Statistics values read in all.
const MAX_STATISTICS: i64 = 200_000;
/// Values of a column's statistics array that are turned into text (the default statistics
/// target keeps 100).
const MAX_STATISTIC_ARRAY_VALUES: i32 = 1000;
/// Stored bytes of a column's statistics array that is looked at (a compressed array holds at
/// most a few hundred times as much): ANALYZE keeps no value wider than a kilobyte, but since
/// PostgreSQL 18 a table's owner (and whoever has MAINTAIN on it) may store any statistics
/// (`pg_restore_attribute_stats`), and counting or converting an array reads all of it.
const MAX_STATISTIC_ARRAY_BYTES: i32 = 64 << 10;
/// Stored bytes of the statistics arrays looked at in all, in the order of the columns: each
/// array is read whole to be counted and turned into text, and one stored in 64 kB may hold
/// megabytes once decompressed.
const MAX_STATISTICS_STORED_BYTES: i64 = 4 << 20;

/// The roles whose privileges the caller has (itself included; every role for a superuser),
/// in SQL: listed once for a query (an uncorrelated subquery).
macro_rules! callers_roles {
    () => {
        "ARRAY(SELECT ro.oid FROM pg_roles ro WHERE pg_has_role(ro.oid, 'USAGE'))"
    };
}

/// Bytes of catalog text, as stored decompressed (`octet_length` of a stored text reads its
/// size, not the text), that opening and planning a read of relation `$rel` loads into the
/// connection's caches, where they stay for as long as it lives (`Relation::catalog_bytes`), in
/// SQL.
macro_rules! catalog_text_of {
    ($rel:literal) => {
        concat!(
            "coalesce((SELECT sum(coalesce(octet_length(i.indexprs::text), 0)
                                + coalesce(octet_length(i.indpred::text), 0))
                     FROM pg_index i WHERE i.indrelid = ",
            $rel,
            "), 0)
           + coalesce((SELECT sum(octet_length(a.adbin::text))
                       FROM pg_attrdef a WHERE a.adrelid = ",
            $rel,
            "), 0)
           + coalesce((SELECT sum(octet_length(co.conbin::text))
                       FROM pg_constraint co WHERE co.conrelid = ",
            $rel,
            "), 0)
           + coalesce((SELECT sum(octet_length(t.tgargs)
                                  + coalesce(octet_length(t.tgqual::text), 0))
                       FROM pg_trigger t WHERE t.tgrelid = ",
            $rel,
            "), 0)
           + coalesce((SELECT sum(octet_length(w.ev_action::text)
                                  + octet_length(w.ev_qual::text))
                       FROM pg_rewrite w WHERE w.ev_class = ",
            $rel,
            "), 0)
           + coalesce((SELECT sum(coalesce(octet_length(p.polqual::text), 0)
                                  + coalesce(octet_length(p.polwithcheck::text), 0))
                       FROM pg_policy p WHERE p.polrelid = ",
            $rel,
            "), 0)
           + coalesce((SELECT octet_length(pt.partexprs::text)
                       FROM pg_partitioned_table pt WHERE pt.partrelid = ",
            $rel,
            "), 0)
           + coalesce((SELECT octet_length(c.relpartbound::text)
                       FROM pg_class c WHERE c.oid = ",
            $rel,
            "), 0)
           -- An extended statistic's data (and expressions), which planning loads into the
           -- catalog cache, only its owner may size: a relation that has one is counted past
           -- any bound.
           + CASE WHEN EXISTS (SELECT FROM pg_statistic_ext x WHERE x.stxrelid = ",
            $rel,
            ")
                  THEN 1073741824 ELSE 0 END
           -- Columns' fast defaults, loaded whole as the relation is opened: only their stored
           -- size can be read, and a compressed one is counted as 256 times that.
           + coalesce((SELECT sum(pg_column_size(a.attmissingval)
                                  * CASE WHEN pg_column_compression(a.attmissingval) IS NULL
                                         THEN 1 ELSE 256 END)
                       FROM pg_attribute a
                       WHERE a.attrelid = ",
            $rel,
            " AND a.atthasmissing), 0)"
        )
    };
}

/// Whether the caller may SELECT the whole of relation `$rel`, in SQL, decided from the
/// relation's grants as stored (its row, read by index, not the catalog cache), as
/// `has_table_privilege` decides it: a grant to PUBLIC or to a role whose privileges the caller
/// has, or `pg_read_all_data` (which superusers have too).
macro_rules! may_read_table {
    ($rel:literal) => {
        concat!(
            "(pg_has_role('pg_read_all_data', 'USAGE') OR EXISTS (
                SELECT FROM pg_class rc
                CROSS JOIN LATERAL aclexplode(coalesce(rc.relacl, acldefault('r', rc.relowner))) rx
                WHERE rc.oid = ",
            $rel,
            " AND rx.privilege_type = 'SELECT'
                  AND (rx.grantee = 0 OR rx.grantee = ANY (",
            callers_roles!(),
            "))))"
        )
    };
}

/// Whether a column whose grants are `$acl` (its `attacl`) is granted SELECT to the caller,
/// in SQL, from the grants as stored.
macro_rules! may_read_column_grant {
    ($acl:literal) => {
        concat!(
            "EXISTS (SELECT FROM aclexplode(",
            $acl,
            ") cx WHERE cx.privilege_type = 'SELECT'
                AND (cx.grantee = 0 OR cx.grantee = ANY (",
            callers_roles!(),
            ")))"
        )
    };
}

/// Whether the caller may SELECT some column of relation `$rel`, in SQL: what
/// `has_any_column_privilege` says, without its cost. The privilege functions look up the
/// relation, and for a table the caller may not read whole every one of its columns, in the
/// catalog cache, which keeps each entry as long as the connection: another role's thousands
/// of tables of 1,600 columns, in a schema the caller reads, would fill it. Here the grants are
/// read from the rows themselves (`may_read_table`, `may_read_column_grant`).
macro_rules! may_read_some_column {
    ($rel:literal) => {
        concat!(
            "(",
            may_read_table!($rel),
            " OR EXISTS (
                SELECT FROM pg_attribute ca
                WHERE ca.attrelid = ",
            $rel,
            " AND ca.attnum > 0 AND NOT ca.attisdropped AND ca.attacl IS NOT NULL AND ",
            may_read_column_grant!("ca.attacl"),
            "))"
        )
    };
}

/// Whether the caller may read some column of relation `$1` (`may_read_some_column`).
pub(super) const MAY_READ_SOME_COLUMN_SQL: &str = concat!("SELECT ", may_read_some_column!("$1"));

/// What a read on the extension's own of relation `$1` loads, measured from the catalog as it is
/// now: the relations its planning locks besides it (its partitions at every level when it is
/// partitioned, `$2`, at most `$3` of them; and their and its indexes), sorted, how many locks
/// the read takes, the bytes of catalog
/// text opening and planning it loads (`catalog_text_of`), its owner, and whether the name the
/// read reads it by (`$4`, qualified) names it (`OwnReadLoads`).
const OWN_READ_LOADS_SQL: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
    concat!(
        r#"
WITH RECURSIVE tree(relid) AS (
    SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = $1 AND $2
    UNION ALL
    SELECT i.inhrelid FROM tree t JOIN pg_inherits i ON i.inhparent = t.relid),
walked AS MATERIALIZED (SELECT DISTINCT relid FROM (SELECT relid FROM tree LIMIT $3) w),
read AS MATERIALIZED (SELECT $1 AS relid UNION SELECT relid FROM walked)
SELECT json_build_object(
       'locked', (SELECT coalesce(array_agg(l.relid::bigint ORDER BY l.relid), '{}')
                  FROM (SELECT relid FROM walked
                        UNION SELECT i.indexrelid FROM read r
                              JOIN pg_index i ON i.indrelid = r.relid) l),
       'locks', (SELECT count(*) FROM read)
                + (SELECT count(*) FROM read r JOIN pg_index i ON i.indrelid = r.relid),
       'bytes', (SELECT sum("#,
        catalog_text_of!("r.relid"),
        r#") FROM read r)::bigint,
       'owner', (SELECT relowner::bigint FROM pg_class WHERE oid = $1),
       'named', to_regclass($4)::oid IS NOT DISTINCT FROM $1)::text
"#,
        "\0"
    )
    .as_bytes(),
) {
    Ok(sql) => sql,
    Err(_) => panic!("OWN_READ_LOADS_SQL is one C string"),
};

/// Relations in the schemas `$1` (in search order) that the caller can SELECT from (some
/// column of) and reach (`USAGE` on the schema: `sql_query_engine.schemas` is the caller's to
/// set, and a table granted in a schema the caller may not use is no table of its):
/// partitions are folded into their parent, the extension's own objects left out. A partitioned
/// table's partitions are read from pg_inherits, which takes no lock (`pg_partition_tree` would
/// lock every partition until the call ends, behind another session's ACCESS EXCLUSIVE lock):
/// how many locks a read of it on the extension's own takes (it, its partitions, their
/// indexes), whether a partition or inheritance child is a foreign table, and a fingerprint of
/// the partitions' storage, from a walk of `$4` steps at most.
/// At most `$2` relations, in search order, and no more of them than hold `$3` columns
/// together or take `$5` bytes of JSON: what another role may create in a schema the caller
/// reads is not all loaded into the caller's backend. The second column counts them all, to
/// say when some were left out.
const RELATIONS_SQL: &str = concat!(
    r#"
WITH RECURSIVE kept AS MATERIALIZED (
    -- The relations first, with only what costs nothing to read: what follows (comments,
    -- descendants) is read for the $2 kept, not for every one another role made.
    SELECT c.oid, c.relname, c.relkind, c.reltuples, c.relrowsecurity, c.relpersistence,
           c.relfilenode, c.relhassubclass, n.nspname, s.ord, c.relowner, c.relacl, n.nspacl,
           sum(c.relnatts) OVER (ORDER BY s.ord, c.relname ROWS UNBOUNDED PRECEDING) AS columns,
           count(*) OVER () AS readable
    FROM unnest($1::text[]) WITH ORDINALITY AS s(name, ord)
    JOIN pg_namespace n ON n.nspname = s.name
    JOIN pg_class c ON c.relnamespace = n.oid
    WHERE c.relkind IN ('r', 'v', 'm', 'f', 'p')
      AND NOT c.relispartition
      AND NOT EXISTS (
          SELECT FROM pg_depend dep JOIN pg_extension e ON e.oid = dep.refobjid
          WHERE dep.classid = 'pg_class'::regclass AND dep.objid = c.oid
            AND dep.refclassid = 'pg_extension'::regclass AND dep.deptype = 'e'
            AND e.extname = 'sql_query_engine')
      AND has_schema_privilege(n.oid, 'USAGE')
      AND "#,
    may_read_some_column!("c.oid"),
    r#"
    ORDER BY s.ord, c.relname
    LIMIT $2
),
-- Partitions and inheritance children at every level, by every path (a table may inherit
-- from several), for the kept relations together, and $4 steps in all: a recursive query
-- yields its rows as they are asked for, so neither a chain of thousands of inheriting tables
-- nor a lattice of them is walked further.
tree(root, relid) AS (
    SELECT k.oid, i.inhrelid FROM kept k JOIN pg_inherits i ON i.inhparent = k.oid
    WHERE k.relkind = 'p' OR k.relhassubclass
    UNION ALL
    SELECT t.root, i.inhrelid FROM tree t JOIN pg_inherits i ON i.inhparent = t.relid),
walked AS MATERIALIZED (SELECT root, relid FROM tree LIMIT $4),
-- A walk cut short leaves every relation with children unknown: counted as if one of them
-- were foreign (neither read on the extension's own nor its statistics read).
cut AS (SELECT count(*) >= $4 AS cut FROM walked),
parts AS (
    SELECT w.root,
           count(DISTINCT w.relid) AS descendants,
           bool_or(pc.relkind = 'f') AS foreign_parts
    FROM walked w JOIN pg_class pc ON pc.oid = w.relid
    GROUP BY w.root),
-- The indexes of each root's descendants (each descendant once, however many paths reach
-- it), in one join: a subquery per root would read the whole walk once per root.
part_indexes AS (
    SELECT d.root, count(*) AS indexes
    FROM (SELECT DISTINCT root, relid FROM walked) d JOIN pg_index i ON i.indrelid = d.relid
    GROUP BY d.root),
-- What opening and planning a read of each relation loads from the catalog into the
-- connection's caches (`catalog_text_of`): the relation's and, for a root, its descendants'.
cached AS (
    SELECT r.relid, "#,
    catalog_text_of!("r.relid"),
    r#" AS bytes
    FROM (SELECT oid AS relid FROM kept UNION SELECT relid FROM walked) r),
-- Each kept relation's count: its own, and a partitioned one's descendants' (each once).
loaded AS (
    SELECT p.root, sum(cd.bytes) AS bytes
    FROM (SELECT oid AS root, oid AS relid FROM kept
          UNION SELECT w.root, w.relid FROM walked w JOIN kept k ON k.oid = w.root
                WHERE k.relkind = 'p') p
    JOIN cached cd ON cd.relid = p.relid
    GROUP BY p.root)
SELECT coalesce(json_agg(r.relation ORDER BY r.ord, r.relname)
                FILTER (WHERE r.columns <= $3 AND r.bytes <= $5), '[]')::text,
       coalesce(max(r.readable), 0)::bigint
FROM (
SELECT r.*, sum(octet_length(r.relation::text))
                OVER (ORDER BY r.ord, r.relname ROWS UNBOUNDED PRECEDING) AS bytes
FROM (
SELECT json_build_object(
    'raw_schema', b.nspname,
    'raw_name', b.relname,
    'relation', json_build_object(
        'oid', b.oid::bigint,
        'schema', quote_ident(b.nspname),
        'name', quote_ident(b.relname),
        'kind', CASE b.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view'
                     WHEN 'm' THEN 'materialized view' WHEN 'f' THEN 'foreign table'
                     ELSE 'partitioned table' END,
        'comment', substr(d.description, 1, 1000),
        -- PostgreSQL 18's pg_restore_relation_stats takes NaN and infinities.
        'rows', CASE WHEN b.reltuples BETWEEN -1 AND 1e30 THEN b.reltuples ELSE -1 END,
        'shareable', b.relkind IN ('r', 'm') AND NOT b.relrowsecurity
                     AND b.relpersistence = 'p',
        'filenode', b.relfilenode::bigint,
        -- Who may read it, as of this read: its owner and the grants on it, its columns and
        -- its schema (a shared read made before a GRANT is not one to take after it).
        'grants', CASE WHEN b.relkind IN ('r', 'm') AND NOT b.relrowsecurity
                            AND b.relpersistence = 'p'
                       -- (SHA-256: md5 fails on a server in FIPS mode; of the text's UTF-8,
                       -- the server's own encoding: textsend would convert it to the client's)
                       THEN encode(sha256(convert_to(concat_ws('/', b.relowner, b.relacl,
                                b.nspacl,
                                (SELECT string_agg(a.attnum || '=' || a.attacl::text, ','
                                                   ORDER BY a.attnum)
                                 FROM pg_attribute a
                                 WHERE a.attrelid = b.oid AND a.attacl IS NOT NULL)),
                                'UTF8')), 'hex')
                  END,
        'locks', 1 + (SELECT count(*) FROM pg_index i WHERE i.indrelid = b.oid)
                 + CASE WHEN b.relkind = 'p'
                        THEN coalesce(parts.descendants, 0) + coalesce(pi.indexes, 0)
                        ELSE 0 END,
        'foreign_parts', coalesce(parts.foreign_parts, false)
                         OR (cut.cut AND (b.relkind = 'p' OR b.relhassubclass)),
        'catalog_bytes', coalesce(loaded.bytes, 0)::bigint,
        'owner', b.relowner::bigint,
        'inherited', b.relkind = 'r' AND b.relhassubclass)
    ) AS relation,
    b.ord, b.relname, b.columns, b.readable
FROM kept b
CROSS JOIN cut
LEFT JOIN pg_description d
    ON d.objoid = b.oid AND d.classoid = 'pg_class'::regclass AND d.objsubid = 0
LEFT JOIN parts ON parts.root = b.oid
LEFT JOIN part_indexes pi ON pi.root = b.oid
LEFT JOIN loaded ON loaded.root = b.oid
) r
) r
"#
);

/// The columns of the relations `$1` that the caller can SELECT, in order, with their types
/// and what is said of them: informative defaults (not a sequence's nextval, none longer than a
/// line), comments cut to 500 characters and at most 100 labels of an enum (`labels_cut` when
/// it has more), these three only while their bytes, counted in the order of the relations in
/// `$1` (search order) and of their columns, stay within `$2` (what another role writes into
/// the catalog is not all loaded into the caller's backend; `cut` marks a column past it), and
/// no more columns than take `$3` bytes of JSON in all (the second column counts them all). A default is deparsed without its relation (`pg_get_expr(adbin, 0)`: a default
/// names no column; with it, the deparse would lock the relation and wait behind another
/// session's lock), and only a stored tree of bounded size whose constants are of the types
/// `$4` (or enums).
const COLUMNS_SQL: &str = concat!(
    r#"
SELECT coalesce(json_agg(e.element ORDER BY e.ord, e.attnum) FILTER (WHERE e.bytes <= $3),
                '[]')::text,
       count(*)
FROM (
SELECT e.*, sum(octet_length(e.element::text))
                OVER (ORDER BY e.ord, e.attnum ROWS UNBOUNDED PRECEDING) AS bytes
FROM (
SELECT c.ord, c.attnum, json_build_object(
    'relation', c.attrelid::bigint,
    'raw_name', c.attname,
    'cut', c.said > $2,
    'column', json_build_object(
        'name', quote_ident(c.attname),
        'attnum', c.attnum,
        'type_oid', c.atttypid::bigint,
        'typmod', c.atttypmod,
        'not_null', c.not_null,
        'default', CASE WHEN c.said <= $2 THEN c.dflt END,
        'comment', CASE WHEN c.said <= $2 THEN c.comment END,
        'labels', CASE WHEN c.said <= $2 THEN coalesce(to_json(c.labels[1:100]), '[]') ELSE '[]' END,
        'labels_cut', c.labels IS NOT NULL AND (c.said > $2 OR cardinality(c.labels) > 100),
        'textual', c.textual)
) AS element
FROM (
    SELECT s.*, sum(coalesce(octet_length(to_json(s.dflt)::text), 0)
                    + coalesce(octet_length(to_json(s.comment)::text), 0)
                    + coalesce(octet_length(to_json(s.labels[1:100])::text), 0))
                OVER (ORDER BY s.ord, s.attnum ROWS UNBOUNDED PRECEDING) AS said
    FROM (
        SELECT r.ord, a.attrelid, a.attname, a.attnum, a.atttypid, a.atttypmod,
               a.attnotnull AND unvalidated.attnum IS NULL AS not_null,
               -- Only a default whose constants are of types whose text is bounded by their
               -- stored size (listed, and enums): a numeric is stored in a few bytes and
               -- written in up to 131,072 characters (1e131071), also inside an array, a jsonb,
               -- a range, for every such column of every relation another role made.
               -- And at most $5 of them.
               CASE WHEN a.attgenerated = '' AND octet_length(ad.adbin::text) <= 10000
                         AND (SELECT count(*) <= $5
                                     AND count(*) FILTER (
                                         WHERE m[1]::oid <> ALL ($4::oid[])
                                           AND NOT EXISTS (SELECT FROM pg_type et
                                                           WHERE et.oid = m[1]::oid
                                                             AND et.typtype = 'e')) = 0
                              FROM regexp_matches(ad.adbin::text, ':consttype ([0-9]+) ', 'g') m)
                    THEN
                   (SELECT CASE WHEN x NOT LIKE 'nextval(%' AND length(x) <= 200 THEN x END
                    FROM pg_get_expr(ad.adbin, 0) x) END AS dflt,
               substr(cd.description, 1, 500) AS comment,
               CASE WHEN t.typtype = 'e' THEN ARRAY(
                   SELECT e.enumlabel::text FROM pg_enum e WHERE e.enumtypid = t.oid
                   ORDER BY e.enumsortorder LIMIT 101) END AS labels,
               -- A virtual generated column (PostgreSQL 18) runs its owner's expression
               -- as it is read: never read on the extension's own.
               t.typcategory = 'S' AND a.attgenerated <> 'v' AS textual
        FROM unnest($1::oid[]) WITH ORDINALITY AS r(oid, ord)
        -- Whether the caller may read the whole relation, once for each (from its grants as
        -- stored: the privilege functions would look each column up in the catalog cache).
        CROSS JOIN LATERAL (SELECT "#,
    may_read_table!("r.oid"),
    r#" AS whole) rt
        JOIN pg_attribute a ON a.attrelid = r.oid
        JOIN pg_type t ON t.oid = a.atttypid
        LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
        LEFT JOIN pg_description cd
            ON cd.objoid = a.attrelid AND cd.classoid = 'pg_class'::regclass
           AND cd.objsubid = a.attnum
        -- NOT NULL constraints not validated yet (PostgreSQL 18 catalogues them), read once
        -- for all the relations: a subquery per column would read all of its table's
        -- constraints for each of its columns.
        LEFT JOIN (
            SELECT DISTINCT nn.conrelid, k.attnum
            FROM pg_constraint nn CROSS JOIN LATERAL unnest(nn.conkey) AS k(attnum)
            WHERE nn.conrelid = ANY ($1::oid[]) AND nn.contype = 'n' AND NOT nn.convalidated
        ) unvalidated ON unvalidated.conrelid = a.attrelid AND unvalidated.attnum = a.attnum
        WHERE a.attnum > 0 AND NOT a.attisdropped
          AND (rt.whole OR "#,
    may_read_column_grant!("a.attacl"),
    r#")
    ) s
) c
) e
) e
"#
);

/// The planner's most common values and histogram bounds of the text columns `$3` of the
/// tables `$2` in the schemas `$1` (parallel arrays). pg_stats hides what the caller may not
/// see (column privileges, row security). Only columns of built-in text types are asked for, so
/// that turning the statistics into text runs only built-in output functions. At most `$5`
/// values of each kind per column (the most common first; histogram bounds spread over the
/// whole histogram), each cut to `$4` characters, and at most `$6` values in all, in the order
/// of the columns asked; an array of more than `$7` values, or stored in more than `$8` bytes,
/// is not read, nor are those past `$9` stored bytes in all, nor those past `$10` bytes of
/// JSON (the second column counts them all).
const STATISTICS_SQL: &str = r#"
SELECT coalesce(json_agg(e.element ORDER BY e.ord) FILTER (WHERE e.bytes <= $10), '[]')::text,
       count(*)
FROM (
SELECT e.*, sum(octet_length(e.element::text))
                OVER (ORDER BY e.ord ROWS UNBOUNDED PRECEDING) AS bytes
FROM (
SELECT k.ord, json_build_object(
    'schema', k.schemaname,
    'table', k.tablename,
    'column', k.attname,
    'common_values', to_json(k.common_values),
    'histogram', to_json(k.histogram),
    'all_values', k.all_values
) AS element
FROM (
    SELECT s.ord, s.schemaname, s.tablename, s.attname, v.common_values, v.histogram,
           CASE WHEN pg_column_size(s.most_common_freqs) <= $8 AND raw.mcv IS NOT NULL
                THEN coalesce((SELECT sum(f) FROM unnest(s.most_common_freqs) f)
                                  >= 0.999 - s.null_frac, false)
                     AND cardinality(v.common_values) = cardinality(raw.mcv)
                ELSE false END AS all_values,
           sum(cardinality(v.common_values) + cardinality(v.histogram))
               OVER (ORDER BY s.ord ROWS UNBOUNDED PRECEDING) AS running
    FROM (
        -- What the arrays take as stored comes first (their sizes cost nothing to read):
        -- those past $9 bytes in all are neither counted nor turned into text.
        SELECT t.ord, st.schemaname, st.tablename, st.attname, st.null_frac,
               st.most_common_vals, st.most_common_freqs, st.histogram_bounds,
               sum(coalesce(pg_column_size(st.most_common_vals), 0)
                   + coalesce(pg_column_size(st.histogram_bounds), 0))
                   OVER (ORDER BY t.ord ROWS UNBOUNDED PRECEDING) AS stored
        FROM unnest($1::text[], $2::text[], $3::text[])
             WITH ORDINALITY AS t(schemaname, tablename, attname, ord)
        -- Column by column, the names compared as names (leakproof, so the security-barrier
        -- view takes them as index conditions): joined whole, pg_stats checked the caller's
        -- privilege on every column in the database that has statistics (another role's
        -- temporary tables too), each a catalog cache entry kept as long as the connection.
        CROSS JOIN LATERAL (
            SELECT s.* FROM pg_stats s
            WHERE s.schemaname = t.schemaname::name AND s.tablename = t.tablename::name
              AND s.attname = t.attname::name
            OFFSET 0) st
        WHERE st.most_common_vals IS NOT NULL OR st.histogram_bounds IS NOT NULL
    ) s
    -- Arrays of more than $7 values (a statistics target far above the default), or stored
    -- in more than $8 bytes, are not turned into text at all (the size is read first: it
    -- costs nothing, while counting the values reads the whole array).
    CROSS JOIN LATERAL (SELECT
        CASE WHEN pg_column_size(s.most_common_vals) > $8 THEN NULL
             WHEN cardinality(s.most_common_vals) <= $7
             THEN s.most_common_vals::text::text[] END AS mcv,
        CASE WHEN pg_column_size(s.histogram_bounds) > $8 THEN NULL
             WHEN cardinality(s.histogram_bounds) <= $7
             THEN s.histogram_bounds::text::text[] END AS hist) raw
    CROSS JOIN LATERAL (SELECT
        ARRAY(SELECT substr(m.v, 1, $4) FROM unnest(raw.mcv) WITH ORDINALITY AS m(v, i)
              ORDER BY m.i LIMIT $5) AS common_values,
        ARRAY(SELECT substr(h.v, 1, $4) FROM unnest(raw.hist) WITH ORDINALITY AS h(v, i)
              WHERE (h.i - 1) % greatest(1, ceil(cardinality(raw.hist) / $5::numeric))::int = 0
              ORDER BY h.i LIMIT $5) AS histogram) v
    WHERE s.stored <= $9
) k
WHERE k.running <= $6
) e
) e
"#;

/// Primary keys, unique keys and foreign keys of the relations `$1` over columns the caller may
/// read, and whether the caller may read a foreign key's referenced table (only then is the key
/// shown): at most `$2` of a
/// relation (its primary key first, then its unique keys), however many its owner made, and
/// `$3` in all (each relation's first ones first, in the order of `$1`), within `$4` bytes of
/// JSON; the second column counts them all, to say when some were left out.
const KEYS_SQL: &str = concat!(
    r#"
SELECT coalesce(json_agg(e.element ORDER BY e.conrelid, e.conname) FILTER (WHERE e.bytes <= $4),
                '[]')::text,
       (SELECT count(*) FROM pg_constraint
        WHERE conrelid = ANY($1::oid[]) AND contype IN ('p', 'u', 'f'))
FROM (
SELECT e.*, sum(octet_length(e.element::text))
                OVER (ORDER BY e.nth, e.ord ROWS UNBOUNDED PRECEDING) AS bytes
FROM (
SELECT co.conrelid, co.conname, co.nth, co.ord, json_build_object(
    'relation', co.conrelid::bigint,
    'kind', co.contype,
    'columns', (SELECT json_agg(quote_ident(a.attname) ORDER BY k.ord)
                FROM unnest(co.conkey) WITH ORDINALITY AS k(attnum, ord)
                JOIN pg_attribute a ON a.attrelid = co.conrelid AND a.attnum = k.attnum),
    'ref_oid', co.confrelid::bigint,
    'ref_schema', quote_ident(fn.nspname),
    'ref_name', quote_ident(fc.relname),
    'ref_columns', (SELECT json_agg(quote_ident(a.attname) ORDER BY k.ord)
                    FROM unnest(co.confkey) WITH ORDINALITY AS k(attnum, ord)
                    JOIN pg_attribute a ON a.attrelid = co.confrelid AND a.attnum = k.attnum),
    'ref_readable', co.contype = 'f' AND has_schema_privilege(fn.oid, 'USAGE')
                    AND "#,
    may_read_some_column!("co.confrelid"),
    r#",
    'deferrable', co.condeferrable
) AS element
FROM (
    SELECT * FROM (
        SELECT co.*, r.ord, row_number() OVER (
                   PARTITION BY co.conrelid
                   ORDER BY co.contype = 'p' DESC, co.contype = 'u' DESC, co.conname) AS nth
        FROM unnest($1::oid[]) WITH ORDINALITY AS r(oid, ord)
        JOIN pg_constraint co ON co.conrelid = r.oid
        WHERE co.contype IN ('p', 'u', 'f')
          -- A key naming a column the caller may not read (here or in the referenced table)
          -- is not the caller's to see, as the column is not.
          AND NOT EXISTS (SELECT FROM unnest(co.conkey) k
                          JOIN pg_attribute ka ON ka.attrelid = co.conrelid AND ka.attnum = k
                          WHERE NOT ("#,
    may_read_table!("co.conrelid"),
    r#"
                                     OR "#,
    may_read_column_grant!("ka.attacl"),
    r#"))
          AND NOT EXISTS (SELECT FROM unnest(co.confkey) k
                          JOIN pg_attribute ka ON ka.attrelid = co.confrelid AND ka.attnum = k
                          WHERE NOT ("#,
    may_read_table!("co.confrelid"),
    r#"
                                     OR "#,
    may_read_column_grant!("ka.attacl"),
    r#"))
    ) numbered
    WHERE nth <= $2
    ORDER BY nth, ord
    LIMIT $3
) co
LEFT JOIN pg_class fc ON fc.oid = co.confrelid
LEFT JOIN pg_namespace fn ON fn.oid = fc.relnamespace
) e
) e
"#
);

/// A relation as `RELATIONS_SQL` returns it, with the unquoted names pg_stats uses.
#[derive(Deserialize)]
struct RelationRow {
    relation: Relation,
    raw_schema: String,
    raw_name: String,
}

#[derive(Deserialize)]
struct ColumnRow {
    relation: u32,
    raw_name: String,
    /// Past the bytes of annotations read: its default, comment and labels are not shown.
    #[serde(default)]
    cut: bool,
    column: Column,
}

#[derive(Deserialize)]
struct StatisticsRow {
    schema: String,
    table: String,
    column: String,
    common_values: Vec<String>,
    histogram: Vec<String>,
    all_values: bool,
}

#[derive(Deserialize)]
struct KeyRow {
    relation: u32,
    /// `p`, `u` or `f`, as in pg_constraint.
    kind: String,
    columns: Option<Vec<String>>,
    ref_oid: u32,
    ref_schema: Option<String>,
    ref_name: Option<String>,
    ref_columns: Option<Vec<String>>,
    ref_readable: Option<bool>,
    #[serde(default)]
    deferrable: bool,
}

/// Reads every relation the caller may see in `schemas`. Read-only: runs on a hot standby too.
/// A few small queries rather than one large one: each plans in a fraction of a millisecond,
/// where one query joining them all took longer to plan than these take to run.
pub fn load(schemas: &[String], common_values: bool) -> Result<Vec<Relation>> {
    let rows = crate::subxact::pinned(|| {
        // Each query in a connection of its own, which frees its result when it ends: the
        // results are not all held at once.
        let json_and_count = |sql: &str, args: &[pgrx::datum::DatumWithOid]| {
            Spi::connect(|client| {
                client
                    .select(sql, Some(1), args)?
                    .first()
                    .get_two::<String, i64>()
                    .map(|(json, count)| (json.unwrap_or_default(), count.unwrap_or(0)))
            })
        };
        (|| {
            // Each result is parsed in a block of its own, so that its text is freed before
            // the next query runs.
            let (found, readable) = {
                let (relations, readable) = json_and_count(
                RELATIONS_SQL,
                &[
                    schemas.to_vec().into(),
                    MAX_RELATIONS.into(),
                    MAX_COLUMNS.into(),
                    MAX_INHERITANCE_STEPS.into(),
                    MAX_QUERY_BYTES.into(),
                ],
            )?;
                (parse::<Vec<RelationRow>>(&relations)?, readable)
            };
            let readable = usize::try_from(readable).unwrap_or(0);
            if found.len() < readable {
                crate::error::notice(format!(
                    "sql_query_engine: the schema context holds {} of the {readable} relations you may read (at most {MAX_RELATIONS} relations, {MAX_COLUMNS} columns and {} MB of names and comments, in search order)",
                    found.len(),
                    MAX_QUERY_BYTES >> 20
                ));
            }
            if found.is_empty() {
                return Ok((found, Vec::new(), Vec::new(), Vec::new()));
            }
            let oids: Vec<pg_sys::Oid> = found
                .iter()
                .map(|r| pg_sys::Oid::from(r.relation.oid))
                .collect();
            let (mut columns, all) = {
                let (columns, all) = json_and_count(
                COLUMNS_SQL,
                &[
                    oids.clone().into(),
                    MAX_ANNOTATION_BYTES.into(),
                    MAX_COLUMN_BYTES.into(),
                    BOUNDED_TEXT_TYPES
                        .iter()
                        .map(|&oid| pg_sys::Oid::from(oid))
                        .collect::<Vec<_>>()
                        .into(),
                    MAX_DEFAULT_CONSTANTS.into(),
                ],
            )?;
                (parse::<Vec<ColumnRow>>(&columns)?, all)
            };
            let left_out = usize::try_from(all).unwrap_or(0).saturating_sub(columns.len());
            if left_out > 0 {
                crate::error::notice(format!(
                    "sql_query_engine: the schema context leaves out {left_out} columns of its relations (at most {} MB of them are read, in search order)",
                    MAX_COLUMN_BYTES >> 20
                ));
            }
            let cut = columns.iter().filter(|c| c.cut).count();
            if cut > 0 {
                crate::error::notice(format!(
                    "sql_query_engine: the schema context leaves out the defaults, comments and labels of {cut} columns (at most {} MB of them are read, in search order)",
                    MAX_ANNOTATION_BYTES >> 20
                ));
            }
            for row in &mut columns {
                // Text the extension may read on its own: built-in types, and domains over
                // them (a domain's CHECK does not run on a read).
                row.column.textual &= crate::guard::base_type(pg_sys::Oid::from(row.column.type_oid))
                    .is_some_and(|base| base.to_u32() < pg_sys::FirstNormalObjectId);
            }
            let statistics: Vec<StatisticsRow> = if common_values {
                let by_oid: HashMap<u32, &RelationRow> =
                    found.iter().map(|r| (r.relation.oid, r)).collect();
                let (mut in_schemas, mut in_tables, mut names) =
                    (Vec::new(), Vec::new(), Vec::new());
                // A foreign table's statistics are of rows another server gave whoever ran
                // ANALYZE, with that role's user mapping: not the caller's to see.
                let local = |r: &&&RelationRow| {
                    r.relation.kind != "foreign table" && !r.relation.foreign_parts
                };
                for row in columns.iter().filter(|c| c.column.textual) {
                    if let Some(relation) = by_oid.get(&row.relation).filter(local) {
                        in_schemas.push(relation.raw_schema.clone());
                        in_tables.push(relation.raw_name.clone());
                        names.push(row.raw_name.clone());
                    }
                }
                if names.is_empty() {
                    Vec::new()
                } else {
                    parse(&json_and_count(
                        STATISTICS_SQL,
                        &[
                            in_schemas.into(),
                            in_tables.into(),
                            names.into(),
                            MAX_STATISTIC_CHARS.into(),
                            MAX_STATISTICS_PER_COLUMN.into(),
                            MAX_STATISTICS.into(),
                            MAX_STATISTIC_ARRAY_VALUES.into(),
                            MAX_STATISTIC_ARRAY_BYTES.into(),
                            MAX_STATISTICS_STORED_BYTES.into(),
                            MAX_QUERY_BYTES.into(),
                        ],
                    )?
                    .0)?
                }
            } else {
                Vec::new()
            };
            let (keys, all) = {
                let (keys, all) = json_and_count(
                KEYS_SQL,
                &[
                    oids.into(),
                    MAX_KEYS_PER_RELATION.into(),
                    MAX_KEYS.into(),
                    MAX_QUERY_BYTES.into(),
                ],
            )?;
                (parse::<Vec<KeyRow>>(&keys)?, all)
            };
            let all = usize::try_from(all).unwrap_or(0);
            if keys.len() < all {
                crate::error::notice(format!(
                    "sql_query_engine: the schema context holds {} of the {all} keys of its relations (at most {MAX_KEYS_PER_RELATION} per relation, {MAX_KEYS} and {} MB in all)",
                    keys.len(),
                    MAX_QUERY_BYTES >> 20
                ));
            }
            Ok::<_, LoadError>((found, columns, statistics, keys))
        })()
    })
    .map_err(|e| Error::internal(format!("reading the schema failed: {e}")))?;
    let mut relations = assemble(rows.0, rows.1, rows.2, rows.3);
    // A name in two schemas is written qualified both times, so that the model cannot take
    // one for the other.
    let mut seen: HashMap<String, usize> = HashMap::new();
    for relation in &relations {
        *seen.entry(relation.name.clone()).or_default() += 1;
    }
    let unique = |name: &str| seen.get(name).copied().unwrap_or(0) <= 1;
    // Visibility on the caller's search path, as the server decides it (not visible: a
    // relation dropped since the catalog was read, which no lock holds).
    let on_path = |oid: u32| {
        // SAFETY: the SQL function, which answers NULL for a relation that is gone.
        unsafe {
            pgrx::direct_function_call::<bool>(
                pg_sys::pg_table_is_visible,
                &[Some(pg_sys::Datum::from(pg_sys::Oid::from(oid)))],
            )
        }
        .unwrap_or(false)
    };
    let visible = |oid: u32, name: &str| unique(name) && on_path(oid);
    for relation in &mut relations {
        relation.visible = visible(relation.oid, &relation.name);
        for column in &mut relation.columns {
            column.type_name = type_name(column.type_oid, column.typmod);
        }
        // A type's name is another role's choice too (a domain renamed with a line break in
        // it): a column of a type that cannot be shown on one line is left out, as one of such
        // a name is, and one of a type dropped since the catalog was read.
        relation
            .columns
            .retain(|c| !c.type_name.is_empty() && printable(&c.type_name));
        for fk in &mut relation.foreign_keys {
            fk.references = if visible(fk.ref_oid, &fk.ref_name) {
                fk.ref_name.clone()
            } else {
                format!("{}.{}", fk.ref_schema, fk.ref_name)
            };
        }
    }
    Ok(relations)
}

/// Why a catalog read failed: the SPI call or the shape of what it returned.
#[derive(Debug)]
enum LoadError {
    Spi(pgrx::spi::SpiError),
    Shape(serde_json::Error),
}

impl From<pgrx::spi::SpiError> for LoadError {
    fn from(e: pgrx::spi::SpiError) -> Self {
        LoadError::Spi(e)
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Spi(e) => write!(f, "{e}"),
            LoadError::Shape(e) => write!(f, "unexpected schema shape: {e}"),
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(json: &str) -> std::result::Result<T, LoadError> {
    serde_json::from_str(if json.is_empty() { "[]" } else { json }).map_err(LoadError::Shape)
}

/// The relations with their columns, statistics and keys put in place; relations, columns
/// and keys with a name that is not `printable` are left out.
fn assemble(
    found: Vec<RelationRow>,
    columns: Vec<ColumnRow>,
    statistics: Vec<StatisticsRow>,
    keys: Vec<KeyRow>,
) -> Vec<Relation> {
    let found: Vec<RelationRow> = found
        .into_iter()
        .filter(|r| printable(&r.raw_schema) && printable(&r.raw_name))
        .collect();
    let by_oid: HashMap<u32, usize> = found
        .iter()
        .enumerate()
        .map(|(i, r)| (r.relation.oid, i))
        .collect();
    let by_name: HashMap<(String, String), usize> = found
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.raw_schema.clone(), r.raw_name.clone()), i))
        .collect();
    let mut relations: Vec<Relation> = found.into_iter().map(|r| r.relation).collect();
    let mut column_at: HashMap<(usize, String), usize> = HashMap::new();
    for row in columns.into_iter().filter(|c| printable(&c.raw_name)) {
        if let Some(&i) = by_oid.get(&row.relation) {
            column_at.insert((i, row.raw_name), relations[i].columns.len());
            relations[i].columns.push(row.column);
        }
    }
    for stats in statistics {
        let Some(&i) = by_name.get(&(stats.schema, stats.table)) else {
            continue;
        };
        if let Some(&c) = column_at.get(&(i, stats.column)) {
            let column = &mut relations[i].columns[c];
            if column.textual {
                column.histogram = stats.histogram;
            }
            column.common_values = stats.common_values;
            column.all_values = stats.all_values;
        }
    }
    for key in keys {
        let Some(&i) = by_oid.get(&key.relation) else {
            continue;
        };
        let printable_names = [&key.columns, &key.ref_columns]
            .into_iter()
            .flatten()
            .flatten()
            .chain(key.ref_schema.iter())
            .chain(key.ref_name.iter())
            .all(|n| printable(n));
        if !printable_names {
            continue;
        }
        let columns = key.columns.unwrap_or_default();
        let relation = &mut relations[i];
        if key.deferrable && key.kind != "f" {
            relation.deferrable.push(columns.clone());
        }
        match key.kind.as_str() {
            "p" => relation.primary_key = columns,
            "u" => relation.unique.push(columns),
            _ if key.ref_readable == Some(true) => relation.foreign_keys.push(ForeignKey {
                columns,
                references: String::new(),
                ref_schema: key.ref_schema.unwrap_or_default(),
                ref_name: key.ref_name.unwrap_or_default(),
                ref_oid: key.ref_oid,
                ref_columns: key.ref_columns.unwrap_or_default(),
            }),
            _ => {}
        }
    }
    relations
}

/// A type as `format_type` writes it on the caller's search path (qualified only when needed);
/// empty for one that is gone. The catalog's reads take no lock on what they read: another
/// role may drop a type or a relation meanwhile, and PostgreSQL's look-ups of one that is gone
/// raise XX000 ("cache lookup failed"), which would fail the caller's question.
fn type_name(oid: u32, typmod: i32) -> String {
    // SAFETY: formats a type the catalog query returned (NULL when it is gone); the text is
    // palloc'd.
    unsafe {
        crate::names::c_string(pg_sys::format_type_extended(
            pg_sys::Oid::from(oid),
            typmod,
            (pg_sys::FORMAT_TYPE_TYPEMOD_GIVEN | pg_sys::FORMAT_TYPE_INVALID_AS_NULL) as u16,
        ))
    }
}
