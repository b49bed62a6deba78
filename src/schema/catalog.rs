//! Reading the schema the caller may see, in one catalog query (in the style of pg_graphql's
//! `load_sql_context.sql`): relations in the schemas searched that the caller can SELECT from,
//! with the columns it can SELECT, their types, nullability, informative defaults, enum labels,
//! keys, foreign keys, comments, row estimates and, when sample values are on, the planner's
//! most common values. Names come back quoted by PostgreSQL's own `quote_ident`.

use pgrx::prelude::*;
use pgrx::JsonB;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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
    pub visible: bool,
    pub comment: Option<String>,
    /// Planner estimate; negative when the relation was never analyzed.
    pub rows: f64,
    pub columns: Vec<Column>,
    #[serde(default)]
    pub primary_key: Vec<String>,
    #[serde(default)]
    pub unique: Vec<Vec<String>>,
    #[serde(default)]
    pub foreign_keys: Vec<ForeignKey>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Default)]
pub struct Column {
    /// Quoted column name.
    pub name: String,
    #[serde(rename = "type")]
    pub type_name: String,
    pub not_null: bool,
    /// The default expression, when it says something (not a sequence's nextval).
    pub default: Option<String>,
    pub comment: Option<String>,
    /// Labels of an enum type: part of the schema, shown even when sample values are off.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Whether the column holds text (where sample values help the model most).
    #[serde(default)]
    pub textual: bool,
    /// Most common values from the planner's statistics (sample values on, ANALYZE ran).
    #[serde(default)]
    pub common_values: Vec<String>,
    /// Whether the common values cover (nearly) every row: then they are all the values.
    #[serde(default)]
    pub all_values: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct ForeignKey {
    pub columns: Vec<String>,
    /// The referenced relation as it should be written (qualified when not visible).
    pub references: String,
    pub ref_oid: u32,
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

/// The catalog query. $1: schemas to read (NULL: the search path); $2: whether to read the
/// planner's most common values. Partitions are folded into their parent; the extension's own
/// objects are left out; a foreign key is shown only when the caller may read the referenced
/// table. pg_stats already hides what the caller may not see (column privileges, row security).
const CATALOG_SQL: &str = r#"
WITH search AS (
    SELECT n.oid AS nsp, s.ord
    FROM unnest(coalesce($1::text[], current_schemas(false))) WITH ORDINALITY AS s(name, ord)
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
),
cols AS (
    SELECT a.attrelid, a.attnum, a.attname, a.attnotnull,
           format_type(a.atttypid, a.atttypmod) AS type_name,
           t.typcategory = 'S' AS textual,
           CASE WHEN t.typtype = 'e' THEN
               (SELECT jsonb_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid)
           END AS labels,
           (SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
            WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND a.attgenerated = ''
              AND pg_get_expr(d.adbin, d.adrelid) NOT LIKE 'nextval(%') AS default_expr,
           col_description(a.attrelid, a.attnum) AS comment
    FROM pg_attribute a
    JOIN rels r ON r.oid = a.attrelid
    JOIN pg_type t ON t.oid = a.atttypid
    WHERE a.attnum > 0 AND NOT a.attisdropped
      AND has_column_privilege(a.attrelid, a.attnum, 'SELECT')
),
stats AS (
    SELECT r.oid AS attrelid, s.attname, s.most_common_vals::text::text[] AS mcv,
           (SELECT sum(f) FROM unnest(s.most_common_freqs) f) >= 0.999 - s.null_frac AS all_values
    FROM pg_stats s
    JOIN rels r ON r.nspname = s.schemaname AND r.relname = s.tablename
    WHERE $2 AND s.most_common_vals IS NOT NULL
),
keys AS (
    SELECT co.conrelid, co.contype, co.conname, co.confrelid,
           (SELECT jsonb_agg(quote_ident(a.attname) ORDER BY k.ord)
            FROM unnest(co.conkey) WITH ORDINALITY AS k(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = co.conrelid AND a.attnum = k.attnum) AS columns,
           (SELECT jsonb_agg(quote_ident(a.attname) ORDER BY k.ord)
            FROM unnest(co.confkey) WITH ORDINALITY AS k(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = co.confrelid AND a.attnum = k.attnum) AS ref_columns
    FROM pg_constraint co
    JOIN rels r ON r.oid = co.conrelid
    WHERE co.contype IN ('p', 'u', 'f')
)
SELECT coalesce(jsonb_agg(jsonb_build_object(
    'oid', r.oid::bigint,
    'schema', quote_ident(r.nspname),
    'name', quote_ident(r.relname),
    'kind', CASE r.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view'
                 WHEN 'm' THEN 'materialized view' WHEN 'f' THEN 'foreign table'
                 ELSE 'partitioned table' END,
    'visible', pg_table_is_visible(r.oid),
    'comment', obj_description(r.oid, 'pg_class'),
    'rows', r.reltuples,
    'columns', coalesce((
        SELECT jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
                   'name', quote_ident(c.attname),
                   'type', c.type_name,
                   'not_null', c.attnotnull,
                   'default', c.default_expr,
                   'comment', c.comment,
                   'labels', c.labels,
                   'textual', c.textual,
                   'common_values', to_jsonb(st.mcv),
                   'all_values', st.all_values)) ORDER BY c.attnum)
        FROM cols c
        LEFT JOIN stats st ON st.attrelid = c.attrelid AND st.attname = c.attname
        WHERE c.attrelid = r.oid), '[]'::jsonb),
    'primary_key', coalesce((SELECT k.columns FROM keys k WHERE k.conrelid = r.oid AND k.contype = 'p'), '[]'::jsonb),
    'unique', coalesce((SELECT jsonb_agg(k.columns ORDER BY k.conname) FROM keys k
                        WHERE k.conrelid = r.oid AND k.contype = 'u'), '[]'::jsonb),
    'foreign_keys', coalesce((
        SELECT jsonb_agg(jsonb_build_object(
                   'columns', k.columns,
                   'references', CASE WHEN pg_table_is_visible(k.confrelid) THEN quote_ident(fc.relname)
                                      ELSE quote_ident(fn.nspname) || '.' || quote_ident(fc.relname) END,
                   'ref_oid', k.confrelid::bigint,
                   'ref_columns', k.ref_columns) ORDER BY k.conname)
        FROM keys k
        JOIN pg_class fc ON fc.oid = k.confrelid
        JOIN pg_namespace fn ON fn.oid = fc.relnamespace
        WHERE k.conrelid = r.oid AND k.contype = 'f'
          AND has_any_column_privilege(k.confrelid, 'SELECT')), '[]'::jsonb)
) ORDER BY r.ord, r.relname), '[]'::jsonb)
FROM rels r
"#;

/// Reads every relation the caller may see in `schemas` (None: the search path). Read-only:
/// runs on a hot standby too.
pub fn load(schemas: Option<Vec<String>>, common_values: bool) -> Result<Vec<Relation>> {
    let json: Option<JsonB> = Spi::connect(|client| {
        client
            .select(
                CATALOG_SQL,
                Some(1),
                &[schemas.into(), common_values.into()],
            )?
            .first()
            .get_one::<JsonB>()
    })
    .map_err(|e| Error::internal(format!("reading the schema failed: {e}")))?;
    let value = json.map(|j| j.0).unwrap_or_else(|| serde_json::json!([]));
    serde_json::from_value(value)
        .map_err(|e| Error::internal(format!("unexpected schema shape: {e}")))
}
