//! Rendering the schema for the model: DDL-like lines, the form models read best, with keys,
//! references, comments and sample values inline, so that joins and literal values are visible
//! where the columns are, in few tokens.

use std::fmt::Write;

use super::catalog::Relation;
use super::samples::{quote, Samples};
// Comments and defaults go on one line, so that they cannot end the `--` comment they are
// written in.
use crate::text::one_line;

/// The prompt text of one relation. `samples` is index-aligned with its columns (may be empty).
pub fn render_relation(relation: &Relation, samples: &[Option<Samples>]) -> String {
    let mut out = String::new();
    let keyword = match relation.kind.as_str() {
        "view" => "VIEW",
        "materialized view" => "MATERIALIZED VIEW",
        "foreign table" => "FOREIGN TABLE",
        _ => "TABLE",
    };
    let _ = write!(out, "CREATE {keyword} {} (", relation.sql_name());
    let mut notes = Vec::new();
    if let Some(comment) = relation
        .comment
        .as_deref()
        .map(one_line)
        .filter(|c| !c.is_empty())
    {
        notes.push(comment);
    }
    if relation.rows >= 0.0 {
        notes.push(format!("~{} rows", relation.rows.round() as i64));
    }
    if !notes.is_empty() {
        let _ = write!(out, " -- {}", notes.join("; "));
    }
    out.push('\n');

    let single = |keys: &[String]| (keys.len() == 1).then(|| keys[0].clone());
    let primary = single(&relation.primary_key);
    let unique: Vec<String> = relation.unique.iter().filter_map(|u| single(u)).collect();
    let mut lines: Vec<(String, Option<String>)> = relation
        .columns
        .iter()
        .enumerate()
        .map(|(i, column)| {
            let mut line = format!("  {} {}", column.name, column.type_name);
            if primary.as_deref() == Some(column.name.as_str()) {
                line.push_str(" PRIMARY KEY");
            } else {
                if column.not_null {
                    line.push_str(" NOT NULL");
                }
                if unique.contains(&column.name) {
                    line.push_str(" UNIQUE");
                }
            }
            if let Some(default) = &column.default {
                let _ = write!(line, " DEFAULT {}", one_line(default));
            }
            if let Some(fk) = relation
                .foreign_keys
                .iter()
                .find(|fk| fk.columns.len() == 1 && fk.columns[0] == column.name)
            {
                let _ = write!(
                    line,
                    " REFERENCES {}({})",
                    fk.references,
                    fk.ref_columns.join(", ")
                );
            }
            let mut notes = Vec::new();
            if let Some(comment) = column
                .comment
                .as_deref()
                .map(one_line)
                .filter(|c| !c.is_empty())
            {
                notes.push(comment);
            }
            if !column.labels.is_empty() {
                let lead = if column.labels_cut { "e.g." } else { "one of" };
                notes.push(format!("{lead} {}", quoted_list(&column.labels)));
            } else if let Some(Some(s)) = samples.get(i) {
                let lead = if s.complete { "one of" } else { "e.g." };
                notes.push(format!("{lead} {}", quoted_list(&s.values)));
            }
            (line, (!notes.is_empty()).then(|| notes.join("; ")))
        })
        .collect();
    if relation.primary_key.len() > 1 {
        lines.push((
            format!("  PRIMARY KEY ({})", relation.primary_key.join(", ")),
            None,
        ));
    }
    for u in relation.unique.iter().filter(|u| u.len() > 1) {
        lines.push((format!("  UNIQUE ({})", u.join(", ")), None));
    }
    for fk in relation
        .foreign_keys
        .iter()
        .filter(|fk| fk.columns.len() > 1)
    {
        lines.push((
            format!(
                "  FOREIGN KEY ({}) REFERENCES {}({})",
                fk.columns.join(", "),
                fk.references,
                fk.ref_columns.join(", ")
            ),
            None,
        ));
    }
    let last = lines.len().saturating_sub(1);
    for (i, (line, comment)) in lines.into_iter().enumerate() {
        out.push_str(&line);
        if i < last {
            out.push(',');
        }
        if let Some(comment) = comment {
            let _ = write!(out, " -- {comment}");
        }
        out.push('\n');
    }
    out.push_str(");\n");
    out
}

