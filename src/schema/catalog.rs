//! Reading the schema the caller may see, in one catalog query (in the style of pg_graphql's
//! `load_sql_context.sql`): relations in the schemas searched that the caller can SELECT from,
//! with the columns it can SELECT, their types, nullability, informative defaults, enum labels,
//! keys, foreign keys, comments, row estimates and, when sample values are on, the planner's
//! most common values. Names come back quoted by PostgreSQL's own `quote_ident`.
//!
//! The query runs with the pinned search path (`subxact::pinned`): every name in it resolves to
//! the built-in one, whatever the caller's search path holds. What depends on the caller's path
//! (which schemas to read, which names need qualifying) is computed with the server's own
//! functions outside it.

use pgrx::prelude::*;
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
    #[serde(default)]
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
    /// How the relation is written in SQL from the caller's search path.
    pub fn sql_name(&self) -> String {
        if self.visible {
            self.name.clone()
        } else {
            format!("{}.{}", self.schema, self.name)
        }
    }
}

/// The catalog query. $1: schemas to read, in order; $2: whether to read the planner's most
/// common values. Partitions are folded into their parent; the extension's own
/// objects are left out; a foreign key is shown only when the caller may read the referenced
/// table. pg_stats already hides what the caller may not see (column privileges, row security).
const CATALOG_SQL: &str = r#"
WITH search AS (
    SELECT n.oid AS nsp, n.nspname, s.ord
    FROM unnest($1::text[]) WITH ORDINALITY AS s(name, ord)
    JOIN pg_namespace n ON n.nspname = s.name
),
rels AS MATERIALIZED (
    SELECT c.oid, c.relname, c.relkind, c.reltuples, s.nspname, s.ord,
           has_table_privilege(c.oid, 'SELECT') AS every_column
    FROM pg_class c
    JOIN search s ON s.nsp = c.relnamespace
    WHERE c.relkind IN ('r', 'v', 'm', 'f', 'p')
      AND NOT c.relispartition
      AND NOT EXISTS (
          SELECT FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
          WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
            AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
            AND e.extname = 'sql_query_engine')
      AND has_any_column_privilege(c.oid, 'SELECT')
),
stats AS MATERIALIZED (
    SELECT r.oid AS attrelid, s.attname, s.most_common_vals::text::text[] AS mcv,
           s.histogram_bounds::text::text[] AS bounds,
           (SELECT sum(f) FROM unnest(s.most_common_freqs) f) >= 0.999 - s.null_frac AS all_values
    FROM pg_stats s
    JOIN rels r ON r.nspname = s.schemaname AND r.relname = s.tablename
    WHERE $2 AND (s.most_common_vals IS NOT NULL OR s.histogram_bounds IS NOT NULL)
),
enums AS (
    SELECT enumtypid, json_agg(enumlabel ORDER BY enumsortorder) AS labels
    FROM pg_enum GROUP BY enumtypid
),
cols AS (
    SELECT a.attrelid,
           json_agg(json_build_object(
               'name', quote_ident(a.attname),
               'type_oid', a.atttypid::bigint,
               'typmod', a.atttypmod,
               'not_null', a.attnotnull,
               'default', CASE WHEN a.attgenerated = '' THEN d.expr END,
               'comment', cd.description,
               'labels', coalesce(en.labels, '[]'),
               'textual', t.typcategory = 'S',
               'common_values', coalesce(to_json(st.mcv), '[]'),
               'histogram', CASE WHEN t.typcategory = 'S' THEN coalesce(to_json(st.bounds), '[]') ELSE '[]' END,
               'all_values', coalesce(st.all_values, false)) ORDER BY a.attnum) AS columns
    FROM rels r
    JOIN pg_attribute a ON a.attrelid = r.oid
    JOIN pg_type t ON t.oid = a.atttypid
    LEFT JOIN LATERAL (
        SELECT pg_get_expr(ad.adbin, ad.adrelid) AS expr FROM pg_attrdef ad
        WHERE ad.adrelid = a.attrelid AND ad.adnum = a.attnum) d
        ON d.expr NOT LIKE 'nextval(%'
    LEFT JOIN pg_description cd
        ON cd.objoid = a.attrelid AND cd.classoid = 'pg_class'::regclass AND cd.objsubid = a.attnum
    LEFT JOIN enums en ON en.enumtypid = t.oid
    LEFT JOIN stats st ON st.attrelid = a.attrelid AND st.attname = a.attname
    WHERE a.attnum > 0 AND NOT a.attisdropped
      AND (r.every_column OR has_column_privilege(a.attrelid, a.attnum, 'SELECT'))
    GROUP BY a.attrelid
),
key_columns AS (
    SELECT co.oid, co.conrelid, co.contype, co.conname, co.confrelid,
           (SELECT json_agg(quote_ident(a.attname) ORDER BY k.ord)
            FROM unnest(co.conkey) WITH ORDINALITY AS k(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = co.conrelid AND a.attnum = k.attnum) AS columns,
           (SELECT json_agg(quote_ident(a.attname) ORDER BY k.ord)
            FROM unnest(co.confkey) WITH ORDINALITY AS k(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = co.confrelid AND a.attnum = k.attnum) AS ref_columns
    FROM pg_constraint co
    JOIN rels r ON r.oid = co.conrelid
    WHERE co.contype IN ('p', 'u', 'f')
),
keys AS (
    SELECT k.conrelid,
           min(k.columns::text) FILTER (WHERE k.contype = 'p')::json AS primary_key,
           json_agg(k.columns ORDER BY k.conname) FILTER (WHERE k.contype = 'u') AS unique_keys,
           json_agg(json_build_object(
               'columns', k.columns,
               'ref_schema', quote_ident(fn.nspname),
               'ref_name', quote_ident(fc.relname),
               'ref_oid', k.confrelid::bigint,
               'ref_columns', k.ref_columns) ORDER BY k.conname)
               FILTER (WHERE k.contype = 'f' AND has_any_column_privilege(k.confrelid, 'SELECT')) AS foreign_keys
    FROM key_columns k
    LEFT JOIN pg_class fc ON fc.oid = k.confrelid
    LEFT JOIN pg_namespace fn ON fn.oid = fc.relnamespace
    GROUP BY k.conrelid
),
descriptions AS (
    SELECT objoid, description FROM pg_description
    WHERE classoid = 'pg_class'::regclass AND objsubid = 0
)
SELECT coalesce(json_agg(json_build_object(
    'oid', r.oid::bigint,
    'schema', quote_ident(r.nspname),
    'name', quote_ident(r.relname),
    'kind', CASE r.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view'
                 WHEN 'm' THEN 'materialized view' WHEN 'f' THEN 'foreign table'
                 ELSE 'partitioned table' END,
    'comment', td.description,
    'rows', r.reltuples,
    'columns', coalesce(c.columns, '[]'),
    'primary_key', coalesce(k.primary_key, '[]'),
    'unique', coalesce(k.unique_keys, '[]'),
    'foreign_keys', coalesce(k.foreign_keys, '[]')
) ORDER BY r.ord, r.relname), '[]')::text
FROM rels r
LEFT JOIN cols c ON c.attrelid = r.oid
LEFT JOIN keys k ON k.conrelid = r.oid
LEFT JOIN descriptions td ON td.objoid = r.oid
"#;

/// Reads every relation the caller may see in `schemas`. Read-only: runs on a hot standby too.
pub fn load(schemas: &[String], common_values: bool) -> Result<Vec<Relation>> {
    let json: Option<String> = crate::subxact::pinned(|| {
        Spi::connect(|client| {
            client
                .select(
                    CATALOG_SQL,
                    Some(1),
                    &[schemas.to_vec().into(), common_values.into()],
                )?
                .first()
                .get_one::<String>()
        })
    })
    .map_err(|e| Error::internal(format!("reading the schema failed: {e}")))?;
    let mut relations: Vec<Relation> = serde_json::from_str(json.as_deref().unwrap_or("[]"))
        .map_err(|e| Error::internal(format!("unexpected schema shape: {e}")))?;
    // Visibility on the caller's search path, as the server decides it.
    let visible = |oid: u32| unsafe { pg_sys::RelationIsVisible(pg_sys::Oid::from(oid)) };
    for relation in &mut relations {
        relation.visible = visible(relation.oid);
        for column in &mut relation.columns {
            column.type_name = type_name(column.type_oid, column.typmod);
        }
        for fk in &mut relation.foreign_keys {
            fk.references = if visible(fk.ref_oid) {
                fk.ref_name.clone()
            } else {
                format!("{}.{}", fk.ref_schema, fk.ref_name)
            };
        }
    }
    Ok(relations)
}

/// A type as `format_type` writes it on the caller's search path (qualified only when needed).
fn type_name(oid: u32, typmod: i32) -> String {
    unsafe {
        let text = pg_sys::format_type_with_typemod(pg_sys::Oid::from(oid), typmod);
        if text.is_null() {
            return String::new();
        }
        std::ffi::CStr::from_ptr(text)
            .to_string_lossy()
            .into_owned()
    }
}
