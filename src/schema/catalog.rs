//! Reading the schema the caller may see, in one catalog query (in the style of pg_graphql's
//! `load_sql_context.sql`): relations on the search path that the caller can SELECT from, with
//! the columns it can SELECT, keys, foreign keys and comments. Names come back quoted by
//! PostgreSQL's own `quote_ident`, ready to be written into SQL.

use pgrx::prelude::*;
use pgrx::JsonB;
use serde::Deserialize;

use crate::error::{Error, Result};

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Relation {
    /// Quoted schema name.
    pub schema: String,
    /// Quoted relation name.
    pub name: String,
    /// `table`, `view`, `materialized view`, `foreign table` or `partitioned table`.
    pub kind: String,
    /// Whether the unqualified name resolves to this relation on the search path.
    pub visible: bool,
    pub comment: Option<String>,
    /// Planner estimate; negative when the relation was never analyzed.
    pub rows: f64,
    pub columns: Vec<Column>,
    #[serde(default)]
    pub primary_key: Vec<String>,
    #[serde(default)]
    pub foreign_keys: Vec<ForeignKey>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Column {
    /// Quoted column name.
    pub name: String,
    #[serde(rename = "type")]
    pub type_name: String,
    pub not_null: bool,
    pub comment: Option<String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ForeignKey {
    pub columns: Vec<String>,
    /// The referenced relation as it should be written (qualified when not visible).
    pub references: String,
    pub ref_columns: Vec<String>,
}

impl Relation {
    /// How the relation is written in SQL from the caller's search path.
    pub fn sql_name(&self) -> String {
        if self.visible {
            self.name.clone()
        } else {
            format!("{}.{}", self.schema, self.name)
        }
    }
}

/// The catalog query. Partitions are folded into their parent; the extension's own objects
/// are left out; a foreign key is shown only when the caller may read the referenced table.
const CATALOG_SQL: &str = r#"
WITH search AS (
    SELECT n.oid AS nsp, s.ord
    FROM unnest(current_schemas(false)) WITH ORDINALITY AS s(name, ord)
    JOIN pg_namespace n ON n.nspname = s.name
),
own AS (
    SELECT d.objid
    FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
    WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_extension'::regclass
      AND d.deptype = 'e' AND e.extname = 'sql_query_engine'
),
rels AS (
    SELECT c.oid, c.relname, c.relkind, c.reltuples, n.nspname, s.ord
    FROM pg_class c
    JOIN search s ON s.nsp = c.relnamespace
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'v', 'm', 'f', 'p')
      AND NOT c.relispartition
      AND c.oid NOT IN (SELECT objid FROM own)
      AND has_any_column_privilege(c.oid, 'SELECT')
)
SELECT coalesce(jsonb_agg(jsonb_build_object(
    'schema', quote_ident(r.nspname),
    'name', quote_ident(r.relname),
    'kind', CASE r.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view'
                 WHEN 'm' THEN 'materialized view' WHEN 'f' THEN 'foreign table'
                 ELSE 'partitioned table' END,
    'visible', pg_table_is_visible(r.oid),
    'comment', obj_description(r.oid, 'pg_class'),
    'rows', r.reltuples,
    'columns', coalesce((
        SELECT jsonb_agg(jsonb_build_object(
                   'name', quote_ident(a.attname),
                   'type', format_type(a.atttypid, a.atttypmod),
                   'not_null', a.attnotnull,
                   'comment', col_description(r.oid, a.attnum)) ORDER BY a.attnum)
        FROM pg_attribute a
        WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
          AND has_column_privilege(r.oid, a.attnum, 'SELECT')), '[]'::jsonb),
    'primary_key', coalesce((
        SELECT jsonb_agg(quote_ident(a.attname) ORDER BY k.ord)
        FROM pg_constraint co
        CROSS JOIN LATERAL unnest(co.conkey) WITH ORDINALITY AS k(attnum, ord)
        JOIN pg_attribute a ON a.attrelid = co.conrelid AND a.attnum = k.attnum
        WHERE co.conrelid = r.oid AND co.contype = 'p'), '[]'::jsonb),
    'foreign_keys', coalesce((
        SELECT jsonb_agg(jsonb_build_object(
                   'columns', (SELECT jsonb_agg(quote_ident(a.attname) ORDER BY k.ord)
                               FROM unnest(co.conkey) WITH ORDINALITY AS k(attnum, ord)
                               JOIN pg_attribute a ON a.attrelid = co.conrelid AND a.attnum = k.attnum),
                   'references', CASE WHEN pg_table_is_visible(co.confrelid)
                                      THEN quote_ident(fc.relname)
                                      ELSE quote_ident(fn.nspname) || '.' || quote_ident(fc.relname) END,
                   'ref_columns', (SELECT jsonb_agg(quote_ident(a.attname) ORDER BY k.ord)
                                   FROM unnest(co.confkey) WITH ORDINALITY AS k(attnum, ord)
                                   JOIN pg_attribute a ON a.attrelid = co.confrelid AND a.attnum = k.attnum))
               ORDER BY co.conname)
        FROM pg_constraint co
        JOIN pg_class fc ON fc.oid = co.confrelid
        JOIN pg_namespace fn ON fn.oid = fc.relnamespace
        WHERE co.conrelid = r.oid AND co.contype = 'f'
          AND has_any_column_privilege(co.confrelid, 'SELECT')), '[]'::jsonb)
) ORDER BY r.ord, r.relname), '[]'::jsonb)
FROM rels r
"#;

/// Reads every relation the caller may see. Read-only: runs on a hot standby too.
pub fn load() -> Result<Vec<Relation>> {
    let json: Option<JsonB> = Spi::connect(|client| {
        client
            .select(CATALOG_SQL, Some(1), &[])?
            .first()
            .get_one::<JsonB>()
    })
    .map_err(|e| Error::internal(format!("reading the schema failed: {e}")))?;
    let value = json.map(|j| j.0).unwrap_or_else(|| serde_json::json!([]));
    serde_json::from_value(value)
        .map_err(|e| Error::internal(format!("unexpected schema shape: {e}")))
}