/// The prompt text of one relation as an M-Schema listing (XiYan-SQL's layout): one line per
/// column with its type, key, comment and example values; foreign keys go in `mschema_keys`.
pub fn render_mschema(relation: &Relation, samples: &[Option<Samples>]) -> String {
    let mut out = String::new();
    let kind = match relation.kind.as_str() {
        "view" => "View",
        "materialized view" => "Materialized view",
        "foreign table" => "Foreign table",
        _ => "Table",
    };
    let _ = write!(out, "# {kind}: {}", relation.sql_name());
    if let Some(comment) = relation
        .comment
        .as_deref()
        .map(one_line)
        .filter(|c| !c.is_empty())
    {
        let _ = write!(out, ", {comment}");
    }
    if relation.rows >= 0.0 {
        let _ = write!(out, " (~{} rows)", relation.rows.round() as i64);
    }
    out.push_str("\n[\n");
    let primary = &relation.primary_key;
    let last = relation.columns.len().saturating_sub(1);
    for (i, column) in relation.columns.iter().enumerate() {
        let mut parts = vec![format!(
            "{}:{}",
            column.name,
            column.type_name.to_uppercase()
        )];
        if primary.contains(&column.name) {
            parts.push("Primary Key".into());
        }
        if column.not_null && !primary.contains(&column.name) {
            parts.push("NOT NULL".into());
        }
        if let Some(comment) = column
            .comment
            .as_deref()
            .map(one_line)
            .filter(|c| !c.is_empty())
        {
            parts.push(comment);
        }
        if !column.labels.is_empty() {
            let lead = if column.labels_cut {
                "Examples"
            } else {
                "Values"
            };
            parts.push(format!("{lead}: [{}]", quoted_list(&column.labels)));
        } else if let Some(Some(s)) = samples.get(i) {
            let lead = if s.complete { "Values" } else { "Examples" };
            parts.push(format!("{lead}: [{}]", quoted_list(&s.values)));
        }
        let _ = writeln!(
            out,
            "({}){}",
            parts.join(", "),
            if i < last { "," } else { "" }
        );
    }
    out.push_str("]\n");
    out
}

/// The foreign keys of `relations` as M-Schema lists them: `orders.customer_id=customers.id`.
pub fn mschema_keys(relations: &[&Relation]) -> String {
    let mut lines = Vec::new();
    for relation in relations {
        for fk in &relation.foreign_keys {
            for (column, referenced) in fk.columns.iter().zip(&fk.ref_columns) {
                lines.push(format!(
                    "{}.{column}={}.{referenced}",
                    relation.sql_name(),
                    fk.references
                ));
            }
        }
    }
    if lines.is_empty() {
        String::new()
    } else {
        format!("【Foreign keys】\n{}\n", lines.join("\n"))
    }
}

/// The text shown when no relation is visible at all.
pub const NOTHING_VISIBLE: &str = "-- (no tables or views are visible to you)\n";

fn quoted_list(values: &[String]) -> String {
    values
        .iter()
        .map(|v| quote(v))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::catalog::{Column, ForeignKey, Relation};
    use super::*;

    fn column(name: &str, type_name: &str, not_null: bool, comment: Option<&str>) -> Column {
        Column {
            name: name.into(),
            type_name: type_name.into(),
            not_null,
            comment: comment.map(str::to_string),
            textual: type_name == "text",
            ..Default::default()
        }
    }

    fn orders() -> Relation {
        Relation {
            oid: 1,
            schema: "public".into(),
            name: "orders".into(),
            kind: "table".into(),
            visible: true,
            comment: Some("One row per\norder".into()),
            rows: 1234.0,
            columns: vec![
                column("id", "integer", true, None),
                column("customer_id", "integer", true, None),
                column("\"Status\"", "text", false, Some("lifecycle")),
                Column {
                    default: Some("now()".into()),
                    ..column("placed", "date", true, None)
                },
                column("code", "text", true, None),
            ],
            primary_key: vec!["id".into()],
            unique: vec![vec!["code".into()]],
            deferrable: vec![],
            inherited: false,
            foreign_keys: vec![ForeignKey {
                columns: vec!["customer_id".into()],
                references: "sales.customers".into(),
                ref_schema: "sales".into(),
                ref_name: "customers".into(),
                ref_oid: 2,
                ref_columns: vec!["id".into()],
            }],
            shareable: true,
            filenode: 1,
            grants: Some("g".into()),
            locks: 1,
            foreign_parts: false,
            catalog_bytes: 0,
            owner: 0,
        }
    }

    #[test]
    fn tables_render_as_ddl_with_keys_comments_and_samples() {
        let samples = vec![
            None,
            None,
            Some(Samples {
                values: vec!["new".into(), "it's paid".into()],
                complete: true,
            }),
            None,
            Some(Samples {
                values: vec!["A1".into()],
                complete: false,
            }),
        ];
        assert_eq!(
            render_relation(&orders(), &samples),
            "CREATE TABLE orders ( -- One row per order; ~1234 rows\n\
             \x20 id integer PRIMARY KEY,\n\
             \x20 customer_id integer NOT NULL REFERENCES sales.customers(id),\n\
             \x20 \"Status\" text, -- lifecycle; one of 'new', 'it''s paid'\n\
             \x20 placed date NOT NULL DEFAULT now(),\n\
             \x20 code text NOT NULL UNIQUE -- e.g. 'A1'\n\
             );\n"
        );
    }

    #[test]
    fn without_samples_no_value_is_shown_but_enum_labels_are() {
        let mut r = orders();
        r.columns[2].labels = vec!["new".into(), "paid".into()];
        let text = render_relation(&r, &[]);
        assert!(text.contains("\"Status\" text, -- lifecycle; one of 'new', 'paid'"));
        assert!(!text.contains("e.g."));
    }

    #[test]
    fn mschema_lists_columns_with_keys_comments_and_examples() {
        let samples = vec![
            None,
            None,
            Some(Samples {
                values: vec!["new".into()],
                complete: true,
            }),
            None,
            None,
        ];
        let text = render_mschema(&orders(), &samples);
        assert!(
            text.starts_with("# Table: orders, One row per order (~1234 rows)\n[\n"),
            "{text}"
        );
        assert!(text.contains("(id:INTEGER, Primary Key),\n"), "{text}");
        assert!(
            text.contains("(\"Status\":TEXT, lifecycle, Values: ['new']),"),
            "{text}"
        );
        assert_eq!(
            mschema_keys(&[&orders()]),
            "【Foreign keys】\norders.customer_id=sales.customers.id\n"
        );
    }

    #[test]
    fn composite_keys_and_hidden_schemas() {
        let items = Relation {
            oid: 3,
            schema: "shop".into(),
            name: "items".into(),
            kind: "view".into(),
            visible: false,
            comment: None,
            rows: -1.0,
            columns: vec![
                column("a", "int", true, None),
                column("b", "int", true, None),
            ],
            primary_key: vec!["a".into(), "b".into()],
            unique: vec![],
            deferrable: vec![],
            inherited: false,
            foreign_keys: vec![ForeignKey {
                columns: vec!["a".into(), "b".into()],
                references: "pairs".into(),
                ref_schema: "shop".into(),
                ref_name: "pairs".into(),
                ref_oid: 4,
                ref_columns: vec!["x".into(), "y".into()],
            }],
            shareable: false,
            filenode: 0,
            grants: None,
            locks: 1,
            foreign_parts: false,
            catalog_bytes: 0,
            owner: 0,
        };
        assert_eq!(
            render_relation(&items, &[]),
            "CREATE VIEW shop.items (\n  a int NOT NULL,\n  b int NOT NULL,\n  PRIMARY KEY (a, b),\n  \
             FOREIGN KEY (a, b) REFERENCES pairs(x, y)\n);\n"
        );
    }
}
